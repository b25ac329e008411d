#!/bin/bash
# run_gpu_round9r.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: is the H200 host's run-to-run spread of the host draft (the
# same 403 steps drew 21 vs 33 ms, 2.36x vs 1.95x) thread migration?
# aidreams260K batch 1 adaptive and chain of 8, four runs each, free
# and pinned to one core (taskset -c 3).  Prediction: pinned runs at
# the fast end (draft ~21 ms / 400 steps) with a small spread.
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9r "${1:-build-r9r}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
for i in 1 2 3 4; do
  run "free_a$i" 60 "$c/bin/baton" eagle bench $T
  run "pin_a$i" 60 taskset -c 3 "$c/bin/baton" eagle bench $T
  run "free_c8_$i" 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 8 --spec-topk 1
  run "pin_c8_$i" 60 taskset -c 3 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 8 --spec-topk 1
done
{
  echo "## round 9r $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  nproc; lscpu | grep -i "model name\|mhz\|numa" | head -5
  for f in $(cut -d' ' -f1 "$tmp/rcs"); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f3-11)"
  done
} > "$table"
cat "$table"
