#!/bin/bash
# run_gpu_round7g.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: the batch-1 verification of aidreams260K against its plain
# step, wall and GPU time (`baton eagle bench` now prints verify_gpu_ms,
# plain_ms and plain_gpu_ms: CUDA events around every forward,
# cuda_backend_gpu_ns): chain of 4 and adaptive (trained head, on the
# host), and the chain with tree graphs off.  Carry: bin/baton, lib/,
# shared/{models,heads}.  Writes $OUT/r7g.log and $OUT/r7g_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7g "${1:-build-r7g}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$PWD/$c/shared/heads
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
run chain4 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
run adaptive 60 "$c/bin/baton" eagle bench $T
run chain4_notg 60 env BT_TREE_GRAPHS=0 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
run chain4_f32 60 "$c/bin/baton" eagle bench $T --precision f32 --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
{
  echo "## round 7g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in chain4 adaptive chain4_notg chain4_f32; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f")"
    grep -h "error\|ERROR" "$tmp/$f" | head -2
  done
} > "$table"
cat "$table"
