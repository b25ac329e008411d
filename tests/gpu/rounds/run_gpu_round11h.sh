#!/bin/bash
# run_gpu_round11h.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the engine sweep of `make gpu-bench` (decode batch
# 1/8/32/64/128 x ctx 512/2048/8192, prefill 512/2048/8192) at the code
# that landed in round 11 (302ca60), power sampled.  The PyTorch side is
# not re-run: the brief's torch.compile figures (6.4 ms batch 1, 46 ms
# batch 64 @2k, 63 ms prefill 2048) are the comparison.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11h "${1:-build-r11h}"
smi_start
run sweep 300 "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1,8,32,64,128 --ctx 512,2048,8192 --prefill 512,2048,8192 \
  --table "$tmp/t_sweep"
smi_stop
{
  echo "## round 11h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  cat "$tmp/t_sweep"
  smi_summary
} > "$table"
cat "$table"
