#!/bin/bash
# run_gpu_fp8.sh [CARRY] - precision fp8 on the cuda backend (issue 37),
# ON THE DEVICE MACHINE, from a folder packed here (nothing is rebuilt):
#   bash tests/gpu/pack_carry.sh gpufp8 tests/gpu/run_gpu_fp8.sh \
#     gpu/test_cuda_fp8 gpu/test_cuda_kv8 gpu/test_cuda_model gpu/bench_cuda \
#     bin/baton shared
#   then run(carry=[".carry"], command="bash .carry/call.sh")
#   1. test_cuda_fp8: the kernels against the cpu's FP8 reference
#      (weight and input quantization bit for bit, the GEMV and cuBLASLt
#      products vs cpu__fp8_gemm_ref: relative error < 5e-2) on 8B and
#      tiny shapes, with INFO timings;
#   2. test_cuda_model --fp8: whole models vs the cpu's fp8 mode
#      (teacher-forced top-1, golden sequences) and FP8 checkpoints;
#   2a. test_cuda_kv8: the FP8 KV cache's kernels (rope_kv's codes bit
#      for bit, decode attention over codes vs a dequantized reference)
#      and test_cuda_model --kv-fp8: whole models, cuda --kv-dtype fp8 vs
#      the cpu's --kv-dtype fp8 (teacher-forced top-1);
#   2b. with bin/baton carried: `baton run --precision fp8` greedy on
#      stories260K, cuda vs cpu (INFO: greedy continuations may part
#      where the top two logits are within the backends' difference);
#   3. bench_cuda on synth:llama3-8b, decode batch 1 and 64 at 2k and
#      prefill 2048: --precision fp8 rows against the FP8 floor, then the
#      same rows in bf16 (one machine, for the ratio), then bf16 with
#      --kv-dtype fp8 (rows "kv8"); BT_FP8_BENCH picks among fp8kv8
#      (fp8 with fp8 KV), fp8, bf16 and kv8 (default all four);
#      BT_FP8_TEST_TIMEOUT (300) bounds each test program in seconds.
# About 6 minutes.  Writes gpu_fp8.log and gpu_fp8_table.md under $OUT
# (else /tmp/baton-gpu-fp8); prints the table last; exits non-zero when
# a test fails.
set -u
c=${1:-build-gpufp8}
out=${OUT:-/tmp/baton-gpu-fp8}
mkdir -p "$out"
log=$out/gpu_fp8.log
table=$out/gpu_fp8_table.md
: > "$log"
[ -d "$c/lib" ] && export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
if [ -z "${BT_SHARED_DIR:-}" ]; then
  if [ -d "$c/shared/models" ]; then export BT_SHARED_DIR=$PWD/$c/shared
  else export BT_SHARED_DIR=$(cd .. && pwd)/shared; fi
fi
export BT_LOG=${BT_LOG:-WARN}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv >> "$log" 2>&1
fails=0
for t in "test_cuda_fp8" "test_cuda_model --fp8" "test_cuda_kv8" \
         "test_cuda_model --kv-fp8"; do
  echo "=== $t" >> "$log"
  timeout -k 5 "${BT_FP8_TEST_TIMEOUT:-300}" $c/gpu/$t >> "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { echo "rc $rc: $t" >> "$log"; fails=$((fails + 1)); }
done
if [ -x "$c/bin/baton" ]; then
  echo "=== baton run --precision fp8" >> "$log"
  ids="1 429 491 433 295 429 444 445 265 262 263 342 430" # golden.jsonl
  for d in cuda cpu; do
    timeout 60 "$c/bin/baton" run --model "$BT_SHARED_DIR/models/stories260K.bin" \
      --prompt-ids "$ids" --max-tokens 48 --ids --device $d --precision fp8 \
      > "$out/run_$d.txt" 2>> "$log" ||
      { echo "rc $?: baton run --device $d" >> "$log"; fails=$((fails + 1)); }
  done
  if cmp -s "$out/run_cuda.txt" "$out/run_cpu.txt"; then
    echo "INFO fp8 baton run: cuda and cpu greedy ids identical ($(wc -w < "$out/run_cuda.txt") ids)" >> "$log"
  else
    echo "INFO fp8 baton run: cuda and cpu greedy ids differ: cuda [$(cat "$out/run_cuda.txt")] cpu [$(cat "$out/run_cpu.txt")]" >> "$log"
  fi
fi
for p in ${BT_FP8_BENCH:-fp8kv8 fp8 bf16 kv8}; do
  a="--precision $p"
  [ $p = kv8 ] && a="--precision bf16 --kv-dtype fp8"
  [ $p = fp8kv8 ] && a="--precision fp8 --kv-dtype fp8"
  echo "=== bench_cuda $a" >> "$log"
  timeout -k 5 240 "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1,8,64 \
    --ctx 2048 --prefill 2048 $a \
    --table "$out/bench_$p.md" >> "$log" 2>&1 ||
    echo "bench_cuda $a rc $?" >> "$log"
done
{
  echo "## precision fp8 checks ($(grep -c '^PASS' "$log") PASS, $(grep -c '^FAIL' "$log") FAIL, $fails failed programs)"
  grep -E '^(FAIL|PASS fp8 (gemv|cublaslt[-a-z]*) 8b|PASS fp8 top-1|PASS fp8 checkpoint|PASS kv fp8 top-1|PASS kv8 pool|INFO fp8 (time|baton|gemm))|^rc ' "$log"
  echo
  echo "## bench_cuda synth:llama3-8b: fp8 with fp8 KV, fp8, bf16, bf16 with fp8 KV"
  cat "$out/bench_fp8kv8.md" "$out/bench_fp8.md" "$out/bench_bf16.md" \
      "$out/bench_kv8.md" 2>/dev/null
  grep -E 'bench_cuda .* rc' "$log"
} > "$table"
echo
cat "$table"
[ $fails -eq 0 ]
