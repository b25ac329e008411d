#!/bin/bash
# run_gpu_fp8_diag.sh [CARRY] - ON THE DEVICE MACHINE, <= ~4 minutes: why
# FP8 serving failed on the H200 (2026-12-05, every request right after
# the worker registered; issue 37), into ONE file ($OUT/summary.md; a
# device call returns at most 8 files).  Pack here (build-cuda first):
#   bash tests/gpu/pack_carry.sh c8 tests/gpu/run_gpu_fp8_diag.sh \
#     tests/worker_test_serve_shapes gpu/bench_cuda bin/baton \
#     bin/baton-router bin/baton-decode shared
# 1. test_serve_shapes (tests/worker/test_serve_shapes.c): the engine made
#    and warmed as `baton-decode --role both` makes it (fp8, FP8 KV sized
#    from memory, max-seqs 256, 8192 batch tokens, chunk 2048), then a
#    burst of 4 prompts of 2048 in one step, mixed steps of 2053, 8191
#    and 37 tokens (4 decode rows + a fresh prompt), a decode step, and
#    sequence 0 again with its blocks at the top of the pool, every
#    logits row against the sequence run alone.  Its STEP/PASS/FAIL lines
#    name the first step that fails and its error.  When it fails, the
#    same with bf16 KV (FP8 KV or the FP8 linears?), with FP8 KV in a
#    pool of 8192 blocks (the pool's size, i.e. 32-bit offsets?) and
#    without the warm-up (its tuning / graphs?);
# 2. one aggregated fp8 + FP8-KV worker serving 64 requests of 2048/128
#    (serve_bench.py), with the worker's KV / warm-up / memory lines, its
#    first ERROR/WARN/FATAL lines and its last lines;
# 3. bench_cuda --precision fp8 --kv-dtype fp8: decode b1/b64 @2k and a
#    prefill of 2053 tokens (not a multiple of 16).
set -u
c=${1:-build-c8}
out=${OUT:-/tmp/baton-fp8-diag}
mkdir -p "$out"
S=$out/summary.md
: > "$S"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared
export BT_LOG=WARN
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
left() { [ $(( $(date +%s) - T0 )) -lt "$1" ]; }
shapes() { # NAME LIMIT_S ARGS...
  local name=$1 lim=$2; shift 2
  el "test_serve_shapes $name: $*"
  timeout -k 5 "$lim" "$c/tests/worker_test_serve_shapes" --device cuda \
    --model synth:llama3-8b --precision fp8 --max-seqs 256 \
    --max-batch-tokens 8192 --chunk 2048 --prompt 2048 \
    --mixed 2053,8191,37 "$@" > "$out/t.log" 2>&1
  local rc=$?
  echo "rc $rc" >> "$S"
  grep -E "^(INFO|STEP|PASS|FAIL)" "$out/t.log" |
    grep -vE "^STEP (ref|high).*: ok \(" | cut -c1-400 | head -24 >> "$S"
  grep -E " (ERROR|FATAL) " "$out/t.log" | head -4 | cut -c1-400 >> "$S"
  [ $rc -ne 0 ] && tail -4 "$out/t.log" |
    grep -vE "^(INFO|STEP|PASS|FAIL)| (ERROR|FATAL) " | cut -c1-400 >> "$S"
  return $rc
}
# (time guards: the whole stays under ~4 minutes whatever fails)
if ! shapes "fp8, FP8 KV from memory" 120 --kv-dtype fp8 --kv-blocks 0; then
  left 120 && shapes "fp8, bf16 KV from memory" 60 --kv-dtype bf16 \
    --kv-blocks 0
  left 150 && shapes "fp8, FP8 KV, 8192 blocks" 50 --kv-dtype fp8 \
    --kv-blocks 8192
  left 170 && shapes "fp8, FP8 KV from memory, no warm-up" 40 \
    --kv-dtype fp8 --kv-blocks 0 --no-warmup
fi
if left 150; then
  lim=$(( 230 - ($(date +%s) - T0) ))
  el "serve fp8 + fp8 KV (agg, 64 requests, ${lim} s)"
  rm -rf /tmp/baton-fp8-diag-serve
  UCX_MODULE_DIR=$PWD/$c/lib/ucx BT_SERVE_MODES=agg BT_SERVE_PRECISION=fp8 \
    BT_SERVE_KV_DTYPE=fp8 BT_SERVE_COLD=0 BT_SERVE_RUNS="2048x128@64:64" \
    BT_SERVE_DEADLINE_S=$(( lim - 20 )) timeout -k 10 "$lim" \
    python3 tests/gpu/serve_bench.py "$PWD/$c/bin" /tmp/baton-fp8-diag-serve \
    "$out/s.md" > "$out/s.log" 2>&1
  grep -vE "^\|" "$out/s.log" | tail -8 | cut -c1-400 >> "$S"
  cat "$out/s.md" >> "$S" 2>/dev/null
  w=/tmp/baton-fp8-diag-serve/agg/d0.log
  if [ -f "$w" ]; then
    echo "worker d0:" >> "$S"
    grep -E "KV pool|warm-up done|after the warm-up|activations|weights:" \
      "$w" | head -6 | cut -c1-300 >> "$S"
    grep -E " (ERROR|FATAL|WARN) " "$w" | head -6 | cut -c1-400 >> "$S"
    echo "... last lines:" >> "$S"
    tail -6 "$w" | cut -c1-300 >> "$S"
  fi
else
  el "serve: skipped (time)"
fi
if left 210; then
  el "bench_cuda --precision fp8 --kv-dtype fp8 (prefill 2053)"
  timeout -k 5 40 "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1,64 \
    --ctx 2048 --prefill 2053 --precision fp8 --kv-dtype fp8 \
    --table "$out/b.md" > "$out/b.log" 2>&1
  echo "rc $?" >> "$S"
  cat "$out/b.md" >> "$S" 2>/dev/null
  grep -E "ERROR|FAIL|rror" "$out/b.log" | head -3 | cut -c1-300 >> "$S"
fi
el done
rm -f "$out/t.log" "$out/s.md" "$out/s.log" "$out/b.md" "$out/b.log"
cat "$S"
