#!/bin/bash
# run_gpu_round22c.sh [CARRY] - round 22 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the GEMM tuner with the lead (22b) and the final round
# (the candidates within 4% of the best timed again, 12 interleaved runs)
# -- "new", the default -- against rounds 1-21's tuner (BT_GEMM_TUNE_LEAD=0
# BT_GEMM_TUNE_FINAL=0, "old") and the final round alone (LEAD=0, "fin").
# One BT_GEMM_CACHE file per variant (warmed first), the engine at b1 /
# b8 / b32 / b64 / b128 @2k in the order new old fin fin old new (x2);
# test_gemm --cache; traces of a b64 step for new and old.
# Carry: gpu/test_gemm gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r22c "${1:-build-r22c}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([new]="BT_X=1" [old]="BT_GEMM_TUNE_LEAD=0 BT_GEMM_TUNE_FINAL=0" [fin]="BT_GEMM_TUNE_LEAD=0")
report() {
  {
    echo "## round 22c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in new old fin; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
  } > "$table"
}
run test_gemm 120 "$c/gpu/test_gemm" --cache
for v in new old fin; do
  bc warm_$v BT_LOG=INFO ${env[$v]} BT_GEMM_CACHE=$tmp/$v.txt -- --batch 1 --ctx 512 --prefill 0
done
report
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
n=0
for v in new old fin fin old new new old fin fin old new; do
  n=$((n + 1)); k=$(( (n + 2) / 3 ))
  bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/$v.txt -- $a
done
report
trace_step new bench_cuda BT_GEMM_CACHE=$tmp/new.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step old bench_cuda ${env[old]} BT_GEMM_CACHE=$tmp/old.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  for v in new old fin; do
    echo "### picks $v"
    grep -o 'gemm tune t=.*' "$tmp/bc_warm_$v" | cut -c1-600
  done
  for t in new old; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done
} >> "$table"
cp "$tmp"/*.txt "$out/" 2>/dev/null
cat "$table"
