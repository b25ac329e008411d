#!/bin/bash
# run_gpu_round7m.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE, after the review clean-up (one row map of the last forward
# serves device sampling and the kept hidden rows; kernel tests time with
# kt_timer): test_cuda_model, test_cuda_sample, test_sample, test_topk,
# test_spec_cuda, and bench-engine's batch-64 chain of one.
# Carry: bin/baton, gpu/{test_*}, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7m "${1:-build-r7m}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
for t in test_cuda_model test_cuda_sample test_sample test_topk test_spec_cuda; do
  run $t 240 "$c/gpu/$t"
done
run chain1 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 7m $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_cuda_model test_cuda_sample test_sample test_topk test_spec_cuda
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
} > "$table"
cat "$table"
