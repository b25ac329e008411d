#!/bin/bash
# run_gpu_round9i.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: aidreams260K batch 8 adaptive three times with the SPEC and
# CUDA debug logs (tries with their step, graph captures): 9g held a
# losing chain of 4 for 80% of the steps, 9h (same binary) stayed plain.
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9i "${1:-build-r9i}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 8 --rounds 10"
for i in 1 2 3; do
  run "b8_$i" 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC,CUDA "$c/bin/baton" eagle bench $T
  cp "$tmp/b8_$i" "$out/b8_$i.log"
done
{
  echo "## round 9i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for i in 1 2 3; do
    echo "b8_$i: $(grep -h '^batch:' "$tmp/b8_$i" | cut -d' ' -f1-11)"
    echo "captures: $(grep -c 'captured' "$tmp/b8_$i")"
    grep -h "try" "$tmp/b8_$i" | sed 's/^.*SPEC[^a-z]*//' | head -30
  done
} > "$table"
cat "$table"
