#!/bin/bash
# run_gpu_round6i.sh [CARRY] - round 6 (2026-12-01), ON THE DEVICE
# MACHINE: bench-engine's speculative cells with the new default of 16
# unmeasured warm-up steps (--spec-warmup), 16 measured steps: chains of
# one token at batch 32 / 64 and the issue's trees at batch 1 / 64.
# Writes $OUT/r6i.log and $OUT/r6i_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6i "${1:-build-r6i}"
run chain1 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 1 --spec-topk 1
run trees 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8
{
  echo "## round 6i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1" "$tmp/trees"; echo '```'
  grep -h "bench-engine:" "$tmp/chain1" "$tmp/trees"
} > "$table"
cat "$table"
