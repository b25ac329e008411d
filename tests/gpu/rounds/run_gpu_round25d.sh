#!/bin/bash
# run_gpu_round25d.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: fa3 again (BT_PREFILL_KERNEL=fa3), now without the
# spill: its wgmmas and waits off every branch (a prologue, the loop, an
# epilogue; both warpgroups walk all tiles), and no trap in the kernel
# (mbar_wait's timeout ends in wg_abort: ptxas ignored setmaxnreg's 240
# registers in a kernel that can reach a trap; 217 needed):
#   1. test_attn (its fa3 pass), test_cuda_model with fa3,
#      test_gemm --variant tma (mbar_wait's new abort);
#   2. bench_kernels --attn (default = fa2pp128, fa2pp, fa2wqv, fa3);
#      predicted fa3 105-120 us at 2048 tokens, 1250-1400 at 8192;
#   3. prefill 2048 / 8192 in the engine, default against fa3, ABBA x2;
#   4. Nsight Compute on fa3's 2048-token launch.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/test_gemm
# gpu/bench_kernels gpu/bench_cuda, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25d "${1:-build-r25d}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([def]="BT_X=1" [fa3]="BT_PREFILL_KERNEL=fa3")
report() {
  {
    echo "## round 25d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn model_fa3 gemm_tma
    grep -h "fa3" "$tmp/test_attn" 2>/dev/null | grep -v "^PASS" | head -5
    grep -h "^attn prefill" "$tmp/attn_b" 2>/dev/null
    for v in def fa3; do
      for k in 1 2; do
        echo "$v $k: $(bc_ttft ${v}_$k)"
      done
    done
    echo "### ncu fa3"
    grep -E "Duration|Compute \(SM\) Throughput|Issued Warp Per|No Eligible|Local Memory Spilling Requests|Registers Per|SM Frequency" "$tmp/ncu_fa3" 2>/dev/null | head -10
    head -1 "$log"
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
report; cat "$table"
run attn_b 60 "$c/gpu/bench_kernels" --attn
run model_fa3 150 env BT_PREFILL_KERNEL=fa3 "$c/gpu/test_cuda_model"
run gemm_tma 120 "$c/gpu/test_gemm" --variant tma
report; cat "$table"
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 64
a="--batch 1 --ctx 512 --prefill 2048,8192"
for k in 1 2; do
  order="def fa3"; [ $k = 2 ] && order="fa3 def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
cat "$table"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run ncu_fa3 100 env BT_PREFILL_KERNEL=fa3 "$ncu" --clock-control none -k 'regex:attn_prefill_fa2' \
  --launch-skip 4 --launch-count 1 --section SpeedOfLight --section SchedulerStats \
  --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  "$c/gpu/bench_kernels" --attn --reps 3
cp "$tmp/ncu_fa3" "$out/" 2>/dev/null
report; cat "$table"
