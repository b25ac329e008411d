#!/bin/bash
# run_gpu_round18b.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) test_gemm --norm (the even-rows cases,
# BT_GEMV_EVEN=1) and test_cuda_model with the even rows and with the
# attention triggering after its last product (BT_ATTN_TC_TRIG=product);
# (2) three interleaved A/B rounds at b1 / b2 @512 / 2k / 8k: base, even,
# trig, even+trig; (3) b64 @2k and the 2048-token prefill, base and even.
# Carry: gpu/{test_gemm,test_cuda_model,bench_cuda}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18b "${1:-build-r18b}"
export BT_SHARED_DIR=$PWD/$c/shared
vars="base even trig both"
envof() {
  case $1 in
    base) echo BT_X=1;;
    even) echo BT_GEMV_EVEN=1;;
    trig) echo BT_ATTN_TC_TRIG=product;;
    both) echo BT_GEMV_EVEN=1 BT_ATTN_TC_TRIG=product;;
  esac
}
report() {
  {
    echo "## round 18b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm model_even model_trig 2>/dev/null
    for v in $vars; do
      echo "### $v: b1@512 b2@512 b1@2k b2@2k b1@8k b2@8k step ms"
      for i in 1 2 3; do
        bc_steps "$v$i"
      done
    done
    bc_rows pfbase pfeven
  } > "$table"
}
run test_gemm 150 "$c/gpu/test_gemm" --norm
run model_even 120 env BT_GEMV_EVEN=1 "$c/gpu/test_cuda_model"
run model_trig 120 env BT_ATTN_TC_TRIG=product "$c/gpu/test_cuda_model"
report
for i in 1 2 3; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1,2 --ctx 512,2048,8192 --prefill 0; done
  report
done
bc pfbase BT_X=1 -- --batch 64 --ctx 2048 --prefill 2048
bc pfeven BT_GEMV_EVEN=1 -- --batch 64 --ctx 2048 --prefill 2048
report
cat "$table"
