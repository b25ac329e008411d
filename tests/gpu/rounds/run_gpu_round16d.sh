#!/bin/bash
# run_gpu_round16d.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the fused norm of the batch-1 rows GEMV keeping its
# x chunks in registers between the sum of squares and the scaling (one
# L2 round trip less from the PDL wait to the first product) against the
# two loads of before (BT_GEMV_NORM_REG=0).  (1) test_gemm --norm;
# (2) bench_cuda batch 1 at 512 / 2k / 8k, interleaved three times.
# Carry: gpu/{test_gemm,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16d "${1:-build-r16d}"
vars="def reg0"
envof() { case $1 in def) echo BT_X=1;; reg0) echo BT_GEMV_NORM_REG=0;; esac; }
report() {
  {
    echo "## round 16d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    for i in 1 2 3; do for v in $vars; do bc_cols $v$i; done; done
  } > "$table"
}
run test_gemm 200 "$c/gpu/test_gemm" --norm
report
for i in 1 2 3; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1 --ctx 512,2048,8192 --prefill 0; done
  report
done
cat "$table"
