#!/bin/bash
# run_gpu_round8a.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: the "wg" GEMV (wgmma skinny GEMM, 1-128 tokens): test_gemm
# (every variant incl. wg on 65-128 tokens, split and unsplit),
# bench_kernels --gemv at 8-128 tokens (per shape and the per-step sums),
# bench_cuda at batch 1 / 8 / 64 with 2k context with and without wg
# (BT_GEMV_DISABLE=wg) and the tuner's picks, and bench-engine's chain of
# one at batch 64 (128-token verification).
# Carry: bin/baton, gpu/{test_gemm,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8a "${1:-build-r8a}"
run test_gemm 200 "$c/gpu/test_gemm"
run kern 200 "$c/gpu/bench_kernels" --gemv --toks 8,16,32,64,128
bc wg BT_LOG=INFO -- --batch 1,8,64 --ctx 2048 --prefill 0
bc nowg BT_GEMV_DISABLE=wg -- --batch 1,8,64 --ctx 2048 --prefill 0
run chain1 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 32,64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 8a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm
  grep -h "^INFO variant" "$tmp/test_gemm"
  grep -hE "^gemv(sum)? " "$tmp/kern"
  bc_rows wg nowg
  grep -h "gemm tune t=" "$tmp/bc_wg" | sed 's/.*gemm tune/tune/' | head -40
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
  grep -h "bench-engine: batch\|verify, plain" "$tmp/chain1"
} > "$table"
cat "$table"
