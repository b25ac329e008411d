#!/bin/bash
# run_gpu_round9t.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the three targets' rows at the final code (batch 1
# and 64 at 2k, prefill 2048), twice, with nvidia-smi sampling power,
# SM clock and throttle reasons every 50 ms during the runs.
# Prediction: batch 1 4.2-4.3 ms, batch 64 9.1-9.2 ms, prefill 50-52 ms
# at the 700 W cap.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9t "${1:-build-r9t}"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks_throttle_reasons.active,temperature.gpu \
  --format=csv,noheader -lms 50 > "$out/smi.csv" 2>&1 &
smi=$!
bc a BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
bc b BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
kill $smi 2>/dev/null
{
  echo "## round 9t $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows a b
  echo "power samples >= 600 W: $(awk -F, '$2+0 >= 600' "$out/smi.csv" | wc -l) of $(wc -l < "$out/smi.csv")"
  awk -F, '$2+0 >= 600 {p+=$2; c+=$3; n++} END {if (n) printf "mean over those: %.0f W, SM %.0f MHz\n", p/n, c/n}' "$out/smi.csv"
  awk -F, '$2+0 >= 600 {print $4}' "$out/smi.csv" | sort | uniq -c | head -5
} > "$table"
cat "$table"
