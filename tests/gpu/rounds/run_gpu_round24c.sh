#!/bin/bash
# run_gpu_round24c.sh [CARRY] - round 24 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: `make gpu-test` at the round's landing code (the
# programmatic-edge probe and BT_DOWN_KSPLIT removed again), then the three target rows twice (b1 / b64 @2k, prefill 2048).
# Carry: the gpu-test binaries, bench_cuda, lib/, shared.
set -u
c=${1:-build-r24c}
d=$(dirname "$0")
(
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
  bash "$d/../run_gpu_test.sh" "$c" | tail -18
)
. "$d/../gpu_steps.sh"
gpu_steps_init r24c "$c"
for i in 1 2; do
  bc t$i BT_LOG=WARN -- --batch 1,64 --ctx 2048 --prefill 2048
done
{
  echo "## round 24c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows t1 t2
} > "$table"
cat "$table"
