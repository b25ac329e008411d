#!/bin/bash
# run_gpu_round10c.sh [CARRY] - round 10 (2026-12-01; prepared, not yet
# run: the device was not lent again that session), ON THE DEVICE
# MACHINE, issue 4: where the tma GEMV's fixed cost goes, and why batch-64
# decode attention reads KV at ~3.95 TB/s.
# (1) test_gemm --variant tma with one and with two blocks an SM
#     (BT_TMA_PER_SM=2), and with split tiles finished by their first
#     block (BT_TMA_EPI=owner) -- both new and never run;
# (2) bench_kernels --gemv at 8 / 64 tokens: default, each switch;
# (3) Nsight Compute on the tma kernel (qkv, 8 and 64 tokens; 64 also with
#     two blocks an SM): stall reasons, DRAM throughput, warp states;
# (4) bench_kernels --dec and Nsight Compute on the decode attention
#     kernels (the 64 x 2048 case is the grid of 8 x 64 blocks);
# (5) the issue-4 target rows at this code (the tuner now times after a
#     read-only L2 flush; prefill not yet measured with it), power sampled.
# Prediction: tma waits on its "full" barriers early in each block and in
# the split epilogue; two blocks an SM and the owner epilogue each cut
# the fixed cost by 2-4 us;
# attention at 85-90% of DRAM peak with the two-wave tail visible.
# Carry: gpu/{test_gemm,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r10c "${1:-build-r10c}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
secs="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters"
run test_tma1 100 stdbuf -oL "$c/gpu/test_gemm" --variant tma
run test_tma2 100 env BT_TMA_PER_SM=2 stdbuf -oL "$c/gpu/test_gemm" --variant tma
run test_tma3 100 env BT_TMA_EPI=owner stdbuf -oL "$c/gpu/test_gemm" --variant tma
run kern1 100 "$c/gpu/bench_kernels" --gemv --toks 8,64
run kern2 100 env BT_TMA_PER_SM=2 "$c/gpu/bench_kernels" --gemv --toks 8,64
run kern3 100 env BT_TMA_EPI=owner "$c/gpu/bench_kernels" --gemv --toks 8,64
run ncu_tma8 120 "$ncu" --clock-control none -k 'regex:gemv_tma' --launch-count 1 $secs \
  "$c/gpu/bench_kernels" --gemv --toks 8 --reps 3
run ncu_tma64 120 "$ncu" --clock-control none -k 'regex:gemv_tma' --launch-count 1 $secs \
  "$c/gpu/bench_kernels" --gemv --toks 64 --reps 3
run ncu_tma64b 120 env BT_TMA_PER_SM=2 "$ncu" --clock-control none -k 'regex:gemv_tma' --launch-count 1 $secs \
  "$c/gpu/bench_kernels" --gemv --toks 64 --reps 3
run dec 100 "$c/gpu/bench_kernels" --dec
run ncu_dec 150 "$ncu" --clock-control none -k 'regex:attn_decode' --launch-count 20 \
  --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis \
  "$c/gpu/bench_kernels" --dec --reps 3
smi_start
bc a BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
bc tma2 BT_GEMV_TMA=1 BT_TMA_PER_SM=2 -- --batch 1,8,64 --ctx 2048 --prefill 0
smi_stop
{
  echo "## round 10c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_tma1 test_tma2 test_tma3
  for f in kern1 kern2 kern3; do echo "### $f"; grep -hE "^gemv " "$tmp/$f" | sed 's/mma1.*tc /tc /; s/| tuned.*//'; done
  grep -h "^attn\|^dec" "$tmp/dec"
  for f in ncu_tma8 ncu_tma64 ncu_tma64b; do
    echo "### $f"; echo '```'
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Stall|Issued Ipc|No Eligible|One or More|Mem Busy|Max Bandwidth|L2 Hit|sampl" "$tmp/$f" | head -60
    echo '```'
  done
  echo "### ncu_dec"; echo '```'
  grep -E "attn_decode|Duration|DRAM Throughput|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth" "$tmp/ncu_dec" | head -120
  echo '```'
  bc_rows a tma2
  smi_summary
} > "$table"
cat "$table"
