#!/bin/bash
# run_gpu_round17c.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the o / down projections as K-split partial products
# (worker_gemm_parts, strided-batched cuBLASLt) reduced into the residual
# by the kernel that also computes the next RMSNorm (cuda_rmsnorm_parts):
# BT_GEMM_PARTS_DOWN / BT_GEMM_PARTS_O.  (1) test_cuda_model with the
# parts on (its 5-token chunks take them); (2) the tuner's log (which
# split-K cuBLASLt picks, the parts' timings); (3) bench_cuda b32 / b64
# @2k interleaved x3; test_rmsnorm and test_gemm --norm first (the new
# kernels' cases).  Carry: gpu/{test_*,bench_cuda}, lib/,
# shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17c "${1:-build-r17c}"
export BT_SHARED_DIR=$PWD/$c/shared
vars="def d2 d4 o2d2 o2d4 o4d4"
envof() {
  case $1 in
    def) echo BT_X=1;;
    d2) echo BT_GEMM_PARTS_DOWN=2;;
    d4) echo BT_GEMM_PARTS_DOWN=4;;
    o2d2) echo BT_GEMM_PARTS_O=2 BT_GEMM_PARTS_DOWN=2;;
    o2d4) echo BT_GEMM_PARTS_O=2 BT_GEMM_PARTS_DOWN=4;;
    o4d4) echo BT_GEMM_PARTS_O=4 BT_GEMM_PARTS_DOWN=4;;
  esac
}
report() {
  {
    echo "## round 17c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_rmsnorm test_gemm model_parts 2>/dev/null
    grep -E "parts" "$tmp/test_gemm" "$tmp/test_rmsnorm" 2>/dev/null | grep -v "^PASS" | head -6
    grep -E "gemm (parts|tune).*(o=4096 i=14336|o=4096 i=4096)" "$tmp/bc_log" 2>/dev/null | grep -E "t=(32|64) " | cut -c1-220 | head -24
    for v in $vars; do
      echo "### $v: b32 / b64 step ms"
      for i in 1 2 3; do
        bc_steps "$v$i"
      done
    done
  } > "$table"
}
run test_rmsnorm 60 "$c/gpu/test_rmsnorm"
run test_gemm 150 "$c/gpu/test_gemm" --norm
run model_parts 120 env BT_GEMM_PARTS_O=2 BT_GEMM_PARTS_DOWN=4 "$c/gpu/test_cuda_model"
bc log BT_LOG=INFO BT_GEMM_PARTS_O=2 BT_GEMM_PARTS_DOWN=4 -- --batch 64 --ctx 2048 --prefill 0 --steps 3
report
for i in 1 2 3; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 32,64 --ctx 2048 --prefill 0; done
  report
done
cat "$table"
