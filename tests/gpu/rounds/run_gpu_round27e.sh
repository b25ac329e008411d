#!/bin/bash
# run_gpu_round27e.sh [CARRY] - round 27 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4 follow-up: where fa3 loses 10% to fa2pp128 with
# scattered blocks - the phase profiler (a -DBT_PREFILL_PROF=ON build of
# bench_kernels) on both, scattered and in order.
# Carry: gpu/bench_kernels (the profiling build), lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r27e "${1:-build-r27e}"
for k in fa2pp128 fa3; do
  run "s_$k" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels" --attn
  run "r_$k" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels" --attn-runs
done
{
  echo "## round 27e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in s_fa2pp128 r_fa2pp128 s_fa3 r_fa3; do
    echo "### $f"; grep -h "^attn pre\|^attn prof" "$tmp/$f"; done
  head -1 "$log"
} > "$table"
cat "$table"
