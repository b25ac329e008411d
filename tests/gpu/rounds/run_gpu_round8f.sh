#!/bin/bash
# run_gpu_round8f.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: (1) where aidreams260K's 5-token verification (chain of 4)
# spends GPU time beside a 1-token step: `baton eagle bench` with each
# per-layer op left out (BT_PROFILE_SKIP; outputs meaningless, the fixed
# chain still verifies 5 tokens a step) and the GEMM tuner's picks
# (BT_LOG=INFO); (2) power and SM clock while bench_cuda prefills 8192
# tokens of synth:llama3-8b (nvidia-smi every 50 ms).
# Carry: bin/baton, gpu/bench_cuda, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8f "${1:-build-r8f}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$PWD/$c/shared/heads
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20 --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1"
run tune 60 env BT_LOG=INFO "$c/bin/baton" eagle bench $T
for op in none norm qkv rope attn o gu swiglu down; do
  run "sk_$op" 60 env BT_PROFILE_SKIP=$op "$c/bin/baton" eagle bench $T
done
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks.mem,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$tmp/smi" 2>&1 &
smi=$!
bc p8k BT_X=1 -- --batch 1 --ctx 64 --prefill 8192,8192,8192
kill $smi 2>/dev/null
{
  echo "## round 8f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "tuned o=" "$tmp/tune" | sed 's/.*tuned/tuned/' | head -60
  for op in none norm qkv rope attn o gu swiglu down; do
    echo "skip $op: $(grep -h '^batch:' "$tmp/sk_$op")"
  done
  bc_rows p8k
  echo "smi (power W, SM MHz, mem MHz, reasons), every 4th sample:"
  awk 'NR % 4 == 0' "$tmp/smi" | head -120
} > "$table"
cat "$table"
