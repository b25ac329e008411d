#!/bin/bash
# run_gpu_round12g.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the RoPE fusion capped at 16 tokens (809d0c6) against
# HEAD a268679 (*_b) at batch 1 / 2 / 64 @2k, twice; then why a 2-token
# step is slow (call 7: every GEMV 14-45% slower than at 1 token): the
# 2-token step with the norm unfused (BT_GEMV_NORM=0: the tuner's picks
# for all four projections) and with each skinny variant forced.
# Prediction: batch 64 back to HEAD's figure; batch 1 / 2 as in call 7.
# Carry: gpu/bench_cuda, gpu/bench_cuda_b, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12g "${1:-build-r12g}"
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,2,64 --ctx 2048 --prefill 0
  bc d$i BT_X=1 -- --batch 1,2,64 --ctx 2048 --prefill 0
done
bc n0 BT_GEMV_NORM=0 -- --batch 2 --ctx 2048 --prefill 0
for v in rows8 mma1 tc wg lt; do
  bc f_$v BT_GEMV_NORM=0 BT_GEMV_FORCE=$v -- --batch 2 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 12g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows b1 d1 b2 d2 n0 f_rows8 f_mma1 f_tc f_wg f_lt
  smi_summary
} > "$table"
cat "$table"
