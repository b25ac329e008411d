#!/bin/bash
# run_gpu_round23b.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: call 1 (23a) found the attention's evict-first K / V
# 1.4% faster by itself (137.6 -> 135.7 us a layer at b64 @2k) and the
# next-weight prefetch off by default. Now both together: does the o
# weights' prefetch (issued after qkv, before RoPE and the attention)
# survive the attention's K / V stream once that goes first, and does o
# run faster from L2? Variants: base, ef (BT_ATTN_KV_EVICT_FIRST=1), pf
# (BT_GEMM_PF_NEXT=1), efpf (both), efpf16 (both, BT_GEMM_PF_MB=16).
# One BT_GEMM_CACHE file per GEMM key, ABBA at b1..b128 @2k; traces of a
# b64 step for ef and efpf; then test_gemm (full run: round 22's review
# commit).
# Carry: gpu/test_gemm gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23b "${1:-build-r23b}"
declare -A env=([base]="BT_X=1" [ef]="BT_ATTN_KV_EVICT_FIRST=1" [pf]="BT_GEMM_PF_NEXT=1"
  [efpf]="BT_ATTN_KV_EVICT_FIRST=1 BT_GEMM_PF_NEXT=1"
  [efpf16]="BT_ATTN_KV_EVICT_FIRST=1 BT_GEMM_PF_NEXT=1 BT_GEMM_PF_MB=16")
declare -A cache=([base]=base [ef]=base [pf]=pf [efpf]=pf [efpf16]=pf16)
vs="base ef pf efpf efpf16"
report() {
  {
    echo "## round 23b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in $vs; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
  } > "$table"
}
bc warm_base BT_GEMM_CACHE=$tmp/base.txt -- --batch 1 --ctx 512 --prefill 0
bc warm_pf ${env[pf]} BT_GEMM_CACHE=$tmp/pf.txt -- --batch 1 --ctx 512 --prefill 0
bc warm_pf16 ${env[efpf16]} BT_GEMM_CACHE=$tmp/pf16.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order=$vs; [ $((k % 2)) = 0 ] && order=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/${cache[$v]}.txt -- $a
  done
  report
done
trace_step ef bench_cuda ${env[ef]} BT_GEMM_CACHE=$tmp/base.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step efpf bench_cuda ${env[efpf]} BT_GEMM_CACHE=$tmp/pf.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  for t in ef efpf; do echo "### trace $t"; head -18 "$tmp/tl_$t"; done
  grep -h "read ceiling" "$tmp"/t_base_1
  head -1 "$log"
} > "$tmp/tail"
report; cat "$tmp/tail" >> "$table"
run test_gemm 200 "$c/gpu/test_gemm"
report; cat "$tmp/tail" >> "$table"
cat "$table"
