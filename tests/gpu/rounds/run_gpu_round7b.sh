#!/bin/bash
# run_gpu_round7b.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: where the device draft head's pass spends its GPU time
# (BT_DRAFT_PROFILE=1: eager passes with an event between stages, the
# sums printed when the head is destroyed) on bench-engine's 8B chain of
# one token at batch 64 and the 4-token tree at batch 1.  Carry: bin/baton
# and lib/.  Writes $OUT/r7b.log and $OUT/r7b_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7b "${1:-build-r7b}"
run chain1 120 env BT_DRAFT_PROFILE=1 "$c/bin/baton" bench-engine \
  --model synth:llama3-8b --device cuda --batch 64 --ctx 256 --steps 16 \
  --spec-accept-rate 0.8 --spec-tokens 1 --spec-topk 1
run tree4 90 env BT_DRAFT_PROFILE=1 "$c/bin/baton" bench-engine \
  --model synth:llama3-8b --device cuda --batch 1 --ctx 256 --steps 16 \
  --spec-accept-rate 0.8 --spec-tokens 4
{
  echo "## round 7b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in chain1 tree4; do
    echo "### $f"
    echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) |^device draft profile|^  " "$tmp/$f"; echo '```'
  done
  which nsys ncu 2>&1
} > "$table"
cat "$table"
