#!/bin/bash
# run_gpu_round12c.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: RoPE and the new key's K/V write fused into the
# tensor-core decode attention kernel on single-token unmasked steps (one
# kernel a layer less: rope_kv.cu no longer runs in decode graphs).
#   - test_attn (run_rope_case: output and both whole caches against
#     rope_kv_ref + attn_ref, 1 split / planner / 64-key splits, d_q
#     poisoned), test_cuda_model (the synthetic GQA-4 model's bf16 decode
#     steps through it), test_spec_cuda (tree steps unfused, graphs keyed
#     on it);
#   - the engine: HEAD a268679 (*_b), fused (default), BT_ATTN_ROPE=0,
#     interleaved twice at batch 1 / 8 / 64 / 128 @2k.
# Prediction: BT_PROFILE_SKIP=rope measured RoPE at ~0.07 ms a batch-1
# step (round 6); fused -0.05..-0.08 ms at batch 1 and 64.
# Carry: gpu/{test_attn,test_cuda_model,test_spec_cuda,bench_cuda},
# gpu/bench_cuda_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12c "${1:-build-r12c}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 150 stdbuf -oL "$c/gpu/test_attn"
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,8,64,128 --ctx 2048 --prefill 0
  bc p$i BT_X=1 -- --batch 1,8,64,128 --ctx 2048 --prefill 0
  bc r$i BT_ATTN_ROPE=0 -- --batch 1,8,64,128 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 12c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model test_spec
  grep -h "decode+rope" "$tmp/test_attn" | grep -c "^PASS" | sed 's/^/decode+rope PASS lines: /'
  grep -h "decode+rope" "$tmp/test_attn" | grep -v "^PASS" | head -5
  tail -1 "$tmp/test_attn"
  bc_rows b1 p1 r1 b2 p2 r2
  smi_summary
} > "$table"
cat "$table"
