#!/bin/bash
# run_gpu_round8b.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: split K of the tc / wg GEMVs through thread-block clusters
# (partials reduced in distributed shared memory) against the global
# workspace (BT_TC_CLUSTER=0): test_gemm, bench_kernels --gemv at 8-128
# tokens both ways, bench_cuda at batch 1 / 8 / 64 with 2k context both
# ways, bench-engine's chain of one at batch 32 / 64.  (The cluster path
# lost and was removed; this script needs a build of that commit.)
# Carry: bin/baton, gpu/{test_gemm,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8b "${1:-build-r8b}"
run test_gemm 200 "$c/gpu/test_gemm"
run kern 200 "$c/gpu/bench_kernels" --gemv --toks 8,32,64,128
run kern0 200 env BT_TC_CLUSTER=0 "$c/gpu/bench_kernels" --gemv --toks 64,128
bc cl BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
bc gl BT_TC_CLUSTER=0 -- --batch 1,8,64 --ctx 2048 --prefill 0
run chain1 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 32,64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 8b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm
  grep -h "^INFO variant" "$tmp/test_gemm" | tr '\n' ' '; echo
  echo "### cluster"; grep -hE "^gemv(sum)? " "$tmp/kern" | sed 's/mma1.*mma2 [0-9.]* ([0-9.]*) //'
  echo "### global"; grep -hE "^gemv(sum)? " "$tmp/kern0" | sed 's/mma1.*mma2 [0-9.]* ([0-9.]*) //'
  bc_rows cl gl
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
  grep -h "verify, plain" "$tmp/chain1"
} > "$table"
cat "$table"
