#!/bin/bash
# run_gpu_round6g.sh [CARRY] - round 6, last device call (2026-12-01), ON
# THE DEVICE MACHINE: EAGLE on the Llama-3-8B shape at batch 32 / 64 with
# chains of 1 and 2 draft tokens (top-k 1) besides the 4-token tree: how
# cheap verification gets when the tree is small (forced acceptance 0.8,
# synthetic head).  Writes $OUT/r6g.log and $OUT/r6g_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6g "${1:-build-r6g}"
[ -n "${R6G_SKIP_CHAIN:-}" ] || run chain 200 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 1,2 \
  --spec-topk 1
run chain2 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 2 --spec-topk 1
run chain12 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 1,2 --spec-topk 1
run tree4 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4
{
  echo "## round 6g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "bench-engine:" "$tmp/chain" "$tmp/chain2" "$tmp/chain12"
  echo '```'; grep -E "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain" "$tmp/chain2" "$tmp/chain12" "$tmp/tree4"; echo '```'
} > "$table"
cat "$table"
