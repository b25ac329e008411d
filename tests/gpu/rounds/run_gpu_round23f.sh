#!/bin/bash
# run_gpu_round23f.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the decode attention's evict-first K / V copies (the
# default, "def") with an L2 prefetch size as well, BT_ATTN_KV_PF=256
# ("p256": each 256-byte K or V row fetched from DRAM as one unit) and
# =128 ("p128"). Round 21's read-only twin put baton's page layout at
# 0.97 of a flat read. ABBA x4 at b8 / b32 / b64 / b128 @2k on one
# BT_GEMM_CACHE file; test_attn with p256.
# Carry: gpu/test_attn gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23f "${1:-build-r23f}"
declare -A env=([def]="BT_X=1" [p256]="BT_ATTN_KV_PF=256" [p128]="BT_ATTN_KV_PF=128")
vs="def p256 p128"
report() {
  {
    echo "## round 23f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn_p256 2>/dev/null
    echo "b8 b32 b64 b128 @2k"
    for v in $vs; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    grep -h "read ceiling" "$tmp"/t_def_1 2>/dev/null
    head -1 "$log"
  } > "$table"
}
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order=$vs; [ $((k % 2)) = 0 ] && order="p128 p256 def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
run test_attn_p256 120 env BT_ATTN_KV_PF=256 "$c/gpu/test_attn"
report
cat "$table"
