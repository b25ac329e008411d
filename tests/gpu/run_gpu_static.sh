#!/bin/bash
# run_gpu_static.sh CARRY - ON THE DEVICE MACHINE: the FP8 GEMMs with a
# static input scale as cuBLASLt's scalar (gemm_int.h GEMM_FP8_SC_STATIC)
# against the per-token vector: the workbench's scale modes at 2048 /
# 512 tokens, test_cuda_fp8 --paths (the static plan checked against the
# cpu reference, timed beside vec), then the engine (bench_cuda fp8 +
# FP8 KV, prefill 2048, b64 and two mixed steps) per token (A) and with
# --fp8-static (B), A B B A as time allows.  Pack:
#   cmake --build build-cuda -j2 --target gpu_bench_cuda gpu_test_cuda_fp8 gpu_bench_fp8_lt
#   bash tests/gpu/pack_carry.sh st tests/gpu/run_gpu_static.sh \
#     gpu/bench_cuda gpu/test_cuda_fp8 gpu/bench_fp8_lt
#   run(carry=[".carry"], command="bash .carry/call.sh")
set -u
c=${1:-build-st}
out=${OUT:-/tmp/baton-static}
mkdir -p "$out"
t0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_GEMM_CACHE=/tmp/baton-static-gemm.cache
nvidia-smi --query-gpu=name,clocks.max.memory --format=csv,noheader
timeout -k 5 150 "$c/gpu/bench_fp8_lt" --prefill > "$out/lt.txt" 2>&1
grep BEST "$out/lt.txt"
timeout -k 5 150 "$c/gpu/test_cuda_fp8" --paths > "$out/paths.txt" 2>&1
echo "test_cuda_fp8 --paths: rc $?, $(grep -c ^PASS "$out/paths.txt") PASS, $(grep -c ^FAIL "$out/paths.txt") FAIL"
grep "^FAIL\|static\|INFO fp8 gemm 2048" "$out/paths.txt" | grep -v "^PASS fp8 input" | head -30
eng() { # eng NAME [ARGS]: one bench_cuda run, its rows
  local n=$1; shift
  timeout -k 5 200 "$c/gpu/bench_cuda" --model synth:llama3-8b --precision fp8 \
    --kv-dtype fp8 --batch 64 --ctx 2048 --prefill 2048 \
    --mixed 124:2048:1:1990:0,256:3072:1:256:1024 --steps 20 "$@" \
    > "$out/eng_$n.txt" 2>&1
  echo "== $n (rc $?, at $(( $(date +%s) - t0 )) s)"
  grep -E "^\| (decode|prefill|mixed)" "$out/eng_$n.txt" | grep -v "| batch \|tokens |\|decode rows"
}
eng A1
eng B1 --fp8-static 0.015625
[ $(( $(date +%s) - t0 )) -lt 380 ] && eng B2 --fp8-static 0.015625
[ $(( $(date +%s) - t0 )) -lt 470 ] && eng A2
exit 0
