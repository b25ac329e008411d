#!/bin/bash
# run_gpu_round8d.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: FA2 prefill attention with S = Q K^T on wgmma
# (BT_PREFILL_KERNEL=fa2wq) against the default fa2: test_attn (every
# prefill variant incl. fa2wq), test_cuda_model with fa2wq, test_gemm
# (wg back at 128-row blocks), bench_kernels --attn both ways, bench_cuda
# prefill 2048 / 8192 both ways (twice each).
# Carry: gpu/{test_attn,test_cuda_model,test_gemm,bench_kernels,bench_cuda},
# lib/, shared/models.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8d "${1:-build-r8d}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 200 "$c/gpu/test_attn"
run test_model 200 env BT_PREFILL_KERNEL=fa2wq "$c/gpu/test_cuda_model"
run test_gemm 200 "$c/gpu/test_gemm"
run kattn 120 "$c/gpu/bench_kernels" --attn
run kattnwq 120 env BT_PREFILL_KERNEL=fa2wq "$c/gpu/bench_kernels" --attn
bc f2a BT_X=1 -- --batch 1 --ctx 256 --prefill 2048,8192
bc wqa BT_PREFILL_KERNEL=fa2wq -- --batch 1 --ctx 256 --prefill 2048,8192
bc f2b BT_X=1 -- --batch 1 --ctx 256 --prefill 2048,8192
bc wqb BT_PREFILL_KERNEL=fa2wq -- --batch 1 --ctx 256 --prefill 2048,8192
{
  echo "## round 8d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model test_gemm
  grep -h "agree\|top-1\|exact" "$tmp/test_model" | head -8
  grep -h "^attn " "$tmp/kattn" "$tmp/kattnwq"
  bc_rows f2a wqa f2b wqb
} > "$table"
cat "$table"
