#!/bin/bash
# run_gpu_round6c.sh [CARRY] - round 6, third device call (2026-12-01),
# ON THE DEVICE MACHINE: occupancy variants of the FA2 prefill attention
# at head 128 (BT_FA2_OCC: 1 = 4 warps, 2 stages, 3 blocks/SM at <= 168
# registers; 2 = 8 warps, 2 stages; 3 = 4 warps, 2 stages, 2 blocks; the
# default kernels use 233-238 registers: 8 warps per SM), each through
# test_attn, bench_kernels --attn and whole prefills, plus Nsight Compute
# on the default and variant 1 at 2048 tokens.  Writes $OUT/r6c.log and
# $OUT/r6c_table.md.  ~5 minutes.  BT_FA2_OCC was removed after this
# run (no gain, docs/PERFORMANCE.md round 6 section 5): the variant rows
# now run the default kernel.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6c "${1:-build-r6c}"
run test_attn 120 "$c/gpu/test_attn"
for v in 1 2 3; do run test_attn_occ$v 120 env BT_FA2_OCC=$v "$c/gpu/test_attn"; done
run attn 60 "$c/gpu/bench_kernels" --attn --reps 9
for v in 1 2 3; do run attn_occ$v 60 env BT_FA2_OCC=$v "$c/gpu/bench_kernels" --attn --reps 9; done
bc def BT_X=1 -- --batch 1 --ctx 512 --prefill 2048,8192
for v in 1 2 3; do bc occ$v BT_FA2_OCC=$v -- --batch 1 --ctx 512 --prefill 2048,8192; done
bc def2 BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in 0 1; do
  run ncu_occ$v 90 env BT_FA2_OCC=$v "$ncu" --clock-control none -k 'regex:attn_prefill_fa2' \
    --launch-skip 5 --launch-count 1 --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis \
    "$c/gpu/bench_kernels" --attn --reps 3
done
{
  echo "## round 6c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_attn_occ1 test_attn_occ2 test_attn_occ3
  for s in attn attn_occ1 attn_occ2 attn_occ3; do echo "### $s"; grep "^attn prefill" "$tmp/$s"; done
  bc_rows def occ1 occ2 occ3 def2
  for v in 0 1; do
    echo "### ncu occ$v"; echo '```'
    grep -E "attn_prefill_fa2|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Issue Slots|Executed Ipc|Pipe|Stall|Bank|Waves" "$tmp/ncu_occ$v" | head -50
    echo '```'
  done
} > "$table"
cat "$table"
