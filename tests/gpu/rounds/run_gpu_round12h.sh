#!/bin/bash
# run_gpu_round12h.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the session's last code: RMSNorm (and SwiGLU) fused
# into the rows GEMV at 1 token only (BT_GEMV_NORM_TOK, default 1): call
# 8 measured the 2-token step at 4.772 ms unfused against 5.02 fused.
#   - test_cuda_model, test_spec_cuda at the defaults;
#   - the engine: HEAD a268679 (*_b), default twice, BT_GEMV_NORM_TOK=2
#     (the fused 2-token path), batch 1 / 2 / 8 / 64 @2k.
# Prediction: batch 2 ~4.77 ms, the rest as in call 8.
# Carry: gpu/{test_cuda_model,test_spec_cuda,bench_cuda},
# gpu/bench_cuda_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12h "${1:-build-r12h}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
smi_start
run bc_b 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b" --batch 1,2,8,64 --ctx 2048 --prefill 0
bc d1 BT_X=1 -- --batch 1,2,8,64 --ctx 2048 --prefill 0
bc t2 BT_GEMV_NORM_TOK=2 -- --batch 1,2,8,64 --ctx 2048 --prefill 0
bc d2 BT_X=1 -- --batch 1,2,8,64 --ctx 2048 --prefill 0
smi_stop
{
  echo "## round 12h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_model test_spec
  bc_rows b d1 t2 d2
  smi_summary
} > "$table"
cat "$table"
