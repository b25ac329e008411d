#!/bin/bash
# run_gpu_round12d.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: SwiGLU fused into the rows GEMV's output at 1-2
# tokens (cuda_gemv_norm_glu: gate row j and up row hid + j in one warp,
# the norm in, silu(g) * u out; one kernel a layer less), on top of the
# fused RoPE of 12c.
#   - test_gemm --norm (the fused-norm cases and the new GLU ones: against
#     the CPU references and bit for bit against cuda_gemv_norm +
#     cuda_swiglu), test_cuda_model, test_spec_cuda;
#   - the engine: HEAD a268679 (*_b), default, BT_GEMV_GLU=0, interleaved
#     twice at batch 1 / 2 / 8 / 64 @2k (prefill 2048 once).
# Prediction: batch 1 and 2 -0.04..-0.07 ms (round 6: SwiGLU ~0.07 ms a
# batch-1 step); batch 8 / 64 unchanged.
# Carry: gpu/{test_gemm,test_cuda_model,test_spec_cuda,bench_cuda},
# gpu/bench_cuda_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12d "${1:-build-r12d}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_gemm 120 stdbuf -oL "$c/gpu/test_gemm" --norm
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,2,8,64 --ctx 2048 --prefill 0
  if [ $i = 1 ]; then pf=2048; else pf=0; fi
  bc p$i BT_X=1 -- --batch 1,2,8,64 --ctx 2048 --prefill $pf
  bc g$i BT_GEMV_GLU=0 -- --batch 1,2,8,64 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 12d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm test_model test_spec
  grep -h "swiglu" "$tmp/test_gemm" | grep -c "^PASS" | sed 's/^/glu PASS lines: /'
  tail -1 "$tmp/test_gemm"
  bc_rows b1 p1 g1 b2 p2 g2
  smi_summary
} > "$table"
cat "$table"
