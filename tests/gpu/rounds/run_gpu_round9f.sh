#!/bin/bash
# run_gpu_round9f.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the tiny models at batch 1, 8 and 32, adaptive, after the
# bench's warm-up gained the chain of 8 and one adaptive run (9e:
# batch 8 / 32 adaptive 0.95-0.97x, the tries' plain-with-hidden steps
# and the chain of 8 capturing graphs inside the measured rounds).
# Prediction: batch 8 / 32 ~0.99-1.00x, batch 1 unchanged (~2.0-2.3x).
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9f "${1:-build-r9f}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
for m in aidreams260K stories260K; do
  for b in 1 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 10"
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    run "${m}_b${b}_adapt2" 60 "$c/bin/baton" eagle bench $T
  done
done
{
  echo "## round 9f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in $(cut -d' ' -f1 "$tmp/rcs"); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
