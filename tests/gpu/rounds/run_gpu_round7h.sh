#!/bin/bash
# run_gpu_round7h.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: does the batch-1 tree verification of aidreams260K (5 tokens,
# padded to 8) lose its GPU time to the PDL triggers that small steps
# avoid?  `baton eagle bench` chain of 4 with the small-step PDL rule
# widened to 8 tokens (BT_PDL_SMALL_TOK=8: late triggers; with
# BT_PDL_SMALL=0: PDL off for those steps) against the default (2).
# BT_PDL_SMALL_TOK was removed after this run (no effect: verify GPU time
# 70-76 ms over 600 steps either way), so those rows now repeat the
# default.
# Carry: bin/baton, lib/, shared/{models,heads}.  Writes $OUT/r7h.log and
# $OUT/r7h_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7h "${1:-build-r7h}"
export BT_SHARED_DIR=$PWD/$c/shared
M=$BT_SHARED_DIR/models
H=$PWD/$c/shared/heads
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20 --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1"
run def 60 "$c/bin/baton" eagle bench $T
run late8 60 env BT_PDL_SMALL_TOK=8 "$c/bin/baton" eagle bench $T
run off8 60 env BT_PDL_SMALL_TOK=8 BT_PDL_SMALL=0 "$c/bin/baton" eagle bench $T
run early 60 env BT_PDL_SMALL=1 "$c/bin/baton" eagle bench $T
run def2 60 "$c/bin/baton" eagle bench $T
{
  echo "## round 7h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in def late8 off8 early def2; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f")"
  done
} > "$table"
cat "$table"
