#!/bin/bash
# run_gpu_round15f.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: with the rows GEMV triggering at entry (the new
# default): two rows per warp everywhere (BT_GEMV_RPW=2: o and down in
# 256 blocks, so the next GEMV's blocks find free slots while they run)
# and the old late trigger (BT_GEMV_TRIGGER=late), interleaved twice:
# bench_cuda batch 1, 2 at 512 / 2k / 8k.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15f "${1:-build-r15f}"
report() {
  {
    echo "## round 15f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2; do bc_cols def$i rpw2_$i late$i; done
  } > "$table"
}
for i in 1 2; do
  a="--batch 1,2 --ctx 512,2048,8192 --prefill 0"
  bc def$i BT_X=1 -- $a
  bc rpw2_$i BT_GEMV_RPW=2 -- $a
  bc late$i BT_GEMV_TRIGGER=late -- $a
  report
done
cat "$table"
