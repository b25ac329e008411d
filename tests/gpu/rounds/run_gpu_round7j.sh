#!/bin/bash
# run_gpu_round7j.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: test_topk after the warp arg-max became one helper, and
# bench-engine's 8B cells with the GPU time of the verification and of
# the plain step next to their wall time (stderr lines "GPU ms a step"):
# chain of one token at batch 32 / 64, 4-token tree at batch 1.
# Carry: bin/baton, gpu/test_topk, lib/.  Writes $OUT/r7j.log and
# $OUT/r7j_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7j "${1:-build-r7j}"
run test_topk 120 "$c/gpu/test_topk"
B8="$c/bin/baton bench-engine --model synth:llama3-8b --device cuda --ctx 256 --steps 16 --spec-accept-rate 0.8"
run chain1 120 $B8 --batch 32,64 --spec-tokens 1 --spec-topk 1
run tree4 90 $B8 --batch 1 --spec-tokens 4
{
  echo "## round 7j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_topk
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1" "$tmp/tree4"; echo '```'
  grep -h "bench-engine: batch" "$tmp/chain1" "$tmp/tree4"
} > "$table"
cat "$table"
