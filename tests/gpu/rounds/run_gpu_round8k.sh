#!/bin/bash
# run_gpu_round8k.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE, prepared at the end of the session and NOT RUN YET (the device
# budget was spent): the better-trained aidreams260K head (256K tokens
# sampled at temperature 0.3; see tests/gpu/pack_gpu_spec.sh) against
# the default-trained one (32K tokens at temperature 1) at batch 1:
# `baton eagle bench` chains of 4, 6 and 8 and adaptive, plus
# test_spec_cuda with the new head.  CPU prediction (PERFORMANCE.md round
# 8 section 7): chain of 4 1.95-2.1x (accepted 3.80 vs 3.16 on the CPU).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/{models,heads,
# heads-t1-32k} (.carry/pack.sh ... shared).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8k "${1:-build-r8k}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for hd in heads heads-t1-32k; do
  T="--target $M/aidreams260K.bin --head $BT_SHARED_DIR/$hd/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
  for d in 4 6 8; do
    run "${hd}_c$d" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
      --spec-tokens $d --spec-depth $d --spec-topk 1
  done
  run "${hd}_adapt" 60 "$c/bin/baton" eagle bench $T
done
{
  echo "## round 8k $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for hd in heads heads-t1-32k; do
    for f in c4 c6 c8 adapt; do
      echo "$hd $f: $(grep -h '^batch:' "$tmp/${hd}_$f")"
    done
  done
} > "$table"
cat "$table"
