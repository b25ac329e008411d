#!/bin/bash
# run_gpu_round14g.sh [CARRY] - round 14 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: batch-1 switches once more at the landed code (the
# combine now triggers at its top): bench_cuda batch 1 @2k default vs
# BT_ATTN_SPLIT=128 / 256 vs BT_GEMV_RPW=1 vs BT_ATTN_TRIG=late,
# interleaved R14G_REPS times (default 3).
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r14g "${1:-build-r14g}"
reps=${R14G_REPS:-3}
report() {
  {
    echo "## round 14g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in $(seq "$reps"); do bc_cols def$i s128_$i s256_$i rpw1_$i late$i; done
  } > "$table"
}
for i in $(seq "$reps"); do
  a="--batch 1 --ctx 2048 --prefill 0"
  bc def$i BT_X=1 -- $a
  bc s128_$i BT_ATTN_SPLIT=128 -- $a
  bc s256_$i BT_ATTN_SPLIT=256 -- $a
  bc rpw1_$i BT_GEMV_RPW=1 -- $a
  bc late$i BT_ATTN_TRIG=late -- $a
  report
done
cat "$table"
