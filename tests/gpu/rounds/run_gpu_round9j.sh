#!/bin/bash
# run_gpu_round9j.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: as 9g, after a speculative arm must beat plain by 10% to
# become the default (9i's logs: a chain of 4 measured 1.08-1.09x plain
# in its try at context ~30 at batch 8, ran 0.68x over whole sequences;
# batch 8 adaptive 0.92-0.93x in the runs that switched).
# Prediction: batch 8 / 32 0.98-1.00x, stories260K batch 1 0.98-1.00x,
# aidreams260K batch 1 unchanged (2.1-2.4x).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9j "${1:-build-r9j}"
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
  echo "## round 9j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in $(cut -d' ' -f1 "$tmp/rcs"); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
