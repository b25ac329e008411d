#!/bin/bash
# run_gpu_round25b.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: fa3 (BT_PREFILL_KERNEL=fa3, new: fa2pp128 with
# FlashAttention-3's overlap inside each warpgroup: a turn issues tile
# kt's S with tile kt-1's P V, kt's softmax runs under that P V; K and V
# of a stage released separately) against fa2pp128 (call 1: -2% at
# 2048 tokens, -11% at 8192 alone; prefill 2048 -0.46 ms) and fa2pp:
#   1. test_attn (passes fa2pp128, fa3), test_cuda_model with fa3;
#   2. bench_kernels --attn (fa2pp, fa2wqv, fa2pp128, fa3);
#   3. Nsight Compute on the 2048-token launch of each of the three;
#   4. prefill 2048 / 8192 in the engine, three rounds rotating the order.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/bench_kernels
# gpu/bench_cuda, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25b "${1:-build-r25b}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([pp]="BT_PREFILL_KERNEL=fa2pp" [p128]="BT_PREFILL_KERNEL=fa2pp128" [fa3]="BT_PREFILL_KERNEL=fa3")
report() {
  {
    echo "## round 25b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn model_fa3
    grep -h "fa3\|fa2pp128" "$tmp/test_attn" 2>/dev/null | grep -v "^PASS" | head -5
    grep -h "^attn prefill" "$tmp/attn_b" 2>/dev/null
    for v in pp p128 fa3; do
      for k in 1 2 3; do
        echo "$v $k: $(bc_ttft ${v}_$k)"
      done
    done
    for v in pp p128 fa3; do
      echo "### ncu $v"
      grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Issued Warp Per|Local Memory|Stall" "$tmp/ncu_$v" 2>/dev/null | head -16
    done
    head -1 "$log"
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
report; cat "$table"
run attn_b 60 "$c/gpu/bench_kernels" --attn
run model_fa3 150 env BT_PREFILL_KERNEL=fa3 "$c/gpu/test_cuda_model"
report; cat "$table"
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 64
a="--batch 1 --ctx 512 --prefill 2048,8192"
for k in 1 2 3; do
  case $k in 1) order="pp p128 fa3";; 2) order="fa3 pp p128";; 3) order="p128 fa3 pp";; esac
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
cat "$table"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in pp p128 fa3; do
  run ncu_$v 100 env ${env[$v]} "$ncu" --clock-control none -k 'regex:attn_prefill_fa2' \
    --launch-skip 4 --launch-count 1 --section SpeedOfLight --section SchedulerStats \
    --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
    "$c/gpu/bench_kernels" --attn --reps 3
  cp "$tmp/ncu_$v" "$out/" 2>/dev/null
done
report; cat "$table"
