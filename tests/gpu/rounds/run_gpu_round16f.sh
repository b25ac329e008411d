#!/bin/bash
# run_gpu_round16f.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: batch 32 / 64 @2k with GEMMs forced onto baton's own
# PDL-launched skinny kernels against the tuner's picks (cuBLASLt on all
# four decode shapes at 64 tokens, round 16e's trace): every shape
# (BT_GEMV_FORCE=wg / tma), then wg on one projection at a time
# (BT_GEMV_FORCE_OUT: qkv 6144, o and down 4096, gate/up 28672),
# interleaved twice; a trace of forced wg at batch 64.
# Carry: gpu/{bench_cuda,libbt_kernel_trace.so}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16f "${1:-build-r16f}"
vars="def wg tma wgq wgo wggu"
envof() {
  case $1 in
    def) echo BT_X=1;;
    wg) echo BT_GEMV_FORCE=wg;;
    tc) echo BT_GEMV_FORCE=tc;;
    tma) echo BT_GEMV_FORCE=tma BT_GEMV_TMA=1;;
    wgq) echo BT_GEMV_FORCE=wg BT_GEMV_FORCE_OUT=6144;;
    wgo) echo BT_GEMV_FORCE=wg BT_GEMV_FORCE_OUT=4096;;
    wggu) echo BT_GEMV_FORCE=wg BT_GEMV_FORCE_OUT=28672;;
  esac
}
report() {
  {
    echo "## round 16f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2; do for v in $vars; do bc_cols $v$i; done; done
    echo "### trace wg b64"; head -30 "$tmp/tl_wg" 2>/dev/null
  } > "$table"
}
for i in 1 2; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 32,64 --ctx 2048 --prefill 0; done
  report
done
trace_step wg bench_cuda BT_GEMV_FORCE=wg -- --steps 4 --batch 64 --ctx 2048 --prefill 0
report
cat "$table"
