#!/bin/bash
# run_gpu_round7d.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: device draft passes padded (rows to a multiple of 16 past 32,
# stashed feature rows to the padded count) so captured passes are
# reused at large batches: test_spec_cuda, bench-engine's 8B chain of one
# token at batch 32 / 64 (twice: run-to-run spread) and the 4-token trees
# at batch 1 / 64, with the measured head passes' replay/capture/eager
# counts; and bench_cuda's plain decode at batch 64 / 128, 256-token
# context (what a verification of 128 tokens costs as a plain step).
# Carry: bin/baton, gpu/{test_spec_cuda,bench_cuda}, lib/, shared/.
# Writes $OUT/r7d.log and $OUT/r7d_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7d "${1:-build-r7d}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
B8="$c/bin/baton bench-engine --model synth:llama3-8b --device cuda --ctx 256 --steps 16 --spec-accept-rate 0.8"
run chain1a 120 $B8 --batch 32,64 --spec-tokens 1 --spec-topk 1
run chain1b 120 $B8 --batch 32,64 --spec-tokens 1 --spec-topk 1
run trees 150 $B8 --batch 1,64 --spec-tokens 4
bc plain BT_X=1 -- --batch 64,128 --ctx 256 --prefill 0
{
  echo "## round 7d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1a" "$tmp/chain1b" "$tmp/trees"; echo '```'
  grep -h "bench-engine: batch" "$tmp/chain1a" "$tmp/chain1b" "$tmp/trees"
  bc_rows plain
} > "$table"
cat "$table"
