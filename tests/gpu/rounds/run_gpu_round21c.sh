#!/bin/bash
# run_gpu_round21c.sh [CARRY] - round 21 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4, the landing code: on one BT_GEMM_CACHE file (the same GEMM picks in every
# run) the TMA decode attention against the default at b64 @2k / @8k,
# three interleaved rounds, and a CUPTI trace of a b64 @2k step; then
# test_cuda_model (the whole model, golden f32) and `make gpu-bench`
# (kernels, the engine sweep, the PyTorch peer).
# Carry: gpu/test_attn gpu/test_gemm gpu/test_cuda_model gpu/bench_cuda
# gpu/libbt_kernel_trace.so, lib/, shared.
set -u
c=${1:-build-r21c}
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r21c "$c"
export BT_SHARED_DIR=$PWD/$c/shared
gc=$tmp/gc.txt
bc warm BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 0
for r in 1 2 3; do
  bc base_$r BT_GEMM_CACHE=$gc -- --batch 64 --ctx 2048,8192 --prefill 0
  bc tma_$r BT_GEMM_CACHE=$gc BT_ATTN_TMA=1 -- --batch 64 --ctx 2048,8192 --prefill 0
done
trace_step b64 bench_cuda BT_GEMM_CACHE=$gc -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{
  echo "## round 21c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  echo "b64 @2k, @8k: default: $(bc_steps base_1 base_2 base_3)"
  echo "b64 @2k, @8k: TMA:     $(bc_steps tma_1 tma_2 tma_3)"
  echo "### trace b64 @2k"; head -40 "$tmp/tl_b64"
} > "$table"
cat "$table"
(
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
  timeout 200 "$c/gpu/test_cuda_model" > "${OUT:-/tmp}/r21c_model.log" 2>&1
  echo "test_cuda_model rc=$? $(grep -c '^PASS' "${OUT:-/tmp}/r21c_model.log") PASS $(grep -c '^FAIL' "${OUT:-/tmp}/r21c_model.log") FAIL"
  grep -E '^(PASS|FAIL|INFO) (golden|bf16|synth)' "${OUT:-/tmp}/r21c_model.log" | cut -c1-160
  bash "$d/../run_gpu_bench.sh" "$c" | tail -60
)
