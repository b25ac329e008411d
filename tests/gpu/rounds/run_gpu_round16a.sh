#!/bin/bash
# run_gpu_round16a.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) test_attn on the prefill-kind table of ff46152;
# (2) test_gemm --norm, now with the fused MLP (cuda_gemv_mlp: gate|up,
# SwiGLU and down in one persistent kernel with a grid barrier); (3)
# bench_cuda batch 1 and 2 at 512 / 2k / 8k with the fused MLP (default)
# and without (BT_GEMV_MLP=0), then L2 prefetch of the down rows before
# the barrier (BT_GEMV_MLP_PF_B=8 KB a warp), interleaved twice; (4) a
# CUPTI trace of one batch-1 step @2k each way.
# Carry: gpu/{test_attn,test_gemm,bench_cuda,libbt_kernel_trace.so}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16a "${1:-build-r16a}"
vars="def off pfb"
envof() { case $1 in def) echo BT_X=1;; off) echo BT_GEMV_MLP=0;; pfb) echo BT_GEMV_MLP_PF_B=8;; esac; }
report() {
  {
    echo "## round 16a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_gemm 2>/dev/null
    grep -E "gemv mlp" "$tmp/test_gemm" 2>/dev/null | head -20
    for i in 1 2; do for v in $vars; do bc_cols $v$i; done; done
    for v in def off; do echo "### trace $v"; head -60 "$tmp/tl_tl$v" 2>/dev/null; done
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
run test_gemm 200 "$c/gpu/test_gemm" --norm
report
if grep -q "^FAIL gemv mlp" "$tmp/test_gemm" || ! grep -q "^PASS gemv mlp" "$tmp/test_gemm"; then
  echo "fused MLP failed its test: no benchmark" >> "$log"; cat "$table"; exit 0
fi
for i in 1 2; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1,2 --ctx 512,2048,8192 --prefill 0; done
  report
done
trace_step tldef bench_cuda -- --batch 1 --ctx 2048 --prefill 0 --steps 5
trace_step tloff bench_cuda BT_GEMV_MLP=0 -- --batch 1 --ctx 2048 --prefill 0 --steps 5
report
cat "$table"
