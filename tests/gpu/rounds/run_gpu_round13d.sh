#!/bin/bash
# run_gpu_round13d.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) the sampling top-k kernel with warp-aggregated
# histogram atomics and RMSNorm's weights loaded before its PDL wait:
# test_sample, test_rmsnorm, test_cuda_sample, test_sample_dist; (2)
# bench_cuda (new) vs bench_cuda_b (HEAD) at batch 1 and 64 @2k,
# interleaved twice, every column (+top-p is the sampler's cost); (3)
# batch-1 switches (BT_GEMV_RPW=1, BT_GEMV_GLU=warp, BT_PDL_SMALL=1);
# (4) Nsight Compute on the whole-row sampler kernels at batch 1.
# Carry: gpu/{bench_cuda,bench_cuda_b,test_sample,test_rmsnorm,
# test_cuda_sample,test_sample_dist}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13d "${1:-build-r13d}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 13d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_sample test_rmsnorm test_cuda_sample test_sample_dist
    bc_cols new1 old1 new2 old2 rpw1 gluwarp pdlsmall1
    echo '```'
    grep -E "sd_kernel|top_kernel|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall|Issue Slot|Executed Ipc|L1/TEX Hit|Shared" "$tmp/ncu" 2>/dev/null | head -70
    echo '```'
  } > "$table"
}
run test_sample 150 "$c/gpu/test_sample"
run test_rmsnorm 100 "$c/gpu/test_rmsnorm"
run test_cuda_sample 150 "$c/gpu/test_cuda_sample"
run test_sample_dist 150 "$c/gpu/test_sample_dist"
report
for i in 1 2; do
  bc new$i BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 0
  bcb old$i --batch 1,64 --ctx 2048 --prefill 0
  report
done
bc rpw1 BT_GEMV_RPW=1 -- --batch 1 --ctx 2048 --prefill 0
bc gluwarp BT_GEMV_GLU=warp -- --batch 1 --ctx 2048 --prefill 0
bc pdlsmall1 BT_PDL_SMALL=1 -- --batch 1 --ctx 2048 --prefill 0
report
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run ncu 150 "$ncu" --clock-control none -k 'regex:sd_kernel|top_kernel' --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section InstructionStats --section MemoryWorkloadAnalysis \
  "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1 --ctx 512 --prefill 0 --steps 2
report
cat "$table"
