#!/bin/bash
# run_gpu_round22d.sh [CARRY] - round 22 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the landing tuner (lead + final round) under the GPU
# tests that tune: test_gemm (full run), test_cuda_model, test_spec_cuda;
# then BT_GEMM_LT_CANDS=8 against the default 4 now that candidates are
# timed in a graph (one cache file each, ABBA x2, b8..b128 @2k).
# Carry: gpu/test_gemm gpu/test_cuda_model gpu/test_spec_cuda
# gpu/bench_cuda, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r22d "${1:-build-r22d}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 22d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm test_cuda_model test_spec_cuda 2>/dev/null
    grep -E '^(PASS|FAIL) golden' "$tmp/test_cuda_model" 2>/dev/null
    echo "b8 b32 b64 b128 @2k"
    for v in c4 c8; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
  } > "$table"
}
run test_gemm 200 "$c/gpu/test_gemm"
run test_cuda_model 200 "$c/gpu/test_cuda_model"
run test_spec_cuda 120 "$c/gpu/test_spec_cuda"
report
bc warm_c4 BT_LOG=INFO BT_GEMM_CACHE=$tmp/c4.txt -- --batch 1 --ctx 512 --prefill 0
bc warm_c8 BT_LOG=INFO BT_GEMM_LT_CANDS=8 BT_GEMM_CACHE=$tmp/c8.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
n=0
for v in c4 c8 c8 c4 c4 c8 c8 c4; do
  n=$((n + 1)); k=$(( (n + 1) / 2 ))
  if [ $v = c8 ]; then e=BT_GEMM_LT_CANDS=8; else e=BT_X=1; fi
  bc ${v}_$k $e BT_GEMM_CACHE=$tmp/$v.txt -- $a
done
report
{
  for v in c4 c8; do
    echo "### picks $v"
    grep -o 'gemm tune t=\(8\|32\|64\|128\) .*' "$tmp/bc_warm_$v" | cut -c1-120
  done
} >> "$table"
cat "$table"
