#!/bin/bash
# run_gpu_round7a.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: the target's hidden rows stay on the GPU for the device draft
# head (the stash, BT_DRAFT_FEATURES=device, the new default) against the
# old trip through the host (BT_DRAFT_FEATURES=host): test_spec_cuda
# (every check, including the stash feed and the host-features golden
# runs), then bench-engine's 8B chains of one token at batch 32 / 64 and
# the 4-token tree at batch 1, both ways.  The carry holds bin/baton,
# gpu/test_spec_cuda, lib/ and shared/{models,heads} (pack_gpu_spec.sh's
# layout).  Writes $OUT/r7a.log and $OUT/r7a_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7a "${1:-build-r7a}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for f in device host; do
  run chain1_$f 120 env BT_DRAFT_FEATURES=$f "$c/bin/baton" bench-engine \
    --model synth:llama3-8b --device cuda --batch 32,64 --ctx 256 --steps 16 \
    --spec-accept-rate 0.8 --spec-tokens 1 --spec-topk 1
  run tree4_$f 90 env BT_DRAFT_FEATURES=$f "$c/bin/baton" bench-engine \
    --model synth:llama3-8b --device cuda --batch 1 --ctx 256 --steps 16 \
    --spec-accept-rate 0.8 --spec-tokens 4
done
{
  echo "## round 7a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in device host; do
    echo "### features: $f"
    echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1_$f" "$tmp/tree4_$f"; echo '```'
  done
} > "$table"
cat "$table"
