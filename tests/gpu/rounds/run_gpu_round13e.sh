#!/bin/bash
# run_gpu_round13e.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the samplers' row walks with 8 loads in flight a
# thread (top_kernel, sd_kernel), the split-K cuBLASLt candidates on by
# default, RMSNorm's early weight loads: test_sample, test_cuda_sample,
# test_sample_dist, test_cuda_model; bench_cuda (new) vs bench_cuda_b
# (HEAD) at batch 1, 8, 64 @2k interleaved twice, every column; a CUPTI
# trace of a batch-1 top-p step.  Carry: gpu/{bench_cuda,bench_cuda_b,
# test_sample,test_cuda_sample,test_sample_dist,test_cuda_model,
# libbt_kernel_trace.so}, lib/ (+ libcupti), shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13e "${1:-build-r13e}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 13e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_sample test_cuda_sample test_sample_dist test_cuda_model
    bc_cols new1 old1 new2 old2
    echo "### batch 1 top-p step"; grep -E "step:|sd_kernel|top_kernel|gemv_kernel \[16032\]" "$tmp/tl_b1" 2>/dev/null
  } > "$table"
}
run test_sample 150 "$c/gpu/test_sample"
run test_cuda_sample 150 "$c/gpu/test_cuda_sample"
run test_sample_dist 150 "$c/gpu/test_sample_dist"
run test_cuda_model 200 "$c/gpu/test_cuda_model"
report
for i in 1 2; do
  bc new$i BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
  bcb old$i --batch 1,8,64 --ctx 2048 --prefill 0
  report
done
trace_step b1 bench_cuda -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
