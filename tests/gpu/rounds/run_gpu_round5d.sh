#!/bin/bash
# run_gpu_round5d.sh [CARRY] - last device call of 2026-12-01: the split
# combine of decode attention with 8 loads in flight per thread (Nsight
# Compute had it at 16 us of a ~25 us batch-1 attention), ON THE DEVICE
# MACHINE: test_attn, bench_kernels --dec, bench_cuda defaults and A/B
# (BT_ATTN_COMBINE=0, BT_PROFILE_SKIP=attn), EAGLE on the 8B shape.
# Writes $OUT/r5d.log and $OUT/r5d_table.md.  ~3 minutes.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r5d "${1:-build-c6}"
run test_attn 120 "$c/gpu/test_attn"
run dec 60 "$c/gpu/bench_kernels" --dec --reps 7
bc default BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 2048
bc ctx8k BT_X=1 -- --batch 1,8 --ctx 8192 --prefill 0
bc comb0 BT_ATTN_COMBINE=0 -- --batch 1,8 --ctx 2048 --prefill 0
bc skipattn BT_PROFILE_SKIP=attn -- --batch 1 --ctx 2048 --prefill 0
run spec8b 100 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,8,32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8,16
{
  echo "## round 5d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn
  grep "^attn decode" "$tmp/dec" | head -14
  bc_rows default ctx8k comb0 skipattn
  echo '```'; grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec8b"; echo '```'
} > "$table"
cat "$table"
