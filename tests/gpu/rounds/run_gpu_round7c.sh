#!/bin/bash
# run_gpu_round7c.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: the split top-k (cuda_topk_logprob: up to 32 blocks a row,
# one read of the logits) against topk_ref (test_topk), the whole device
# head and speculative golden runs (test_spec_cuda), then bench-engine's
# 8B cells (chain of one token at batch 32 / 64, trees of 4 and 8 tokens
# at batch 1 and 4 tokens at 64), and the head's stage profile
# (BT_DRAFT_PROFILE=1, passes that planned or tuned a GEMM left out).
# Carry: bin/baton, gpu/test_{topk,spec_cuda}, lib/, shared/{models,heads}.
# Writes $OUT/r7c.log and $OUT/r7c_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7c "${1:-build-r7c}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_topk 120 "$c/gpu/test_topk"
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
B8="$c/bin/baton bench-engine --model synth:llama3-8b --device cuda --ctx 256 --steps 16 --spec-accept-rate 0.8"
run chain1 120 $B8 --batch 32,64 --spec-tokens 1 --spec-topk 1
run trees 150 $B8 --batch 1,64 --spec-tokens 4,8
run prof_chain1 120 env BT_DRAFT_PROFILE=1 $B8 --batch 64 --spec-tokens 1 --spec-topk 1
run prof_tree4 90 env BT_DRAFT_PROFILE=1 $B8 --batch 1 --spec-tokens 4
{
  echo "## round 7c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_topk test_spec_cuda
  grep '^INFO topk' "$tmp/test_topk"
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1" "$tmp/trees"; echo '```'
  for f in prof_chain1 prof_tree4; do
    echo "### $f"
    echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) |^device draft profile|^  " "$tmp/$f"; echo '```'
  done
} > "$table"
cat "$table"
