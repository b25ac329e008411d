#!/bin/bash
# run_gpu_round23c.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the side-branch L2 prefetch of the next projection's
# weights (BT_PF_SIDE, cuda_backend.c), with the attention's evict-first
# K / V on in every variant (23a / 23b: -0.03 ms at b64). Call 2's
# inline prefetch made o 1.8 us and qkv 2 us faster a layer but cost a
# 21 us kernel before each product; here the prefetch runs beside the
# main stream. Variants: ef (no prefetch), o, oq, all (ogdq), o1 (o from
# one token: BT_PF_SIDE_TOK=1-128). ABBA at b1..b128 @2k on one
# BT_GEMM_CACHE file; traces of a b64 step (ef, all); test_cuda_model
# with every step prefetching (BT_PF_SIDE=ogdq BT_PF_SIDE_TOK=1-100000).
# Carry: gpu/test_cuda_model gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23c "${1:-build-r23c}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_ATTN_KV_EVICT_FIRST=1
declare -A env=([ef]="BT_X=1" [o]="BT_PF_SIDE=o" [oq]="BT_PF_SIDE=oq"
  [all]="BT_PF_SIDE=ogdq" [o1]="BT_PF_SIDE=o BT_PF_SIDE_TOK=1-128")
vs="ef o oq all o1"
report() {
  {
    echo "## round 23c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_cuda_model_pf 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in $vs; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
  } > "$table"
}
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order=$vs; [ $((k % 2)) = 0 ] && order=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
trace_step ef bench_cuda BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step all bench_cuda ${env[all]} BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  for t in ef all; do echo "### trace $t"; head -18 "$tmp/tl_$t"; done
  grep -h "read ceiling" "$tmp"/t_ef_1
  head -1 "$log"
} > "$tmp/tail"
report; cat "$tmp/tail" >> "$table"
run test_cuda_model_pf 200 env BT_PF_SIDE=ogdq BT_PF_SIDE_TOK=1-100000 "$c/gpu/test_cuda_model"
report; cat "$tmp/tail" >> "$table"
cat "$table"
