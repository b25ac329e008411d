#!/bin/bash
# run_gpu_round6f.sh [CARRY] - round 6, sixth device call (2026-12-01),
# ON THE DEVICE MACHINE: with late PDL triggers at batch 1 (the default
# since call 6) the rows GEMV's pre-wait region overlaps the previous
# GEMV's tail, so the switches that lost under early triggers get another
# A/B: the first-wave L2 prefetch of its own rows (BT_GEMV_PF=1, 2) and
# rows per warp (BT_GEMV_RPW=1, 2).  Environment only (the carry of
# run_gpu_round6e.sh).  Writes $OUT/r6f.log and $OUT/r6f_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6f "${1:-build-r6e}"
a=(--batch 1 --ctx 512,2048 --prefill 0)
bc def BT_X=1 -- "${a[@]}"
bc pf1 BT_GEMV_PF=1 -- "${a[@]}"
bc pf2 BT_GEMV_PF=2 -- "${a[@]}"
bc rpw1 BT_GEMV_RPW=1 -- "${a[@]}"
bc rpw2 BT_GEMV_RPW=2 -- "${a[@]}"
bc def2 BT_X=1 -- "${a[@]}"
bc pf1b BT_GEMV_PF=1 -- "${a[@]}"
bc rpw1b BT_GEMV_RPW=1 -- "${a[@]}"
{
  echo "## round 6f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows def pf1 pf2 rpw1 rpw2 def2 pf1b rpw1b
} > "$table"
cat "$table"
