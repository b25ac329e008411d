#!/bin/bash
# run_gpu_round9s.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the 8B shape's speculative cells at the final code (the
# issue-6 batch-64 target, last measured in round 8): bench-engine's
# chain of 1 at batch 32 / 64 and 4-token trees at batch 1 / 64 with the
# forced 0.8 acceptance.  Prediction: unchanged (chain of 1 at batch 64
# 1.32-1.34x): this round touched the host head, the controller and the
# bench, not the device head or the verification.
# Carry: bin/baton, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9s "${1:-build-r9s}"
B8="$c/bin/baton bench-engine --model synth:llama3-8b --device cuda --ctx 256 --steps 16 --spec-accept-rate 0.8"
run chain1 150 $B8 --batch 32,64 --spec-tokens 1 --spec-topk 1
run trees 150 $B8 --batch 1,64 --spec-tokens 4
{
  echo "## round 9s $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "bench-engine:" "$tmp/chain1" "$tmp/trees"
  grep -h "spec" "$tmp/chain1" "$tmp/trees" | grep -i "speedup\|×\|x " | head -20
} > "$table"
cat "$table"
