#!/bin/bash
# run_gpu_round9e.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the tiny models at batch 8 and 32 with the new defaults
# (depth 8, chain-of-8 arm) and the temperature-0.3 heads: adaptive,
# chains of 4 and 8 fixed; batch 1 adaptive once more per model.
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9e "${1:-build-r9e}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
for m in aidreams260K stories260K; do
  for b in 1 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 10"
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    [ $b = 1 ] && continue
    for d in 4 8; do
      run "${m}_b${b}_c$d" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
        --spec-tokens $d --spec-depth $d --spec-topk 1
    done
  done
done
{
  echo "## round 9e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in $(cut -d' ' -f1 "$tmp/rcs"); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
