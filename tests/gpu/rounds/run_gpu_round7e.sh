#!/bin/bash
# run_gpu_round7e.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: test_spec_cuda with the device-head hand-off check, then where
# a batch-1 speculative step of aidreams260K goes with its trained head
# (`baton eagle bench --device cuda`: draft / verify / accept ms over the
# measured rounds; the head on the host, the default for heads this
# small): adaptive, the fixed 16/5/4 tree, chains of 2, 3 and 4.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/{models,heads}.
# Writes $OUT/r7e.log and $OUT/r7e_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7e "${1:-build-r7e}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
M=$BT_SHARED_DIR/models
T="--target $M/aidreams260K.bin --head $BT_SPEC_HEADS/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
run adaptive 60 "$c/bin/baton" eagle bench $T
run fixed16 60 "$c/bin/baton" eagle bench $T --spec-fixed
for t in 2 3 4; do
  run chain$t 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens $t --spec-depth $t --spec-topk 1
done
{
  echo "## round 7e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  grep -h "hand-off" "$tmp/test_spec_cuda"
  for f in adaptive fixed16 chain2 chain3 chain4; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f")"
  done
} > "$table"
cat "$table"
