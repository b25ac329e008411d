#!/bin/bash
# run_gpu_round12i.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: where batch-8 and batch-64 steps go at the landed
# code (da06761): BT_PROFILE_SKIP=op for each per-layer op (the step
# without it; differences to the default are the op's cost in the
# graph).  Prints each table as it lands (the call may be cut short).
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12i "${1:-build-r12i}"
for op in none qkv attn o gu down norm swiglu rope; do
  if [ $op = none ]; then e=BT_X=1; else e=BT_PROFILE_SKIP=$op; fi
  bc s_$op $e -- --batch 8,64 --ctx 2048 --prefill 0
  echo "### $op"; grep -E "^\| decode " "$tmp/t_s_$op" 2>/dev/null | cut -d'|' -f2-5
done
