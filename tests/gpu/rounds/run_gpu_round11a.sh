#!/bin/bash
# run_gpu_round11a.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: why batch-64 decode attention reads KV at 3.77 TB/s
# (84% of 4.5) at 2k context, and the prefill default now fa2wqv.
# (1) bench_kernels --dec at pipeline depths 3 (default), 2, 4, 6
#     (BT_ATTN_TC_STAGES); its last row is the HND-layout probe (a
#     block's K rows 256 B apart instead of 2 KB);
# (2) test_attn's decode cases at depths 2 and 6 (KT_ATTN_FA2=0);
# (3) Nsight Compute, full sections, on the 64 x 2048 launch and on the
#     probe's (launch-skip counts 4 launches per plan pass, 2 passes per
#     case, reps 3);
# (4) the target rows: batch 1 and 64 at 2k, prefill 2048 twice.
# Prediction: depth 6 (one block an SM, 5 tiles = 160 KB in flight vs
# 128 KB) reads 4.0-4.1 TB/s if the kernel is latency-bound; the HND
# probe within 3% of the NHD row; ncu shows long-scoreboard (cp.async
# wait) stalls dominating.
# Carry: gpu/{test_attn,bench_kernels,bench_cuda}, lib/.
# The BT_ATTN_TC_STAGES switch it used was removed after this call (depth
# 3 won); PERFORMANCE.md, round 11, section 3, has its results.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11a "${1:-build-r11a}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run dec3 100 "$c/gpu/bench_kernels" --dec
for st in 2 4 6; do
  run dec$st 100 env BT_ATTN_TC_STAGES=$st "$c/gpu/bench_kernels" --dec
done
run test_st2 150 env BT_ATTN_TC_STAGES=2 KT_ATTN_FA2=0 stdbuf -oL "$c/gpu/test_attn"
run test_st6 150 env BT_ATTN_TC_STAGES=6 KT_ATTN_FA2=0 stdbuf -oL "$c/gpu/test_attn"
run ncu_b64 150 "$ncu" --clock-control none -k 'regex:attn_decode_tc' --launch-skip 24 --launch-count 1 \
  --set full "$c/gpu/bench_kernels" --dec --reps 3
run ncu_hnd 150 "$ncu" --clock-control none -k 'regex:attn_decode_tc' --launch-skip 56 --launch-count 1 \
  --set full "$c/gpu/bench_kernels" --dec --reps 3
cp "$tmp/ncu_b64" "$tmp/ncu_hnd" "$out/" 2>/dev/null
smi_start
bc a BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
bc p2 BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
smi_stop
{
  echo "## round 11a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_st2 test_st6
  for st in 3 2 4 6; do echo "### depth $st"; grep -h "^attn" "$tmp/dec$st"; done
  for f in ncu_b64 ncu_hnd; do
    echo "### $f"; echo '```'
    grep -E "attn_decode_tc_kernel|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|No Eligible|Mem Busy|Max Bandwidth|Dynamic Shared|Block Limit" "$tmp/$f" | head -40
    echo '```'
  done
  bc_rows a p2
  smi_summary
} > "$table"
cat "$table"
