#!/bin/bash
# run_gpu_round12e.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the fused SwiGLU GEMV, second version.  12d measured
# one warp a (gate, up) pair (now BT_GEMV_GLU=warp) at batch 1 0.045 ms
# slower (half the blocks: 3.4 waves, the last 39% full) but at batch 2
# 0.24 ms faster; its test_gemm cases never ran (the fused-norm loop left
# BT_GEMV_NORM set).  Default now: two warps of a block a pair, meeting
# in shared memory (the unfused kernel's blocks and waves).
#   - test_gemm --norm (both GLU variants: CPU references, bit for bit
#     against the unfused path), test_cuda_model;
#   - engine: pair (default), warp, BT_GEMV_GLU=0, interleaved twice at
#     batch 1 / 2 @2k; HEAD a268679 (*_b) once.
# Prediction: pair at batch 1 = GLU=0 - 0.04 ms; at batch 2 between.
# Carry: gpu/{test_gemm,test_cuda_model,bench_cuda}, gpu/bench_cuda_b,
# lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12e "${1:-build-r12e}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_gemm 120 stdbuf -oL "$c/gpu/test_gemm" --norm
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
smi_start
run bc_b1 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b1" --batch 1,2 --ctx 2048 --prefill 0
for i in 1 2; do
  bc p$i BT_X=1 -- --batch 1,2 --ctx 2048 --prefill 0
  bc w$i BT_GEMV_GLU=warp -- --batch 1,2 --ctx 2048 --prefill 0
  bc g$i BT_GEMV_GLU=0 -- --batch 1,2 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 12e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm test_model
  grep -h "swiglu" "$tmp/test_gemm" | grep -c "^PASS" | sed 's/^/glu PASS lines: /'
  grep -h "swiglu" "$tmp/test_gemm" | grep -v "^PASS" | head -5
  tail -1 "$tmp/test_gemm"
  bc_rows b1 p1 w1 g1 p2 w2 g2
  smi_summary
} > "$table"
cat "$table"
