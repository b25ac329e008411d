#!/bin/bash
# run_gpu_round9b.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: (1) the new speculation defaults (depth 8, a chain-of-8 arm;
# code of the commit after bd5afd5) on the tiny models at batch 1:
# test_spec_cuda, adaptive twice per model, the default tree fixed, a
# chain of 8 fixed.  Prediction: aidreams260K adaptive ~2.3x (9a's
# adaptive topped by a chain of 8: 2.33x), stories260K adaptive ~1.0x.
# (2) issue 4, batch 64 @2k: decode-attention split lengths never
# measured at batch 64 (the planner picks one split of 2048: two waves).
# Carry: bin/baton, gpu/{test_spec_cuda,bench_cuda}, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9b "${1:-build-r9b}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch 1 --rounds 20"
  run "${m}_adapt" 60 "$c/bin/baton" eagle bench $T
  run "${m}_adapt2" 60 "$c/bin/baton" eagle bench $T
  run "${m}_tree" 60 "$c/bin/baton" eagle bench $T --spec-fixed
  run "${m}_c8" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
    --spec-tokens 8 --spec-depth 8 --spec-topk 1
done
bc def BT_X=1 -- --batch 64 --ctx 2048 --prefill 0
bc s1024 BT_ATTN_SPLIT=1024 -- --batch 64 --ctx 2048 --prefill 0
bc s512 BT_ATTN_SPLIT=512 -- --batch 64 --ctx 2048 --prefill 0
bc fill BT_ATTN_PLAN=fill -- --batch 64 --ctx 2048 --prefill 0
bc late0 BT_ATTN_EARLY=0 -- --batch 64 --ctx 2048 --prefill 0
bc def2 BT_X=1 -- --batch 64 --ctx 2048 --prefill 0
{
  echo "## round 9b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for m in aidreams260K stories260K; do
    for f in adapt adapt2 tree c8; do
      echo "${m}_$f: $(grep -h '^batch:' "$tmp/${m}_$f" | cut -d' ' -f3-11)"
    done
  done
  bc_rows def s1024 s512 fill late0 def2
} > "$table"
cat "$table"
