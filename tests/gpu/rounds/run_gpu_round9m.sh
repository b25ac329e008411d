#!/bin/bash
# run_gpu_round9m.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the host draft head batched across sequences (one head pass a
# level for every drafting sequence, spec_head_forward_parts; before:
# one pass per sequence, ~47 us a sequence a step at batch 8): the tiny
# models at batch 1, 8 and 32, chains of 4 and 8 fixed and adaptive,
# plus test_spec_cuda (host-draft shapes alone and batched).  Prediction:
# aidreams260K batch 8 chain of 4 0.68x -> ~1.2-1.3x, chain of 8 ~1.3x,
# batch 32 ~1.1x; batch 1 unchanged.  Measured: draft -26% (batch 8
# chain of 4 0.68x -> 0.84x, batch 32 0.27x -> 0.35x): the products
# batch, but per-sequence attention and per-row logsumexp do not.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9m "${1:-build-r9m}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  for b in 1 8 32; do
    T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch $b --rounds 10"
    run "${m}_b${b}_adapt" 60 "$c/bin/baton" eagle bench $T
    for d in 4 8; do
      run "${m}_b${b}_c$d" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
        --spec-tokens $d --spec-depth $d --spec-topk 1
    done
  done
done
{
  echo "## round 9m $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in $(cut -d' ' -f1 "$tmp/rcs" | grep -v test_spec); do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-11)"
  done
} > "$table"
cat "$table"
