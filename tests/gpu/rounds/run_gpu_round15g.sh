#!/bin/bash
# run_gpu_round15g.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: switches again now that the rows GEMV triggers at
# entry: its first wave's L2 prefetch (BT_GEMV_PF=1, budget half the L2
# or 8 MB), the combine triggering by ending (BT_ATTN_TRIG=late), 128-key
# splits; bench_cuda batch 1 at 2k / 8k, interleaved twice.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15g "${1:-build-r15g}"
vars="def pf1 pf8 clate s128"
envof() { case $1 in def) echo BT_X=1;; pf1) echo BT_GEMV_PF=1;; pf8) echo BT_GEMV_PF=1 BT_GEMV_PF_MB=8;; clate) echo BT_ATTN_TRIG=late;; s128) echo BT_ATTN_SPLIT=128;; esac; }
report() {
  {
    echo "## round 15g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2; do for v in $vars; do bc_cols $v$i; done; done
  } > "$table"
}
for i in 1 2; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1 --ctx 2048,8192 --prefill 0; done
  report
done
cat "$table"
