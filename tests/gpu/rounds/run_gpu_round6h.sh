#!/bin/bash
# run_gpu_round6h.sh [CARRY] - round 6 (2026-12-01), ON THE DEVICE
# MACHINE: is the batch-64 draft cost of the 8B-shape EAGLE bench a
# warm-up artefact?  The head's passes are keyed by their row count (the
# fed rows vary every step), each new key runs eagerly, then is captured
# on its second sight, and cuBLASLt builds a descriptor per new token
# count; 16 measured steps may be mostly first sights.  Same rows with 16
# and 96 measured steps.  Writes $OUT/r6h.log and $OUT/r6h_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6h "${1:-build-r6g}"
for s in 16 96; do
  run steps$s 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
    --batch 32,64 --ctx 256 --steps $s --spec-accept-rate 0.8 --spec-tokens 1 \
    --spec-topk 1
done
{
  echo "## round 6h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  echo '```'; grep -E "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/steps16" "$tmp/steps96"; echo '```'
  grep -h "bench-engine:" "$tmp/steps16" "$tmp/steps96"
} > "$table"
cat "$table"
