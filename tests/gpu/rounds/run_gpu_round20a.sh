#!/bin/bash
# run_gpu_round20a.sh [CARRY] - round 20 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: (1) the cluster sampler's size chosen by the row
# count (at most two blocks an SM), against fixed sizes 16 / 8 / 4 in
# the same call, the new kernel (remote reads in flight together, the
# first histogram level kept) against round 19's (test_sample_dist_b); (2) wide requests (sampler_wide: a request whose row
# missed its top-256 candidates goes straight to the whole-row sampler
# next step) against the round-19 binary (gpu/bench_cuda_b), b1 / b64
# @2k, every column, interleaved twice; (3) CUPTI traces of a b1 and a
# b64 top-p step.  Carry: gpu/{test_sample_dist,bench_cuda,bench_cuda_b,
# libbt_kernel_trace.so}, lib/ (with libcupti).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r20a "${1:-build-r20a}"
report() {
  {
    echo "## round 20a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail sd 2>/dev/null
    grep -E "end to end" "$tmp/sd" 2>/dev/null
    for f in sdb sdb_old sdb16 sdb16_old sdb8 sdb8_old sdb4 sdb4_old; do
      echo "### $f"; grep -E "^bench sample_dist" "$tmp/$f" 2>/dev/null
    done
    bc_cols new1 old1 new2 old2
    for t in b1 b64; do echo "### trace $t"; cat "$tmp/tl_$t" 2>/dev/null; done
  } > "$table"
}
run sd 90 "$c/gpu/test_sample_dist"
for i in 1 2; do
  run sdb 40 "$c/gpu/test_sample_dist" --bench
  run sdb_old 40 "$c/gpu/test_sample_dist_b" --bench
done
for n in 16 8 4; do
  run sdb$n 40 env BT_SAMPLE_DIST_CLUSTER=$n "$c/gpu/test_sample_dist" --bench
  run sdb${n}_old 40 env BT_SAMPLE_DIST_CLUSTER=$n "$c/gpu/test_sample_dist_b" --bench
done
report
for i in 1 2; do
  bc new$i BT_LOG=WARN -- --batch 1,64 --ctx 2048 --prefill 0
  bcb old$i --batch 1,64 --ctx 2048 --prefill 0
  report
done
trace_step b1 bench_cuda -- --steps 3 --batch 1 --ctx 2048 --prefill 0
trace_step b64 bench_cuda -- --steps 3 --batch 64 --ctx 2048 --prefill 0
report
cat "$table"
