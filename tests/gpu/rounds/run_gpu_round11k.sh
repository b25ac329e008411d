#!/bin/bash
# run_gpu_round11k.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: fa2pp with a TMA producer warp (written after call
# 12 without a device): call 12's profile put the integer pipe busiest
# (the consumers' own copy addressing) at two warps a scheduler, so a
# ninth warp now loads each 64-key tile as boxes of min(block, 64) slots
# x 64 dims of a 3-D tensor map over the layer cache ({dims, KV heads,
# slots}, 128-byte swizzle = the slab layout), out-of-range pages as
# zeros; the consumers only wait on the full mbarriers.  The backend now
# zeroes the KV pool at allocation (slots past a chunk's end in a loaded
# page must be finite).  Same steps as run_gpu_round11i.sh.
# Prediction: attention at 2048 tokens 162 -> 135-150 us a layer.
# Carry: gpu/{test_attn,test_cuda_model,test_gemm,bench_kernels,
# bench_cuda}, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11k "${1:-build-r11k}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 90 stdbuf -oL "$c/gpu/test_attn"
run test_model 120 env BT_PREFILL_KERNEL=fa2pp stdbuf -oL "$c/gpu/test_cuda_model"
run test_tma 100 stdbuf -oL "$c/gpu/test_gemm" --variant tma
run attn_def 60 "$c/gpu/bench_kernels" --attn
run attn_pp 60 env BT_PREFILL_KERNEL=fa2pp "$c/gpu/bench_kernels" --attn
smi_start
for i in 1 2; do
  bc d$i BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
  bc p$i BT_PREFILL_KERNEL=fa2pp -- --batch 1 --ctx 512 --prefill 2048
done
smi_stop
{
  echo "## round 11k $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model test_tma
  grep -h "fa2pp" "$tmp/test_attn" | grep -v "^PASS" | head -8
  tail -3 "$tmp/test_attn"
  grep -h "^attn" "$tmp/attn_def" "$tmp/attn_pp"
  bc_rows d1 p1 d2 p2
  smi_summary
} > "$table"
cat "$table"
