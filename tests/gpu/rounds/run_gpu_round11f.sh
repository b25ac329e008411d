#!/bin/bash
# run_gpu_round11f.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: r11b's decode attention (warp-local loads and the
# lazy O rescale; binaries *_b) against the landing code (warp-local
# loads, no lazy rescale) in one call, interleaved, twice each: r11e's
# machine read 64 x 2048 at 141.8 us where r11b's read 137.1, more than
# the 64 x 8192 row moved between them (1.5%).
# Prediction: equal within 1% (r11b: lazy 137.1 vs no lazy 137.7 us).
# Carry: gpu/{bench_kernels,bench_cuda} and gpu/{bench_kernels,bench_cuda}_b,
# lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11f "${1:-build-r11f}"
for i in 1 2; do
  run dec_b$i 100 "$c/gpu/bench_kernels_b" --dec
  run dec_p$i 100 "$c/gpu/bench_kernels" --dec
done
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,8,64 --ctx 2048 --prefill 0
  bc p$i BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 11f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in dec_b1 dec_p1 dec_b2 dec_p2; do echo "### $f"; grep -h "^attn" "$tmp/$f" | grep "plan=default"; done
  bc_rows b1 p1 b2 p2
  smi_summary
} > "$table"
cat "$table"
