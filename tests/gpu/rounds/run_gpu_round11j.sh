#!/bin/bash
# run_gpu_round11j.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: Nsight Compute (full set) on the 2048-token prefill
# attention launch of fa2wqv (the default) and of fa2pp (its ping-pong
# version, measured equal in call 11): where the kernel's time goes now
# that neither overlap inside a warpgroup nor between the two paid.
# bench_kernels --attn --reps 3: 4 launches per kernel variant and
# prompt, default then fa2 (so the default's 2048 launch is the 9th);
# with BT_PREFILL_KERNEL set, one variant (fa2pp's 2048 launch is the
# 5th).
# Carry: gpu/bench_kernels, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11j "${1:-build-r11j}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run ncu_wqv 150 "$ncu" --clock-control none -k 'regex:attn_prefill_fa2' --launch-skip 8 --launch-count 1 \
  --set full "$c/gpu/bench_kernels" --attn --reps 3
run ncu_pp 150 env BT_PREFILL_KERNEL=fa2pp "$ncu" --clock-control none -k 'regex:attn_prefill_fa2' --launch-skip 4 --launch-count 1 \
  --set full "$c/gpu/bench_kernels" --attn --reps 3
cp "$tmp/ncu_wqv" "$tmp/ncu_pp" "$out/" 2>/dev/null
{
  echo "## round 11j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in ncu_wqv ncu_pp; do
    echo "### $f"; echo '```'
    grep -E "attn_prefill_fa2_kernel|Duration|Compute \(SM\) Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Issued Ipc|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Executed Ipc|SM Busy|Issue Slots Busy" "$tmp/$f" | head -24
    echo '```'
  done
} > "$table"
cat "$table"
