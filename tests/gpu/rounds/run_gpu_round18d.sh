#!/bin/bash
# run_gpu_round18d.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: where a batch-64 step (2k) and a 2048-token prefill
# go, kernel by kernel (CUPTI tracer + step_timeline.py), on the landing
# code, for choosing the next structural change (ARCHITECTURE.md, "Batch
# 1 and 64 after round 18").  Carry: gpu/{bench_cuda,
# libbt_kernel_trace.so}, lib/ (with libcupti).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18d "${1:-build-r18d}"
trace_step b64 bench_cuda -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step pf bench_cuda -- --steps 1 --batch 1 --ctx 512 --prefill 2048
{
  echo "## round 18d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for t in b64 pf; do echo "### $t"; cat "$tmp/tl_$t"; done
} > "$table"
cat "$table"
