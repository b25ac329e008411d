#!/bin/bash
# run_gpu_round10d.sh [CARRY] - round 10 (2026-12-01; prepared, not yet
# run: the device was not lent again that session), ON THE DEVICE
# MACHINE, issue 4: fa2wqv, the FA2 prefill kernel with both S = Q K^T
# and O += P V on wgmma (P from registers, V N-major).  test_attn (every
# prefill kernel, fa2wqv last), test_cuda_model with
# BT_PREFILL_KERNEL=fa2wqv (golden f32 path is not affected; bf16
# agreement is), bench_kernels --attn default vs fa2wqv, and the 2048-
# token prefill default vs fa2wqv, power sampled; then the prefill with
# each of cuBLASLt's first four candidates forced for the prefill GEMMs
# (BT_GEMM_BIG_PICK=i): does the fastest-in-isolation pick stay the
# fastest at the power cap?
# Prediction: attention 183 -> 130-160 us a layer at 2048 tokens (the
# mma.sync P V and its ldmatrix.trans were half a warp's issue), prefill
# 2048 -0.7 to -1.7 ms.
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda}, lib/,
# shared/ (models).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r10d "${1:-build-r10d}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 240 stdbuf -oL "$c/gpu/test_attn"
run test_model_wqv 240 env BT_PREFILL_KERNEL=fa2wqv stdbuf -oL "$c/gpu/test_cuda_model"
run attn_def 100 "$c/gpu/bench_kernels" --attn
run attn_wqv 100 env BT_PREFILL_KERNEL=fa2wqv "$c/gpu/bench_kernels" --attn
smi_start
bc def BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
bc wqv BT_PREFILL_KERNEL=fa2wqv -- --batch 1 --ctx 512 --prefill 2048
bc def2 BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
bc wqv2 BT_PREFILL_KERNEL=fa2wqv -- --batch 1 --ctx 512 --prefill 2048
for i in 0 1 2 3; do
  bc pick$i BT_GEMM_BIG_PICK=$i BT_LOG=INFO -- --batch 1 --ctx 512 --prefill 2048
done
smi_stop
{
  echo "## round 10d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model_wqv
  grep -h "fa2wqv" "$tmp/test_attn" | grep -v "^PASS" | head -10
  grep -h "^attn\|prefill attn" "$tmp/attn_def" "$tmp/attn_wqv"
  bc_rows def wqv def2 wqv2 pick0 pick1 pick2 pick3
  grep -h "gemm tune t=2048" "$tmp/bc_pick0" | sed 's/.*gemm tune/tune/' | head -8
  smi_summary
} > "$table"
cat "$table"
