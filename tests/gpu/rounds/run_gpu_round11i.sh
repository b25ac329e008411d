#!/bin/bash
# run_gpu_round11i.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: fa2pp, fa2wqv with FlashAttention-3's ping-pong of
# the block's two warpgroups (BT_PREFILL_KERNEL=fa2pp; written without a
# device): no block barrier in the key loop, the warpgroups take turns
# issuing S on named barriers 1 / 2, stages handed over by full / empty
# mbarriers (cp.async.mbarrier.arrive), refilled two tiles after use, 5
# stages.  Also re-checks the tma GEMV, whose mbarrier helpers moved to
# wgmma.cuh.
# (1) test_attn (its new fa2pp pass), test_cuda_model with fa2pp,
#     test_gemm --variant tma;
# (2) bench_kernels --attn default (fa2wqv) and fa2pp;
# (3) prefill 2048 default vs fa2pp, interleaved, twice.
# Prediction: attention at 2048 tokens 162 -> 120-140 us a layer; prefill
# 2048 -0.7 to -1.3 ms.  A hang (named-barrier pairing) ends at the step
# timeouts; an mbarrier stall traps.
# Carry: gpu/{test_attn,test_cuda_model,test_gemm,bench_kernels,
# bench_cuda}, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11i "${1:-build-r11i}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 120 stdbuf -oL "$c/gpu/test_attn"
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
  echo "## round 11i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model test_tma
  grep -h "fa2pp" "$tmp/test_attn" | grep -v "^PASS" | head -8
  tail -3 "$tmp/test_attn"
  grep -h "^attn" "$tmp/attn_def" "$tmp/attn_pp"
  bc_rows d1 p1 d2 p2
  smi_summary
} > "$table"
cat "$table"
