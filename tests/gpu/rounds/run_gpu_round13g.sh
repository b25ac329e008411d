#!/bin/bash
# run_gpu_round13g.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE: the split cuda_sample_top (calls 7-9 of round 13: the bitonic
# merge, the rank merge, the slices fitted to the rows):
# test_sample, test_cuda_sample, test_sample_dist; bench_cuda (new) vs
# bench_cuda_b (call 5's binary, before the split) at R13G_BATCH
# (default 1,64) @2k, R13G_REPS times interleaved (default 2), every
# column (+top-p); a CUPTI trace of a batch-1 top-p step.
# Carry: gpu/{bench_cuda,bench_cuda_b,test_sample,test_cuda_sample,
# test_sample_dist,libbt_kernel_trace.so}, lib/ (+ libcupti), shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13g "${1:-build-r13g}"
export BT_SHARED_DIR=$PWD/$c/shared
batch=${R13G_BATCH:-1,64}
reps=${R13G_REPS:-2}
report() {
  {
    echo "## round 13g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_sample test_cuda_sample test_sample_dist
    for i in $(seq "$reps"); do bc_cols new$i old$i; done
    echo "### batch 1 top-p step"; grep -E "step:|sd_kernel|top_|gemv_kernel \[16032\]" "$tmp/tl_b1" 2>/dev/null
  } > "$table"
}
run test_sample 150 "$c/gpu/test_sample"
run test_cuda_sample 150 "$c/gpu/test_cuda_sample"
run test_sample_dist 150 "$c/gpu/test_sample_dist"
report
for i in $(seq "$reps"); do
  bc new$i BT_X=1 -- --batch "$batch" --ctx 2048 --prefill 0
  bcb old$i --batch "$batch" --ctx 2048 --prefill 0
  report
done
trace_step b1 bench_cuda -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
