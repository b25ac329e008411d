#!/bin/bash
# run_gpu_round19e.sh [CARRY] - round 19 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the cluster sampler with its size chosen by the row
# count (at most two blocks an SM: 64 rows of 128K at 4 blocks a row
# instead of 16): test_sample_dist, its --bench, bench_cuda b1 / b64 @2k
# (every column); then a CUPTI trace of a b1 and a b64 top-p step (the
# bench's last step of a row is its top-p step: the sampler kernels, and
# the gaps the host's part leaves).  Carry: gpu/{test_sample_dist,
# bench_cuda,libbt_kernel_trace.so}, lib/ (with libcupti).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r19e "${1:-build-r19e}"
report() {
  {
    echo "## round 19e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail sd 2>/dev/null
    for f in sdb sdb16 sdb8 sdb4; do
      echo "### $f"; grep -E "^bench sample_dist" "$tmp/$f" 2>/dev/null
    done
    bc_cols cl
    for t in b1 b64; do echo "### trace $t"; cat "$tmp/tl_$t" 2>/dev/null; done
  } > "$table"
}
run sd 60 "$c/gpu/test_sample_dist"
run sdb 40 "$c/gpu/test_sample_dist" --bench
# the row-count rule against fixed sizes (same binary, same call)
for n in 16 8 4; do
  run sdb$n 40 env BT_SAMPLE_DIST_CLUSTER=$n "$c/gpu/test_sample_dist" --bench
done
report
bc cl BT_LOG=WARN -- --batch 1,64 --ctx 2048 --prefill 0
report
trace_step b1 bench_cuda -- --steps 3 --batch 1 --ctx 2048 --prefill 0
trace_step b64 bench_cuda -- --steps 3 --batch 64 --ctx 2048 --prefill 0
report
cat "$table"
