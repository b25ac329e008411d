#!/bin/bash
# run_gpu_round14h.sh [CARRY] - round 14 (2026-12-02), ON THE DEVICE
# MACHINE: the review of the rows GEMV's flush (lane_of / put_glu shared
# by the SwiGLU writes): test_gemm --norm (the GLU kernels bit for bit
# against the unfused pair) and --variant rows, test_cuda_model; bench_cuda
# batch 1 @2k and batch 2 @2k, new vs the landed binary (AB_FROM: round
# 14e's), interleaved R14H_REPS times (default 3).
# Carry: gpu/{bench_cuda,bench_cuda_b,test_gemm,test_cuda_model}, lib/,
# shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r14h "${1:-build-r14h}"
export BT_SHARED_DIR=$PWD/$c/shared
reps=${R14H_REPS:-3}
report() {
  {
    echo "## round 14h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm_norm test_gemm_rows test_cuda_model
    for i in $(seq "$reps"); do bc_cols new$i old$i; done
  } > "$table"
}
run test_gemm_norm 150 "$c/gpu/test_gemm" --norm
run test_gemm_rows 150 "$c/gpu/test_gemm" --variant rows
run test_cuda_model 240 "$c/gpu/test_cuda_model"
report
for i in $(seq "$reps"); do
  bc new$i BT_X=1 -- --batch 1,2 --ctx 2048 --prefill 0
  bcb old$i --batch 1,2 --ctx 2048 --prefill 0
  report
done
cat "$table"
