#!/bin/bash
# run_gpu_round8c.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: the wg GEMV with 256-row blocks (x's K slices read from L2
# half as often): test_gemm, bench_kernels --gemv at 8-128 tokens,
# bench_cuda at batch 1 / 8 / 64 with 2k context with and without wg
# (BT_GEMV_DISABLE=wg), bench-engine's chain of one at batch 32 / 64.
# (The 256-row blocks lost and were reverted to 128 rows; this script
# needs a build of that state to repeat the call.)
# Carry: bin/baton, gpu/{test_gemm,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8c "${1:-build-r8c}"
run test_gemm 200 "$c/gpu/test_gemm"
run kern 200 "$c/gpu/bench_kernels" --gemv --toks 8,32,64,128
bc wg BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
bc nowg BT_GEMV_DISABLE=wg -- --batch 1,8,64 --ctx 2048 --prefill 0
run chain1 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 32,64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 8c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm
  grep -h "^INFO variant" "$tmp/test_gemm" | tr '\n' ' '; echo
  grep -hE "^gemv(sum)? " "$tmp/kern" | sed 's/mma1.*mma2 [0-9.]* ([0-9.]*) //'
  bc_rows wg nowg
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
  grep -h "verify, plain" "$tmp/chain1"
} > "$table"
cat "$table"
