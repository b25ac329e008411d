#!/bin/bash
# run_gpu_round13g.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE: cuda_sample_top split over up to 16 blocks a row (three
# launches): test_sample, test_cuda_sample, test_sample_dist; bench_cuda
# (new) vs bench_cuda_b (call 6's binary) at batch 1 and 64 @2k, twice,
# every column (+top-p); a CUPTI trace of a batch-1 top-p step.
# Carry: gpu/{bench_cuda,bench_cuda_b,test_sample,test_cuda_sample,
# test_sample_dist,libbt_kernel_trace.so}, lib/ (+ libcupti), shared.
set -u
. "$(dirname "$0")/gpu_steps.sh"
gpu_steps_init r13g "${1:-build-r13g}"
export BT_SHARED_DIR=$PWD/$c/shared
here=$(dirname "$0")
rows() { for f in "$@"; do echo "### $f"; grep -E "^\| decode " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f3-9; done; }
report() {
  {
    echo "## round 13g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_sample test_cuda_sample test_sample_dist
    rows new1 old1 new2 old2
    echo "### batch 1 top-p step"; grep -E "step:|sd_kernel|top_|gemv_kernel \[16032\]" "$tmp/tl_b1" 2>/dev/null
  } > "$table"
}
run test_sample 150 "$c/gpu/test_sample"
run test_cuda_sample 150 "$c/gpu/test_cuda_sample"
run test_sample_dist 150 "$c/gpu/test_sample_dist"
report
bcb() { local name=$1; shift; run "bc_$name" 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_$name" "$@"; }
for i in 1 2; do
  bc new$i BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 0
  bcb old$i --batch 1,64 --ctx 2048 --prefill 0
  report
done
run trace_b1 120 env CUDA_INJECTION64_PATH=$PWD/$c/gpu/libbt_kernel_trace.so \
  BT_TRACE_OUT=$tmp/trace_b1.csv "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --steps 4 --batch 1 --ctx 2048 --prefill 0
run tl_b1 60 python3 "$here/step_timeline.py" "$tmp/trace_b1.csv"
report
cat "$table"
