#!/bin/bash
# run_gpu_round9q.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: speculative sequences pooled (a destroyed one keeps its
# buffers for the next create: 9p's refilling bench read the
# speculation-off loop at 0.95-0.98x, the per-sequence allocations
# about 10 us each at one new sequence every 3 steps at batch 32).
# Both tiny models at batch 8 and 32 (refilling bench): speculation
# off and adaptive twice; batch 1 adaptive; test_spec_cuda.
# Prediction: speculation off 0.99-1.00x, adaptive 0.96-0.99x.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9q "${1:-build-r9q}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  T1="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch 1 --rounds 10"
  run "${m}_b1_adapt" 60 "$c/bin/baton" eagle bench $T1
  for b in 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 5"
    run "${m}_b${b}_off" 60 "$c/bin/baton" eagle bench $T --spec-plain
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    run "${m}_b${b}_adapt2" 60 "$c/bin/baton" eagle bench $T
  done
done
{
  echo "## round 9q $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in $(cut -d' ' -f1 "$tmp/rcs" | grep -v test_spec); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
