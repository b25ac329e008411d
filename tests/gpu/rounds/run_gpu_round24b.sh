#!/bin/bash
# run_gpu_round24b.sh [CARRY] - round 24 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the model tests with programmatic edges into
# cuBLASLt (BT_GEMM_LT_PDL=1: test_cuda_model's bf16 agreement and
# test_spec_cuda run captured steps through the probed picks), the full
# test_gemm, then run_gpu_round23i.sh (BT_DOWN_KSPLIT=2 / 4 against the
# default, ABBA x4, traces).
# Carry: gpu/test_gemm gpu/test_rmsnorm gpu/test_cuda_model
# gpu/test_spec_cuda gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r24b "${1:-build-r24b}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 24b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_cuda_model_pdl test_spec_cuda_pdl test_gemm 2>/dev/null
    grep -E '^(PASS|FAIL) golden' "$tmp/test_cuda_model_pdl" 2>/dev/null
    grep -h "gemm pdl o=" "$tmp/test_cuda_model_pdl" 2>/dev/null | sort | uniq -c | head
    grep -h "^INFO gemm pdl" "$tmp/test_gemm" 2>/dev/null
    head -1 "$log"
  } > "$table"
}
run test_cuda_model_pdl 150 env BT_GEMM_LT_PDL=1 BT_LOG=INFO "$c/gpu/test_cuda_model"
run test_spec_cuda_pdl 150 env BT_GEMM_LT_PDL=1 "$c/gpu/test_spec_cuda"
report; cat "$table"
run test_gemm 200 "$c/gpu/test_gemm"
report; cat "$table"
bash "$d/run_gpu_round23i.sh" "$c"
