#!/bin/bash
# run_gpu_round7l.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: the host draft head's attention now runs through the CPU
# backend's kernels (cpu__attention / cpu__attention_decode) instead of
# a scalar loop: test_spec_cuda (the device head against the host head,
# 1e-5 in f32, incl. masked tree levels; host-draft golden runs), then
# `baton eagle bench` on aidreams260K with its trained head at batch 1
# (chain of 4, adaptive; the head on the host, the default here).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7l "${1:-build-r7l}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
M=$BT_SHARED_DIR/models
T="--target $M/aidreams260K.bin --head $BT_SPEC_HEADS/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
run chain4 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
run adaptive 60 "$c/bin/baton" eagle bench $T
run chain4b 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
{
  echo "## round 7l $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in chain4 adaptive chain4b; do echo "$f: $(grep -h '^batch:' "$tmp/$f")"; done
} > "$table"
cat "$table"
