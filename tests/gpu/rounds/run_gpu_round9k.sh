#!/bin/bash
# run_gpu_round9k.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: where batch 8 / 32 lose their 2-4% with the adaptive decoder
# on aidreams260K (9j: 0.93-0.97x, batch 32 with only 5 tree steps):
# the speculative loop with speculation off (--spec-plain), adaptive with
# the SPEC,CUDA debug log (graph captures after the measured rounds
# start), adaptive over 40 rounds (one-time costs amortized).
# Carry: bin/baton, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9k "${1:-build-r9k}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
for b in 8 32; do
  T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch $b"
  run "b${b}_off" 60 "$c/bin/baton" eagle bench $T --rounds 10 --spec-plain
  run "b${b}_dbg" 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC,CUDA "$c/bin/baton" eagle bench $T --rounds 10
  run "b${b}_r40" 90 "$c/bin/baton" eagle bench $T --rounds 40
  cp "$tmp/b${b}_dbg" "$out/b${b}_dbg.log"
done
{
  echo "## round 9k $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in b8_off b8_dbg b8_r40 b32_off b32_dbg b32_r40; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
  for b in 8 32; do
    echo "b$b captures after the measured rounds start: $(sed -n '/measured rounds start/,$p' "$tmp/b${b}_dbg" | grep -c captured)"
    sed -n '/measured rounds start/,$p' "$tmp/b${b}_dbg" | grep -h "captured\|try" | sed 's/^.*\(SPEC\|CUDA\)[^a-z]*//' | head -20
  done
} > "$table"
cat "$table"
