#!/bin/bash
# run_gpu_round9o.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the adaptive decoder after a speculative default that plain
# takes back over counts as a lost try (its wait doubles, never reset by
# its wins; before, it was re-tried 32 steps later every time: 9m / 9n
# aidreams260K batch 8 oscillated, 0.85-0.96x), twice per model and
# batch size, plus test_spec_cuda and one batch-8 debug log.
# Prediction: batch 8 0.96-0.99x, the rest unchanged.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9o "${1:-build-r9o}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  for b in 1 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 10"
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    run "${m}_b${b}_adapt2" 60 "$c/bin/baton" eagle bench $T
  done
done
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 8 --rounds 10"
run b8_dbg 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC "$c/bin/baton" eagle bench $T
{
  echo "## round 9o $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in $(cut -d' ' -f1 "$tmp/rcs" | grep -v test_spec); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
  grep -h "try" "$tmp/b8_dbg" | sed 's/^.*SPEC[^a-z]*//' | tail -25
} > "$table"
cat "$table"
