#!/bin/bash
# run_gpu_round22b.sh [CARRY] - round 22 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: as 22a, with the lead that never triggers early
# (cuda_gemv_tune_lead; 22a's RMSNorm lead let the tc GEMV start early
# and batch 8 lost 0.07 ms).  test_gemm --cache; the
# tuner's picks of both modes; then on one BT_GEMM_CACHE file per mode
# the engine at b1 / b8 / b32 / b64 / b128 @2k, ABBA order, three pairs;
# CUPTI traces of a b64 step in both modes.
# Carry: gpu/test_gemm gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r22b "${1:-build-r22b}"
export BT_SHARED_DIR=$PWD/$c/shared
gl=$tmp/lead.txt gi=$tmp/iso.txt
report() {
  {
    echo "## round 22b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in lead iso; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    bc_rows lead_1 iso_1 2>/dev/null
  } > "$table"
}
run test_gemm 120 "$c/gpu/test_gemm" --cache
bc warm_lead BT_LOG=INFO BT_GEMM_CACHE=$gl -- --batch 1 --ctx 512 --prefill 0
bc warm_iso BT_LOG=INFO BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- --batch 1 --ctx 512 --prefill 0
report
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
bc lead_1 BT_GEMM_CACHE=$gl -- $a
bc iso_1 BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- $a
bc iso_2 BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- $a
bc lead_2 BT_GEMM_CACHE=$gl -- $a
bc lead_3 BT_GEMM_CACHE=$gl -- $a
bc iso_3 BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- $a
bc iso_4 BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- $a
bc lead_4 BT_GEMM_CACHE=$gl -- $a
report
trace_step lead bench_cuda BT_GEMM_CACHE=$gl -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step iso bench_cuda BT_GEMM_TUNE_LEAD=0 BT_GEMM_CACHE=$gi -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  for v in lead iso; do
    echo "### picks $v (t=bucket: winner us [candidates])"
    grep -o 'gemm tune t=.*' "$tmp/bc_warm_$v" | cut -c1-400
  done
  for t in lead iso; do echo "### trace $t"; head -24 "$tmp/tl_$t"; done
} >> "$table"
cp "$gl" "$gi" "$out/" 2>/dev/null
cat "$table"
