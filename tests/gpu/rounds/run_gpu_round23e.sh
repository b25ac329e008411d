#!/bin/bash
# run_gpu_round23e.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the side-branch prefetch of the o weights beside the
# attention (BT_PF_SIDE=o, "o") against the landing default (evict-first
# K / V, no prefetch: "def") once more, on another machine: ABBA x3 at
# b8 / b32 / b64 / b128 @2k on one BT_GEMM_CACHE file; then the target
# rows twice (b1 / b64 @2k, prefill 2048) at the landing default.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23e "${1:-build-r23e}"
declare -A env=([def]="BT_X=1" [o]="BT_PF_SIDE=o")
report() {
  {
    echo "## round 23e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    echo "b8 b32 b64 b128 @2k"
    for v in def o; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4 ${v}_5 ${v}_6)"; done
    bc_rows t_1 t_2
    grep -h "read ceiling" "$tmp"/t_t_1 "$tmp"/t_t_2 2>/dev/null
    head -1 "$log"
  } > "$table"
}
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4 5 6; do
  order="def o"; [ $((k % 2)) = 0 ] && order="o def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
done
report
for r in 1 2; do
  bc t_$r BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
done
report
cat "$table"
