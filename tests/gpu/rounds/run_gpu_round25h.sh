#!/bin/bash
# run_gpu_round25h.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: where the default prefill attention (fa2pp128) waits
# at 2048 tokens, for the next session: Nsight Compute's pipe
# utilization (ComputeWorkloadAnalysis: tensor, FMA, ALU, XU = MUFU),
# instruction mix, warp stall reasons and the source lines they sample;
# then head 64 (bench_kernels --attn-hd 64): the default there (fa2pp)
# against fa2pp128, twice, to decide the head-64 default.
# Carry: gpu/bench_kernels, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25h "${1:-build-r25h}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run ncu_p128 150 env BT_PREFILL_KERNEL=fa2pp128 "$ncu" --clock-control none \
  -k 'regex:attn_prefill_fa2' --launch-skip 4 --launch-count 1 \
  --section ComputeWorkloadAnalysis --section InstructionStats \
  --section WarpStateStats --section SourceCounters \
  --metrics 'regex:smsp__warp_issue_stalled_.*_per_warp_active.pct' \
  --print-details all "$c/gpu/bench_kernels" --attn --reps 3
cp "$tmp/ncu_p128" "$out/ncu_p128.txt" 2>/dev/null
run hd64_a 60 "$c/gpu/bench_kernels" --attn-hd 64
run hd64_b 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels" --attn-hd 64
run hd64_c 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels" --attn-hd 64
run hd64_d 60 "$c/gpu/bench_kernels" --attn-hd 64
{
  echo "## round 25h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -E "Pipe|pipe|Executed Ipc|Issue Slots|stalled_.*pct" "$tmp/ncu_p128" | sort -k3 -n -r | head -40
  grep -h "^attn prefill" "$tmp"/hd64_? 2>/dev/null
  head -1 "$log"
} > "$table"
cat "$table"
