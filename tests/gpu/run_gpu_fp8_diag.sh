#!/bin/bash
# run_gpu_fp8_diag.sh [CARRY] - ON THE DEVICE MACHINE, <= ~5 minutes: the
# FP8 serving failure (issue 37) into ONE file ($OUT/summary.md; a device
# call returns at most 8 files).  What is known (H200, 2026-12-05): a
# burst of 4 x 2048 in one step and blocks at the pool's top are exact,
# but the first mixed step (4 decode rows + a 2049-token prompt, 2053
# tokens) gives wrong decode rows with FP8 or bf16 KV, any pool size,
# with or without the warm-up: precision fp8's linears at that token
# count.  Serving fp8 + FP8 KV also hit "an illegal instruction".
# Pack here (build-cuda first; the _pad binary is branch s7-fp8pad's
# test_serve_shapes, the candidate fix, copied into build-cuda/tests/):
#   bash tests/gpu/pack_carry.sh c8 tests/gpu/run_gpu_fp8_diag.sh \
#     tests/worker_test_serve_shapes [tests/worker_test_serve_shapes_pad] \
#     gpu/test_cuda_fp8 gpu/bench_cuda bin/baton bin/baton-router \
#     bin/baton-decode shared
#   run(carry=[".carry"], command="bash .carry/call.sh")
# 1. test_serve_shapes --keep-going (tests/worker/test_serve_shapes.c) on
#    the 8B at many mixed-step token counts: fp8 with bf16 KV, the same
#    with the _pad binary when carried, bf16 as the control;
# 2. test_cuda_fp8: the cuBLASLt FP8 paths at 9 .. 8191 tokens against
#    the cpu reference (the vec path's FAIL lines name the bad counts);
# 3. an aggregated fp8 + FP8-KV worker serving 32 requests with
#    CUDA_LAUNCH_BLOCKING=1 BT_CUDA_GRAPHS=0: its first ERROR lines name
#    the launch that hit the illegal instruction;
# 4. bench_cuda --precision fp8 --kv-dtype fp8: b1/b64 @2k, prefill 2053.
set -u
c=${1:-build-c8}
out=${OUT:-/tmp/baton-fp8-diag}
mkdir -p "$out"
S=$out/summary.md
: > "$S"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$PWD/$c/lib/ucx
export BT_SHARED_DIR=$PWD/$c/shared
export BT_LOG=WARN
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
MIX=2053,2052,2056,2064,2049,2080,1029,101,37,8191,4100
shapes() { # NAME BINARY_SUFFIX ARGS...
  local name=$1 suf=$2; shift 2
  [ -x "$c/tests/worker_test_serve_shapes$suf" ] || return 0
  el "test_serve_shapes$suf $name: $*"
  timeout -k 5 60 "$c/tests/worker_test_serve_shapes$suf" --device cuda \
    --model synth:llama3-8b --max-seqs 256 --max-batch-tokens 8192 \
    --chunk 2048 --prompt 2048 --kv-blocks 8192 --keep-going \
    --mixed $MIX "$@" > "$out/t.log" 2>&1
  echo "rc $?" >> "$S"
  grep -E "^(PASS|FAIL)" "$out/t.log" | cut -c1-200 | head -40 >> "$S"
  grep -E " (ERROR|FATAL) " "$out/t.log" | head -3 | cut -c1-300 >> "$S"
}
shapes "fp8, bf16 KV" "" --precision fp8 --kv-dtype bf16
shapes "fp8, bf16 KV (s7-fp8pad)" _pad --precision fp8 --kv-dtype bf16
shapes "bf16 control" "" --precision bf16 --kv-dtype bf16
el "test_cuda_fp8"
timeout -k 5 90 "$c/gpu/test_cuda_fp8" > "$out/f.log" 2>&1
echo "rc $? ($(grep -c '^PASS' "$out/f.log") PASS)" >> "$S"
grep -E "^FAIL" "$out/f.log" | head -12 | cut -c1-200 >> "$S"
grep -E "cublaslt.* (2053|4100|8191)" "$out/f.log" | head -16 |
  cut -c1-200 >> "$S"
el "serve fp8 + fp8 KV, CUDA_LAUNCH_BLOCKING=1 BT_CUDA_GRAPHS=0"
rm -rf /tmp/baton-fp8-diag-serve
CUDA_LAUNCH_BLOCKING=1 BT_CUDA_GRAPHS=0 BT_SERVE_MODES=agg \
  BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 BT_SERVE_COLD=0 \
  BT_SERVE_RUNS="2048x64@32:32" BT_SERVE_DEADLINE_S=80 timeout -k 10 95 \
  python3 tests/gpu/serve_bench.py "$PWD/$c/bin" /tmp/baton-fp8-diag-serve \
  "$out/s.md" > "$out/s.log" 2>&1
echo "rc $?" >> "$S"
grep -E "^\| agg" "$out/s.md" >> "$S" 2>/dev/null
w=/tmp/baton-fp8-diag-serve/agg/d0.log
[ -f "$w" ] && grep -E " (ERROR|FATAL) " "$w" | head -6 | cut -c1-400 >> "$S"
el "bench_cuda --precision fp8 --kv-dtype fp8 (prefill 2053)"
timeout -k 5 40 "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1,64 \
  --ctx 2048 --prefill 2053 --precision fp8 --kv-dtype fp8 \
  --table "$out/b.md" > "$out/b.log" 2>&1
echo "rc $?" >> "$S"
cat "$out/b.md" >> "$S" 2>/dev/null
el done
rm -f "$out/t.log" "$out/f.log" "$out/s.md" "$out/s.log" "$out/b.md" \
  "$out/b.log"
cat "$S"
