#!/bin/bash
# run_gpu_round21e.sh [CARRY] - round 21 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the landing code's GPU tests -- `make gpu-test`'s
# list, with test_gemm as its --cache rounds only (its full run passed
# in 21a at this gemm.c; 132 s the device time did not have).
# Carry: the gpu-test binaries, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r21e "${1:-build-r21e}"
export BT_SHARED_DIR=$PWD/$c/shared
for t in test_embed test_rmsnorm test_swiglu test_rope_kv test_sample test_topk \
         test_sample_dist test_cuda_sample test_attn test_cuda_model; do
  run $t 200 "$c/gpu/$t"
done
run test_gemm 120 "$c/gpu/test_gemm" --cache
{
  echo "## round 21e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_embed test_rmsnorm test_swiglu test_rope_kv test_sample \
    test_topk test_sample_dist test_cuda_sample test_attn test_cuda_model test_gemm
  grep -E '^(PASS|FAIL) golden' "$tmp/test_cuda_model"
} > "$table"
cat "$table"
