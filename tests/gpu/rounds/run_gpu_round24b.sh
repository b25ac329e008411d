#!/bin/bash
# run_gpu_round24b.sh [CARRY] - round 24 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: run_gpu_round23i.sh (test_rmsnorm, test_cuda_model
# with BT_DOWN_KSPLIT=4, then BT_DOWN_KSPLIT=2 / 4 against the default,
# ABBA x4, traces), then the full test_gemm (round 23's one heuristic
# query, never run in full on a GPU).
# Carry: gpu/test_gemm gpu/test_rmsnorm gpu/test_cuda_model gpu/bench_cuda
# gpu/libbt_kernel_trace.so, lib/, shared.
set -u
d=$(dirname "$0")
bash "$d/run_gpu_round23i.sh" "${1:-build-r24b}"
. "$d/../gpu_steps.sh"
gpu_steps_init r24b "${1:-build-r24b}"
run test_gemm 200 "$c/gpu/test_gemm"
{ echo "## round 24b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  pass_fail test_gemm; grep -h "^INFO gemm pdl" "$tmp/test_gemm"
  head -1 "$log"; } > "$table"
cat "$table"
