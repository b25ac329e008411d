#!/bin/bash
# run_gpu_round9h.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the controller's debug log for aidreams260K at batch 8 (9g:
# adaptive 0.87-0.91x with 2000 tree steps after plain re-checks went
# lazy, 0.97-0.98x with 88 before) and batch 1.
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9h "${1:-build-r9h}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
for b in 8 1; do
  T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch $b --rounds 10"
  run "b$b" 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC "$c/bin/baton" eagle bench $T
  cp "$tmp/b$b" "$out/b$b.log"
done
{
  echo "## round 9h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in b8 b1; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
    grep -h "try" "$tmp/$f" | sed 's/^.*SPEC[^a-z]*//' | head -40
  done
} > "$table"
cat "$table"
