#!/bin/bash
# run_gpu_pending.sh CARRY [engine|serve] - what the session of
# 2026-12-06 05:08 left for an H200 (its H100 figures are in
# docs/PERFORMANCE.md), ON THE DEVICE MACHINE from a folder packed here,
# two calls of ~5 minutes (engine, then serve, on the warm machine);
# delete this script once its figures are in docs/PERFORMANCE.md.
# Pack (repository root):
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode gpu_bench_cuda gpu_test_cuda_fp8
#   bash tests/gpu/pack_carry.sh pending tests/gpu/run_gpu_pending.sh \
#     bin/baton bin/baton-router bin/baton-prefill bin/baton-decode \
#     gpu/bench_cuda gpu/test_cuda_fp8 obj/quant_fp8.cu.o shared
#   mkdir -p .carry/pending && mv .carry/pending.tar.xz .carry/pending/
#   rm .carry/call.sh
#   run(carry=[".carry/pending"], command="tar xJf
#       .carry/pending/pending.tar.xz && bash tests/gpu/run_gpu_pending.sh
#       build-pending engine"), then the same with `serve`
# engine (each row's earlier H200 figure in brackets): sass_check and
#   test_cuda_fp8 (the row quantization's kernel refactored: 651/651 on
#   an H100), bench_cuda fp8 + FP8 KV batch 1 / 64 @2k, prefill 2048 /
#   8192 and 2048/128's mixed step with the widened prefill (f1cc4a0;
#   H100: prefill -4.1% / -12.0%) [b1 2.98, b64 7.05, prefill 2048
#   30.97 ms].
# serve (aggregated, closed loop): fp8 + FP8 KV 2048/128 @256 [3,106
#   tok/s, TPOT p99 50.8], bf16 2048/128 @256 [2,043, TPOT p99 51.0: the
#   budget's margin under load, fad941f, should bring it under 50], fp8 +
#   FP8 KV 2048/2048 @384 streams [10,103].
# Writes pending.md (the rows) under $OUT with each run's serve.md.
set -u
c=${1:-build-pending}
phase=${2:-engine}
out=${OUT:-/tmp/baton-pending}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared
export BT_GEMM_CACHE=/tmp/baton-pending-gemm.cache
md=$out/pending.md
echo "## pending measurements ($(date -u +%F\ %H:%M) UTC)" > "$md"
nvidia-smi --query-gpu=name,clocks.max.memory,power.limit --format=csv,noheader >> "$md"
if [ "$phase" = engine ]; then
  cob=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
  "$cob" -sass "$c/obj/quant_fp8.cu.o" > /tmp/q.sass 2>&1
  python3 tests/gpu/sass_check.py /tmp/q.sass > "$out/sass.txt" 2>&1
  echo "sass_check quant_fp8: rc $?" >> "$md"
  timeout -k 5 200 "$c/gpu/test_cuda_fp8" > "$out/fp8.txt" 2>&1
  { echo; echo "### test_cuda_fp8: rc $?," \
      "$(grep -c '^PASS' "$out/fp8.txt") PASS," \
      "$(grep -c '^FAIL' "$out/fp8.txt") FAIL"
    grep '^FAIL' "$out/fp8.txt" | head -5; } >> "$md"
  timeout -k 5 150 "$c/gpu/bench_cuda" \
    --model synth:llama3-8b --precision fp8 --kv-dtype fp8 --batch 1,64 \
    --ctx 2048 --prefill 2048,8192 --mixed 124:2048:1:1990:0 \
    --steps 20 > "$out/bench.txt" 2>&1
  { echo; echo "### bench_cuda fp8 + FP8 KV: rc $?"
    grep -E "^\| (decode|prefill|mixed)" "$out/bench.txt"; } >> "$md"
fi
# serve NAME SECONDS VAR=VALUE...: one serve_bench.py run, its rows
serve() {
  local name=$1 lim=$2
  shift 2
  [ "$lim" -lt 60 ] && { echo "$name: skipped ($lim s left)" >> "$md"; return; }
  env OUT="$out/$name" BT_SERVE_TIMEOUT="$lim" \
    BT_SERVE_DEADLINE_S=$(( lim - 10 )) BT_SERVE_MODES=agg \
    BT_SERVE_COLD=0 "$@" bash tests/gpu/run_gpu_serve.sh "$c" > /dev/null 2>&1
  local rc=$?
  { echo; echo "### $name: rc $rc, at $(( $(date +%s) - t0 )) s"
    grep "^| agg" "$out/$name/serve.md"
    grep -h "a step (" "$out/$name/serve.md" | cut -c1-300; } >> "$md"
  rm -f "$out/$name/serve_logs.tgz"
}
if [ "$phase" = serve ]; then
  serve fp8_short 150 BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_RUNS="2048x128@256:512"
  serve bf16_short 150 BT_SERVE_RUNS="2048x128@256:512"
  serve fp8_long $(left 580) BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_MAX_SEQS=384 BT_SERVE_RUNS="2048x2048@384:768"
fi
cat "$md"
