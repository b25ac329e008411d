#!/bin/bash
# run_gpu_round8g.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: the code as it lands (wg GEMV as a tuner candidate, fa2wq as
# an option): test_gemm, test_attn, test_cuda_model (default and with
# BT_PREFILL_KERNEL=fa2wq), test_spec_cuda; bench_cuda defaults at batch
# 1 / 64 with 2k context and a 2048-token prefill; bench-engine's chain of
# one at batch 64.
# Carry: bin/baton, gpu/{test_gemm,test_attn,test_cuda_model,
# test_spec_cuda,bench_cuda}, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8g "${1:-build-r8g}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_gemm 200 "$c/gpu/test_gemm"
run test_attn 200 "$c/gpu/test_attn"
run test_cuda_model 200 "$c/gpu/test_cuda_model"
run test_model_wq 200 env BT_PREFILL_KERNEL=fa2wq "$c/gpu/test_cuda_model"
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
bc def BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
run chain1 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 8g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm test_attn test_cuda_model test_model_wq test_spec_cuda
  bc_rows def
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
  grep -h "verify, plain" "$tmp/chain1"
} > "$table"
cat "$table"
