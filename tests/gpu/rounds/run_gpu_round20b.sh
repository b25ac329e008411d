#!/bin/bash
# run_gpu_round20b.sh [CARRY] - round 20 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: (1) test_sample_dist with its two-step end-to-end
# check (fresh streams in the second step, the route kept); (2) RoPE
# inside the decode attention at batch 64 (BT_ROPE_FUSE_MAX=64; round
# 12 found it equal or slower, before the early new-row tile of round
# 17) against the default (fused up to 16 tokens), b1 / b8 / b64 @2k,
# three interleaved rounds.  Carry: gpu/{test_sample_dist,bench_cuda}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r20b "${1:-build-r20b}"
report() {
  {
    echo "## round 20b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail sd 2>/dev/null
    grep -E "end to end" "$tmp/sd" 2>/dev/null
    echo "### step ms: default / fused to 64 (b1 b8 b64 each)"
    for i in 1 2 3; do
      echo "def$i: $(bc_steps def$i)  fuse$i: $(bc_steps fuse$i)"
    done
    bc_cols def1 fuse1
  } > "$table"
}
run sd 90 "$c/gpu/test_sample_dist"
report
for i in 1 2 3; do
  bc def$i BT_LOG=WARN -- --batch 1,8,64 --ctx 2048 --prefill 0
  bc fuse$i BT_ROPE_FUSE_MAX=64 -- --batch 1,8,64 --ctx 2048 --prefill 0
  report
done
cat "$table"
