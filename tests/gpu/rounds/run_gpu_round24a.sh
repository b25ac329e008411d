#!/bin/bash
# run_gpu_round24a.sh [CARRY] - round 24 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4:
#   1. test_attn and test_gemm --cache at round 23's review commits (one
#      heuristic query; the attention's prefetch-size switch);
#   2. test_gemm --pdl: programmatic edges into cuBLASLt's kernels
#      (BT_GEMM_LT_PDL=1, new): the probe's controls, which tuned picks
#      wait for their predecessor, every product behind an early-trigger
#      lead exact;
#   3. ABBA x4 of BT_GEMM_LT_PDL=1 against the default at b8..b128 @2k on
#      one BT_GEMM_CACHE file, and a b64 trace of each (predicted: up to
#      -0.06 ms at b64 if all four products wait);
#   4. run_gpu_round23h.sh: the attention's 128-byte K / V prefetch size
#      against BT_ATTN_KV_PF=0, ABBA x4, and the target rows.
# Carry: gpu/test_attn gpu/test_gemm gpu/bench_cuda
# gpu/libbt_kernel_trace.so, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r24a "${1:-build-r24a}"
declare -A env=([def]="BT_X=1" [pdl]="BT_GEMM_LT_PDL=1")
report() {
  {
    echo "## round 24a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_gemm_cache test_gemm_pdl
    grep -h "^FAIL\|^INFO gemm pdl" "$tmp/test_gemm_pdl" 2>/dev/null | head -20
    grep -h "gemm pdl o=" "$tmp"/bc_pdl_1 2>/dev/null | head -8
    echo "b8 b32 b64 b128 @2k"
    for v in def pdl; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    head -1 "$log"
  } > "$table"
}
run test_gemm_pdl 120 env BT_LOG=INFO "$c/gpu/test_gemm" --pdl
report; cat "$table"
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order="def pdl"; [ $((k % 2)) = 0 ] && order="pdl def"
  for v in $order; do
    if [ "$v" = pdl ] && [ $k = 1 ]; then
      bc ${v}_$k ${env[$v]} BT_LOG=INFO BT_GEMM_CACHE=$tmp/gc.txt -- $a
    else
      bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
    fi
  done
  report
done
cat "$table"
trace_step def bench_cuda BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step pdl bench_cuda ${env[pdl]} BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
run test_attn 150 "$c/gpu/test_attn"
run test_gemm_cache 120 "$c/gpu/test_gemm" --cache
report
for t in def pdl; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done >> "$table"
cat "$table"
bash "$d/run_gpu_round23h.sh" "$c"
