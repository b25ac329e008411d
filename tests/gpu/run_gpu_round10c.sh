#!/bin/bash
# run_gpu_round10c.sh [CARRY] - round 10 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: Nsight Compute on the two batch-64 levers.
# (1) the tma GEMV on qkv (6144 x 4096) at 8 and 64 tokens: where its
# ~8 us over cuBLASLt goes (call 3: 25.5 / 28.8 us vs 17.1 / 17.4 with a
# clean L2); (2) decode attention at batch 64 x 2k context
# (bench_kernels --dec): why it reads KV at ~3.95 TB/s, not 4.3-4.5.
# Prediction: tma shows long waits on the full barrier at the start
# (every block's first stage arrives late) or in the split epilogue;
# attention shows DRAM throughput ~88% with the two-wave tail.
# Carry: gpu/bench_kernels, lib/.
set -u
. "$(dirname "$0")/gpu_steps.sh"
gpu_steps_init r10c "${1:-build-r10c}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
secs="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters"
run dec 100 "$c/gpu/bench_kernels" --dec
run ncu_tma8 120 "$ncu" --clock-control none -k 'regex:gemv_tma' --launch-count 1 $secs \
  "$c/gpu/bench_kernels" --gemv --toks 8 --reps 3
run ncu_tma64 120 "$ncu" --clock-control none -k 'regex:gemv_tma' --launch-count 1 $secs \
  "$c/gpu/bench_kernels" --gemv --toks 64 --reps 3
run ncu_dec 150 "$ncu" --clock-control none -k 'regex:attn_decode' --launch-count 24 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  "$c/gpu/bench_kernels" --dec --reps 3
{
  echo "## round 10c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "^attn\|^dec" "$tmp/dec"
  for f in ncu_tma8 ncu_tma64; do
    echo "### $f"; echo '```'
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Stall|Issued Ipc|No Eligible|One or More|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|smsp__pcsamp|Source|sampl" "$tmp/$f" | head -60
    echo '```'
  done
  echo "### ncu_dec"; echo '```'
  grep -E "attn_decode|Duration|DRAM Throughput|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth" "$tmp/ncu_dec" | head -120
  echo '```'
} > "$table"
cat "$table"
