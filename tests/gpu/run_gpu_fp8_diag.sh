#!/bin/bash
# run_gpu_fp8_diag.sh [CARRY] - ON THE DEVICE MACHINE, ~3 minutes: why FP8
# serving failed on the H200 (2026-12-05, every request) and the merged
# binaries' FP8 rows, into ONE file ($OUT/summary.md; a device call
# returns at most 8 files).  Pack here:
#   bash tests/gpu/pack_carry.sh c8 tests/gpu/run_gpu_fp8_diag.sh \
#     gpu/test_cuda_kv8 gpu/bench_cuda bin/baton bin/baton-router \
#     bin/baton-decode shared
# 1. `baton run` of synth:llama3-8b in fp8 with fp8 KV, then bf16 KV
#    (a failing request's error is the stderr tail);
# 2. bench_cuda --precision fp8 [--kv-dtype fp8], decode b1/b8/b64 @2k
#    and prefill 2048;
# 3. one aggregated fp8 + fp8-KV worker serving 64 requests of 2048/128
#    (serve_bench.py logs a failure's codes, first message and the
#    worker's first ERROR/WARN lines);
# 4. test_cuda_kv8's counts and FAIL lines.
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
for kv in fp8 bf16; do
  el "baton run 8B fp8, kv $kv"
  timeout -k 5 40 "$c/bin/baton" run --device cuda --model synth:llama3-8b \
    --precision fp8 --kv-dtype $kv --ids --max-tokens 8 \
    --prompt-ids "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20" \
    > "$out/r.txt" 2> "$out/r.err"
  echo "rc $?: $(head -c 200 "$out/r.txt") | $(tail -6 "$out/r.err" | tr '\n' ' ' | cut -c1-900)" >> "$S"
done
for a in "--precision fp8 --kv-dtype fp8" "--precision fp8"; do
  el "bench_cuda $a"
  timeout -k 5 70 "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1,8,64 \
    --ctx 2048 --prefill 2048 $a --table "$out/t.md" > "$out/b.log" 2>&1
  echo "rc $?" >> "$S"
  cat "$out/t.md" >> "$S" 2>/dev/null
  grep -E "ERROR|FAIL|rror" "$out/b.log" | head -3 >> "$S"
  rm -f "$out/t.md"
done
el "serve fp8 + fp8 KV (agg, 64 requests)"
UCX_MODULE_DIR=$PWD/$c/lib/ucx BT_SERVE_MODES=agg BT_SERVE_PRECISION=fp8 \
  BT_SERVE_KV_DTYPE=fp8 BT_SERVE_COLD=0 BT_SERVE_RUNS="2048x128@64:64" \
  BT_SERVE_DEADLINE_S=100 timeout -k 10 120 python3 tests/gpu/serve_bench.py \
  "$PWD/$c/bin" /tmp/baton-fp8-diag-serve "$out/s.md" > "$out/s.log" 2>&1
grep -vE "^\|" "$out/s.log" | tail -12 >> "$S"
cat "$out/s.md" >> "$S" 2>/dev/null
el "test_cuda_kv8"
timeout -k 5 60 "$c/gpu/test_cuda_kv8" > "$out/kv8.log" 2>&1
echo "rc $? $(grep -c '^PASS' "$out/kv8.log") PASS $(grep -c '^FAIL' "$out/kv8.log") FAIL" >> "$S"
grep -E "^FAIL" "$out/kv8.log" | head -8 | cut -c1-200 >> "$S"
el done
rm -f "$out/r.txt" "$out/r.err" "$out/kv8.log" "$out/b.log" "$out/s.md" \
  "$out/s.log"
cat "$S"
