#!/bin/bash
# run_gpu_static.sh CARRY - ON THE DEVICE MACHINE: the FP8 GEMMs with a
# static input scale as cuBLASLt's scalar (gemm_int.h GEMM_FP8_SC_STATIC)
# against the per-token vector: test_cuda_fp8 --paths (the static plan
# checked against the cpu reference, timed beside vec), the workbench's
# scale modes at 2048 tokens, the engine (bench_cuda fp8 + FP8 KV,
# prefill 2048, b64 and two mixed steps) per token (A) and with
# BT_FP8_INPUT_SCALE (B), then serving 2048/128 @256 B and A.  Pack:
#   cmake --build build-cuda -j2 --target gpu_bench_cuda \
#     gpu_test_cuda_fp8 gpu_bench_fp8_lt baton baton-router baton-prefill \
#     baton-decode
#   bash tests/gpu/pack_carry.sh st tests/gpu/run_gpu_static.sh \
#     gpu/bench_cuda gpu/test_cuda_fp8 gpu/bench_fp8_lt bin/baton \
#     bin/baton-router bin/baton-prefill bin/baton-decode
#   run(carry=[".carry/st.tar.xz", ".carry/call.sh"],
#       command="bash .carry/call.sh")
set -u
c=${1:-build-st}
out=${OUT:-/tmp/baton-static}
mkdir -p "$out"
t0=$(date +%s)
at() { echo $(( $(date +%s) - t0 )); }
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_GEMM_CACHE=/tmp/baton-static-gemm.cache
S=0.015625 # 1/64: the synthetic inputs' absmax ~5 inside E4M3's range
nvidia-smi --query-gpu=name,clocks.max.memory --format=csv,noheader
timeout -k 5 120 "$c/gpu/test_cuda_fp8" --paths > "$out/paths.txt" 2>&1
echo "test_cuda_fp8 --paths: rc $?, $(grep -c ^PASS "$out/paths.txt") PASS, $(grep -c ^FAIL "$out/paths.txt") FAIL (at $(at) s)"
grep "^FAIL\|INFO fp8 gemm 2048" "$out/paths.txt" | head -20
grep "cublaslt-static" "$out/paths.txt" | head -8
timeout -k 5 90 "$c/gpu/bench_fp8_lt" --prefill > "$out/lt.txt" 2>&1
grep BEST "$out/lt.txt"
eng() { # eng NAME [VAR=VALUE]: one bench_cuda run, its rows
  local n=$1; shift
  timeout -k 5 150 env "$@" "$c/gpu/bench_cuda" --model synth:llama3-8b \
    --precision fp8 --kv-dtype fp8 --batch 64 --ctx 2048 --prefill 2048 \
    --mixed 124:2048:1:1990:0,256:3072:1:256:1024 --steps 20 \
    > "$out/eng_$n.txt" 2>&1
  echo "== $n (rc $?, at $(at) s)"
  grep -E "^\| (decode|prefill|mixed)" "$out/eng_$n.txt" | grep -v "| batch \|tokens |\|decode rows"
}
eng A1 X=1
eng B1 BT_FP8_INPUT_SCALE=$S
serve() { # serve NAME SECONDS [VAR=VALUE]
  local n=$1 lim=$2; shift 2
  [ "$lim" -lt 70 ] && { echo "$n: skipped"; return; }
  env OUT="$out/$n" BT_SERVE_TIMEOUT=$lim BT_SERVE_DEADLINE_S=$(( lim - 10 )) \
    BT_SERVE_MODES=agg BT_SERVE_COLD=0 BT_SERVE_PRECISION=fp8 \
    BT_SERVE_KV_DTYPE=fp8 BT_SERVE_RUNS="2048x128@256:512" "$@" \
    bash tests/gpu/run_gpu_serve.sh "$c" > /dev/null 2>&1
  echo "== serve $n (rc $?, at $(at) s)"
  grep -h "^| agg" "$out/$n/serve.md"; grep -h "a step (" "$out/$n/serve.md" | cut -c1-240
  rm -f "$out/$n/serve_logs.tgz"
}
serve sB $(( 560 - $(at) < 140 ? 560 - $(at) : 140 )) BT_FP8_INPUT_SCALE=$S
serve sA $(( 580 - $(at) )) X=1
exit 0
