#!/bin/bash
# run_gpu_round9p.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: eagle bench at batch > 1 as a server runs it (every slot
# decodes sequences back to back, the clock stops when the first slot
# has run 3: no ragged tail; 9o's debug log measured the chain of 4 at
# batch 8 at 86-97K tok/s against plain's 75-83K while the lockstep
# bench read 0.90x).  Both tiny models, batch 8 and 32: speculation off,
# adaptive twice, chains of 4 and 8 fixed; batch 1 adaptive once.
# Prediction: aidreams260K batch 8 adaptive / chain of 4 ~1.05-1.15x,
# batch 32 ~1.0x (plain), stories260K ~1.0x everywhere.
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9p "${1:-build-r9p}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
for m in aidreams260K stories260K; do
  T1="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch 1 --rounds 10"
  run "${m}_b1_adapt" 60 "$c/bin/baton" eagle bench $T1
  for b in 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 5"
    run "${m}_b${b}_off" 60 "$c/bin/baton" eagle bench $T --spec-plain
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    run "${m}_b${b}_adapt2" 60 "$c/bin/baton" eagle bench $T
    for d in 4 8; do
      run "${m}_b${b}_c$d" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
        --spec-tokens $d --spec-depth $d --spec-topk 1
    done
  done
done
{
  echo "## round 9p $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in $(cut -d' ' -f1 "$tmp/rcs"); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
