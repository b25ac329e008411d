#!/bin/bash
# run_gpu_round11b.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: decode attention with warp-local tile loads (each warp
# copies its own 16 keys, row offsets computed once a row and shuffled,
# no block barrier per tile) and the lazy O rescale.  Round 11a's Nsight
# Compute profile of the 64 x 2048 launch: IPC 1.73, 56% of cycles with no
# eligible warp, 41% of stalls fixed-latency dependencies, ~833
# instructions a warp per 64-key tile, ~45% of them the per-chunk load
# address arithmetic; deeper pipelines at one block an SM fell to 2.1
# TB/s and the HND probe read slower (3.31 TB/s), so the kernel is
# issue-bound, not latency- or layout-bound.
# (1) test_attn (all passes) and its decode cases with the old load
#     (BT_ATTN_TC_LOAD=block) and without the lazy rescale (BT_ATTN_LAZY=0);
#     test_cuda_model;
# (2) bench_kernels --dec: new default, LOAD=block, LAZY=0;
# (3) Nsight Compute (instruction count, IPC) on the 64 x 2048 launch;
# (4) the target rows: batch 1 / 8 / 64 at 2k, twice, and old-load rows.
# Prediction: 64 x 2048 143 -> 125-130 us (4.1-4.3 TB/s), batch 64 at 2k
# 9.15 -> 8.6-8.75 ms; batch 1 unchanged within 0.02 ms.
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda}, lib/,
# shared/.
# BT_ATTN_TC_LOAD and BT_ATTN_LAZY were removed after this call (the
# warp-local load landed, the lazy rescale did not); PERFORMANCE.md,
# round 11, section 4.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11b "${1:-build-r11b}"
export BT_SHARED_DIR=$PWD/$c/shared
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run test_attn 200 stdbuf -oL "$c/gpu/test_attn"
run test_block 150 env BT_ATTN_TC_LOAD=block KT_ATTN_FA2=0 stdbuf -oL "$c/gpu/test_attn"
run test_nolazy 150 env BT_ATTN_LAZY=0 KT_ATTN_FA2=0 stdbuf -oL "$c/gpu/test_attn"
run test_model 200 stdbuf -oL "$c/gpu/test_cuda_model"
run dec 100 "$c/gpu/bench_kernels" --dec
run dec_block 100 env BT_ATTN_TC_LOAD=block "$c/gpu/bench_kernels" --dec
run dec_nolazy 100 env BT_ATTN_LAZY=0 "$c/gpu/bench_kernels" --dec
run ncu_b64 150 "$ncu" --clock-control none -k 'regex:attn_decode_tc' --launch-skip 24 --launch-count 1 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section InstructionStats --section SchedulerStats "$c/gpu/bench_kernels" --dec --reps 3
cp "$tmp/ncu_b64" "$out/" 2>/dev/null
smi_start
bc a BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
bc blk BT_ATTN_TC_LOAD=block -- --batch 1,8,64 --ctx 2048 --prefill 0
bc a2 BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 2048
smi_stop
{
  echo "## round 11b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_block test_nolazy test_model
  for f in dec dec_block dec_nolazy; do echo "### $f"; grep -h "^attn" "$tmp/$f"; done
  echo "### ncu_b64"; echo '```'
  grep -E "attn_decode_tc_kernel|Duration|DRAM Throughput|Registers Per|Warp Cycles Per Issued|Issued Ipc|No Eligible|Issued Instructions  |Achieved Occupancy" "$tmp/ncu_b64" | head -20
  echo '```'
  bc_rows a blk a2
  smi_summary
} > "$table"
cat "$table"
