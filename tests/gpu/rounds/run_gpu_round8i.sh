#!/bin/bash
# run_gpu_round8i.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: the host draft head with packed matrices (cpu__matmul_packed)
# and a vectorized log-softmax: test_spec_cuda (device head = host head,
# greedy speculation = golden / plain), then `baton eagle bench` on
# aidreams260K at batch 1, chain of 4 (three runs) and adaptive (two).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8i "${1:-build-r8i}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SPEC_HEADS
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
for r in 1 2 3; do
  run "chain$r" 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
done
for r in 1 2; do
  run "adapt$r" 60 "$c/bin/baton" eagle bench $T
done
{
  echo "## round 8i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in chain1 chain2 chain3 adapt1 adapt2; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f")"
  done
} > "$table"
cat "$table"
