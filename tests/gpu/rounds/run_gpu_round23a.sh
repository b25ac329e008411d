#!/bin/bash
# run_gpu_round23a.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the decode attention's K / V copies with an L2
# evict-first policy (BT_ATTN_KV_EVICT_FIRST=1, "ef"), so the o weights
# that worker_gemm prefetches into L2 after qkv survive the attention's
# K / V stream, against the default ("base") and the next-weight prefetch
# off (BT_GEMM_PF_NEXT=0, "nopf": never A/B'd since round 3 of the
# kernels). One BT_GEMM_CACHE file per GEMM key (ef shares base's), ABBA
# at b1 / b8 / b32 / b64 / b128 @2k; traces of a b64 step (base, ef);
# then round 22's review commit (test_gemm --cache) and
# test_attn with the policy on.
# Carry: gpu/test_gemm gpu/test_attn gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23a "${1:-build-r23a}"
declare -A env=([base]="BT_X=1" [ef]="BT_ATTN_KV_EVICT_FIRST=1" [nopf]="BT_GEMM_PF_NEXT=0")
declare -A cache=([base]=base [ef]=base [nopf]=nopf)
report() {
  {
    echo "## round 23a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm_cache test_gemm test_attn_ef 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in base ef nopf; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
  } > "$table"
}
for v in base nopf; do
  bc warm_$v ${env[$v]} BT_GEMM_CACHE=$tmp/$v.txt -- --batch 1 --ctx 512 --prefill 0
done
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
n=0
for v in base ef nopf nopf ef base base ef nopf nopf ef base; do
  n=$((n + 1)); k=$(( (n + 2) / 3 ))
  bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/${cache[$v]}.txt -- $a
  [ $((n % 3)) = 0 ] && report
done
trace_step base bench_cuda BT_GEMM_CACHE=$tmp/base.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step ef bench_cuda ${env[ef]} BT_GEMM_CACHE=$tmp/base.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  for t in base ef; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done
} > "$tmp/traces"
report; cat "$tmp/traces" >> "$table"
run test_gemm_cache 60 "$c/gpu/test_gemm" --cache
run test_attn_ef 120 env BT_ATTN_KV_EVICT_FIRST=1 "$c/gpu/test_attn"
report; cat "$tmp/traces" >> "$table"
grep -h "read ceiling" "$tmp"/t_base_1 >> "$table"
head -1 "$log" >> "$table"
cat "$table"
