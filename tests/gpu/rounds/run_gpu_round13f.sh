#!/bin/bash
# run_gpu_round13f.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: Nsight Compute on the two whole-row samplers
# (top_kernel through test_sample, sd_kernel through test_sample_dist:
# small processes, so kernel replay can save their memory; bench_cuda's
# KV pool made ncu fail in call 5), and bench_cuda new / new with
# BT_GEMM_LT_SPLITK=0 / HEAD (bench_cuda_b) at batch 8 and 64, twice.
# Carry: gpu/{bench_cuda,bench_cuda_b,test_sample,test_sample_dist},
# lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13f "${1:-build-r13f}"
export BT_SHARED_DIR=$PWD/$c/shared
pat='top_kernel|sd_kernel|Duration|Registers Per|Local Memory|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Avg. Active Threads|Executed Instructions  |Stall|Grid Size|L1/TEX Hit|Mem Busy|Max Bandwidth'
report() {
  {
    echo "## round 13f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    bc_cols new1 nosk1 old1 new2 nosk2 old2
    echo '```'; grep -E "$pat" "$tmp/ncu_top" 2>/dev/null | head -60; echo '```'
    echo '```'; grep -E "$pat" "$tmp/ncu_sd" 2>/dev/null | head -40; echo '```'
  } > "$table"
}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
secs="--section SpeedOfLight --section LaunchStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis"
run ncu_top 150 "$ncu" --clock-control none -k regex:top_kernel --launch-skip 6 --launch-count 3 $secs "$c/gpu/test_sample"
report
run ncu_sd 150 "$ncu" --clock-control none -k regex:sd_kernel --launch-skip 2 --launch-count 2 $secs "$c/gpu/test_sample_dist"
report
for i in 1 2; do
  bc new$i BT_X=1 -- --batch 8,64 --ctx 2048 --prefill 0
  bc nosk$i BT_GEMM_LT_SPLITK=0 -- --batch 8,64 --ctx 2048 --prefill 0
  bcb old$i --batch 8,64 --ctx 2048 --prefill 0
  report
done
cat "$table"
