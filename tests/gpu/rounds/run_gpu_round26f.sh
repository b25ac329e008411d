#!/bin/bash
# run_gpu_round26f.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the landing code of the prefill producer (a warp,
# entries read after the wait, whole-tile runs, descriptors prefetched):
# test_attn, test_cuda_model, test_spec_cuda, test_gemm's tma variant
# (its descriptor prefetch moved to wgmma.cuh); bench_kernels --attn
# against round 26d's binary (X_b) and --attn-runs; then the target rows
# twice (b1 / b64 @2k, prefill 512 / 2048 / 8192).
# Carry: the four tests, gpu/bench_kernels(_b), gpu/bench_cuda, lib/,
# shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26f "${1:-build-r26f}"
export BT_SHARED_DIR=$PWD/$c/shared
run attn 200 "$c/gpu/test_attn"
run model 150 "$c/gpu/test_cuda_model"
run spec 200 "$c/gpu/test_spec_cuda"
run gemm 150 "$c/gpu/test_gemm" --variant tma
run k_new1 60 "$c/gpu/bench_kernels" --attn
run k_old 60 "$c/gpu/bench_kernels_b" --attn
run k_new2 60 "$c/gpu/bench_kernels" --attn
run k_runs 60 "$c/gpu/bench_kernels" --attn-runs
for i in 1 2; do
  bc t$i BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 512,2048,8192
done
{
  echo "## round 26f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn model spec gemm
  for f in k_new1 k_old k_new2 k_runs; do echo "### $f"; grep -h "^attn prefill.*\(default\|fa2pp)\)" "$tmp/$f"; done
  bc_rows t1 t2
  head -1 "$log"
} > "$table"
cat "$table"
