#!/bin/bash
# run_gpu_round6d.sh [CARRY] - round 6, fourth device call (2026-12-01),
# ON THE DEVICE MACHINE: programmatic dependent launch with late triggers.
# CARRY/gpu/bench_cuda is the default build; CARRY/late/gpu/bench_cuda the
# same code built with -DKERN_PDL_LATE=1 (kern_common.cuh: no early
# triggers; the rows GEMV triggers after its last weight loads).  Batch 1
# runs without PDL by default; BT_PDL_SMALL=1 turns it on there.  Writes
# $OUT/r6d.log and $OUT/r6d_table.md.  ~3 minutes.  The compile-time
# KERN_PDL_LATE build it compares became the run-time default for steps
# of <= 2 tokens (cuda__pdl_late, cuda_int.h); run_gpu_round6e.sh is the
# A/B of the shipped code.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6d "${1:-build-r6d}"
base=$c
bc def BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 0
c=$base/late
bc late BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 0
bc latepdl BT_PDL_SMALL=1 -- --batch 1 --ctx 512,2048 --prefill 0
c=$base
bc def2 BT_X=1 -- --batch 1 --ctx 512,2048 --prefill 0
c=$base/late
bc latepdl2 BT_PDL_SMALL=1 -- --batch 1 --ctx 512,2048 --prefill 0
c=$base
{
  echo "## round 6d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows def late latepdl def2 latepdl2
} > "$table"
cat "$table"
