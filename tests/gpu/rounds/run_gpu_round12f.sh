#!/bin/bash
# run_gpu_round12f.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the landed code of round 12 (aeea84f: RoPE fused into
# the decode attention, SwiGLU into the 1-2 token gate/up GEMV, pair at 1
# token and warp at 2 by default), the session's closing figures.
#   - test_cuda_model, test_spec_cuda, test_gemm --norm at the defaults;
#   - the target rows (batch 1 / 2 / 8 / 64 @2k, prefill 512 / 2048 /
#     8192) against HEAD a268679 (*_b), landed code twice;
#   - where a 1- and a 2-token step go: BT_PROFILE_SKIP=qkv / o / gu /
#     down / attn (differences; the 2-token step is slower than the
#     8-token one in every build).
# Carry: gpu/{test_gemm,test_cuda_model,test_spec_cuda,bench_cuda},
# gpu/bench_cuda_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12f "${1:-build-r12f}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
run test_gemm 120 stdbuf -oL "$c/gpu/test_gemm" --norm
smi_start
bc d BT_X=1 -- --batch 1,2,8,64 --ctx 2048 --prefill 512,2048,8192
run bc_b 120 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b" --batch 1,2,8,64 --ctx 2048 --prefill 512,2048,8192
bc d2 BT_X=1 -- --batch 1,2,8,64 --ctx 2048 --prefill 2048
for op in qkv o gu down attn; do
  bc s_$op BT_PROFILE_SKIP=$op -- --batch 1,2 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 12f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_model test_spec test_gemm
  bc_rows d b d2 s_qkv s_o s_gu s_down s_attn
  smi_summary
} > "$table"
cat "$table"
