#!/bin/bash
# run_gpu_round15e.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the rows GEMV triggering at its top under late
# triggers (BT_GEMV_TRIGGER=early) again, three times interleaved against
# the default, and with the decode attention at its top too
# (BT_ATTN_TRIG=top): bench_cuda batch 1, 2 at 512 / 2k / 8k, batch 8
# @2k; a CUPTI trace of a batch-1 step @2k with early.
# Carry: gpu/bench_cuda, gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15e "${1:-build-r15e}"
report() {
  {
    echo "## round 15e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2 3; do bc_cols def$i early$i top$i; done
    for v in early; do echo "### trace $v"; head -12 "$tmp/tl_$v" 2>/dev/null; grep -A16 "first 24" "$tmp/tl_$v" 2>/dev/null | sed -n 8,18p; done
  } > "$table"
}
for i in 1 2 3; do
  a="--batch 1,2 --ctx 512,2048,8192 --prefill 0"
  [ $i = 1 ] && a="--batch 1,2,8 --ctx 512,2048,8192 --prefill 0"
  bc def$i BT_X=1 -- $a
  bc early$i BT_GEMV_TRIGGER=early -- $a
  bc top$i BT_GEMV_TRIGGER=early BT_ATTN_TRIG=top -- $a
  report
done
trace_step early bench_cuda BT_GEMV_TRIGGER=early -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
