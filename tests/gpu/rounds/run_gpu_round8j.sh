#!/bin/bash
# run_gpu_round8j.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: the RMSNorm fused into the rows GEMV for 3-8 tokens at widths
# <= 1024 (the tiny models' 5-token verification) and the rows variants
# up to 8 tokens in the tuner: test_gemm, test_cuda_model,
# test_spec_cuda, `baton eagle bench` on aidreams260K at batch 1 (chain of
# 4 three times, adaptive once), bench_cuda synth:llama3-8b batch 1 / 8
# @2k (the wide shapes must not change).
# Carry: bin/baton, gpu/{test_gemm,test_cuda_model,test_spec_cuda,
# bench_cuda}, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8j "${1:-build-r8j}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SPEC_HEADS
run test_gemm 200 "$c/gpu/test_gemm"
run test_cuda_model 200 "$c/gpu/test_cuda_model"
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
for r in 1 2 3; do
  run "chain$r" 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
done
run adapt1 60 "$c/bin/baton" eagle bench $T
bc b18 BT_X=1 -- --batch 1,8 --ctx 2048 --prefill 0
{
  echo "## round 8j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm test_cuda_model test_spec_cuda
  for f in chain1 chain2 chain3 adapt1; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f")"
  done
  bc_rows b18
} > "$table"
cat "$table"
# Result (call 10, 15:19): all tests PASS (test_gemm 690), but the fused
# 5-token verification got slower (GPU 139 vs 115 us a pass; chain of 4
# 1.35-1.49x vs 1.62-1.77x) and batch 8 @2k 5.443 ms vs 5.24-5.38: the
# rows kernel at 5-8 tokens is slower than the norm kernel + tc/wg
# GEMV.  Reverted; this script needs a build of that state.
