#!/bin/bash
# run_gpu_round10a.sh [CARRY] - round 10 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the "tma" GEMV (warp-specialized persistent stream-K,
# TMA producer + two wgmma consumer warpgroups): test_gemm --variant tma
# (split and unsplit; call 1 ran the whole test_gemm into its 150 s
# timeout, every tma case it reached passing), bench_kernels --gemv at 8-128 tokens, bench_cuda
# at batch 1 / 8 / 64 with 2k context with and without tma
# (BT_GEMV_DISABLE=tma) and the tuner's picks.  Stops after test_gemm when
# it fails (a broken kernel would only burn device time).
# Prediction: qkv / o at 64 tokens 13-15 / 9-11 us isolated (cuBLASLt 21 /
# 17), batch 64 @2k -0.2 to -0.4 ms.
# Carry: gpu/{test_gemm,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r10a "${1:-build-r10a}"
run test_gemm 120 stdbuf -oL "$c/gpu/test_gemm" --variant tma
if grep -q "^FAIL" "$tmp/test_gemm" || ! grep -q "test_gemm rc=0" "$tmp/rcs"; then
  { echo "## round 10a: test_gemm failed"; cat "$tmp/rcs"; pass_fail test_gemm
    grep "tma" "$tmp/test_gemm" | grep -v "^PASS" | head -20; tail -5 "$tmp/test_gemm"; } > "$table"
  cat "$table"; exit 1
fi
run kern 150 "$c/gpu/bench_kernels" --gemv --toks 8,16,32,64,128
run kern_nosplit 100 env BT_TMA_SPLIT=0 "$c/gpu/bench_kernels" --gemv --toks 8,64
bc tma BT_LOG=INFO -- --batch 1,8,64 --ctx 2048 --prefill 0
bc notma BT_GEMV_DISABLE=tma -- --batch 1,8,64 --ctx 2048 --prefill 0
{
  echo "## round 10a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm
  grep -h "^INFO variant" "$tmp/test_gemm"
  grep -hE "^gemv(sum)? " "$tmp/kern"
  echo "BT_TMA_SPLIT=0:"; grep -hE "^gemv " "$tmp/kern_nosplit" | sed 's/mma1.*tc /tc /; s/| tuned.*//'
  bc_rows tma notma
  grep -h "gemm tune t=" "$tmp/bc_tma" | sed 's/.*gemm tune/tune/' | head -40
} > "$table"
cat "$table"
