#!/bin/bash
# run_gpu_round23h.sh [CARRY] - prepared in round 23 (2026-12-03) for the
# next session, ON THE DEVICE MACHINE, issue 4: does the decode
# attention's 128-byte L2 prefetch size (the default since 23f) win on
# every machine? ABBA x4 of the default against BT_ATTN_KV_PF=0 at b8 /
# b32 / b64 / b128 @2k on one BT_GEMM_CACHE file, a trace of a b64 step
# for each, and the target rows twice.
# Carry: gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23h "${1:-build-r23h}"
declare -A env=([def]="BT_X=1" [pf0]="BT_ATTN_KV_PF=0")
report() {
  {
    echo "## round 23h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    echo "b8 b32 b64 b128 @2k"
    for v in def pf0; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    bc_rows t_1 t_2
    grep -h "read ceiling" "$tmp"/t_t_1 "$tmp"/t_t_2 2>/dev/null
    head -1 "$log"
  } > "$table"
}
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order="def pf0"; [ $((k % 2)) = 0 ] && order="pf0 def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
done
report
for r in 1 2; do
  bc t_$r BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
done
report
trace_step def bench_cuda BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step pf0 bench_cuda ${env[pf0]} BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
report
for t in def pf0; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done >> "$table"
cat "$table"
