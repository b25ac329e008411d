#!/bin/bash
# run_gpu_round9n.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the adaptive decoder after plain is re-checked 8 steps (was
# 32) after a speculative arm replaced it (9m: aidreams260K batch 8
# adaptive 0.90x, a chain of 4 winning early in the sequences and
# losing over them), twice per model and batch size, plus
# test_spec_cuda.  Prediction: batch 8 0.95-0.99x, the rest as 9m.
# Measured: batch 8 0.96x and 0.85x (no better than 32 steps: the
# change was reverted).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9n "${1:-build-r9n}"
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
{
  echo "## round 9n $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in $(cut -d' ' -f1 "$tmp/rcs" | grep -v test_spec); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
