#!/bin/bash
# run_gpu_round15c.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: where the batch-1 gate/up GEMV loses against the
# lm_head's rate (57 us for 235 MB = 4.1 TB/s; the lm_head, the same rows
# kernel, 4.5 TB/s): CUPTI traces of a batch-1 step @2k at the default,
# BT_GEMV_GLU=0 (gate/up as a plain fused-norm GEMV, then swiglu.cu),
# BT_GEMV_GLU=warp and BT_GEMV_NORM=0 (rmsnorm.cu, then the GEMVs), with
# the step times of each.
# Carry: gpu/bench_cuda, gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15c "${1:-build-r15c}"
vars="def glu0 gluw norm0"
envof() { case $1 in def) echo BT_X=1;; glu0) echo BT_GEMV_GLU=0;; gluw) echo BT_GEMV_GLU=warp;; norm0) echo BT_GEMV_NORM=0;; esac; }
report() {
  {
    echo "## round 15c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for v in $vars; do bc_cols $v; done
    for v in $vars; do echo "### trace $v"; head -16 "$tmp/tl_$v" 2>/dev/null; grep -A16 "first 24" "$tmp/tl_$v" 2>/dev/null | sed -n 8,18p; done
  } > "$table"
}
for v in $vars; do
  bc $v $(envof $v) -- --batch 1 --ctx 2048 --prefill 0
  trace_step $v bench_cuda $(envof $v) -- --steps 4 --batch 1 --ctx 2048 --prefill 0
  report
done
cat "$table"
