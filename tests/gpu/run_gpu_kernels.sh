#!/bin/bash
# run_gpu_kernels.sh [BUILD_DIR] - issue 4 speed work (helper "gemv"), ON
# THE DEVICE MACHINE from a carried build (nothing is rebuilt):
#   1. test_gemm: worker_gemm + every GEMV variant against the CPU
#      reference (variants that fail are excluded from the autotuner
#      below through BT_GEMV_DISABLE); test_attn (prefill attention).
#   2. bench_kernels: every GEMV variant / cuBLASLt / autotuned at the
#      Llama-3-8B shapes x 1..128 tokens, prefill attention, small kernels.
#   3. bench_cuda (synth:llama3-8b, bf16): decode batch 1,64 x ctx
#      512,2048 and prefill 512,2048 with the autotuner; A/B rows at batch
#      1 with the RMSNorm-fused ring GEMV (BT_GEMV_NORM=1) and with the
#      round-2 defaults (BT_GEMM_TUNE=0 BT_PREFILL_KERNEL=mma0).
# Writes $OUT/gemv_kernels.log and $OUT/gemv_table.md; prints the table
# last.  About 3-4 minutes.  Carry one folder (stripped binaries + the
# libraries the device lacks), made here after building build-gemv:
#   cmake --build build-gemv -j2 --target gpu_bench_kernels gpu_bench_cuda \
#     test_gemm test_attn
#   rm -rf build-gemv-carry && mkdir -p build-gemv-carry/gpu && \
#   for b in test_gemm test_attn bench_kernels bench_cuda; do \
#     strip -o build-gemv-carry/gpu/$b build-gemv/gpu/$b; done && \
#   ../shared/tools/devlibs build-gemv-carry/lib build-gemv-carry/gpu/*
# then run(carry=["build-gemv-carry"], kind nvidia-h200,
#   command="bash tests/gpu/run_gpu_kernels.sh build-gemv-carry").
set -u
build=${1:-build-gemv-carry}
out=${OUT:-/tmp/baton-gpu-kernels}
mkdir -p "$out"
log=$out/gemv_kernels.log
table=$out/gemv_table.md
: > "$log"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$PWD/$build/lib:${LD_LIBRARY_PATH:-}
[ -d .devlibs ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$PWD/.devlibs
export BT_LOG=${BT_LOG:-INFO}
t_start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv >> "$log" 2>&1

echo "=== test_gemm" >> "$log"
timeout 150 "$build/gpu/test_gemm" > "$out/.tg" 2>&1
rc_gemm=$?
cat "$out/.tg" >> "$log"
disable=""
for v in rows rows8 stream ring bulk mma1 mma2; do
  if grep -q "^FAIL gemv $v " "$out/.tg"; then disable="$disable,$v"; fi
done
if [ $rc_gemm -ne 0 ] && ! grep -q "comparison(s) FAILED" "$out/.tg"; then
  # crashed or hung: drop the variant it was testing and bulk (mbarrier)
  last=$(grep -oE "^(PASS|FAIL) gemv [a-z0-9]+" "$out/.tg" | tail -1 | awk '{print $3}')
  disable="$disable,bulk${last:+,$last}"
fi
rm -f "$out/.tg"
disable=${disable#,}
echo "test_gemm rc=$rc_gemm; disabled variants: ${disable:-none}" >> "$log"
export BT_GEMV_DISABLE=$disable
if echo ",$disable," | grep -q ",ring,"; then norm_ok=0; else norm_ok=1; fi

echo "=== test_attn" >> "$log"
timeout 90 "$build/gpu/test_attn" >> "$log" 2>&1
rc_attn=$?

echo "=== bench_kernels" >> "$log"
timeout 170 "$build/gpu/bench_kernels" --reps 7 >> "$log" 2>&1
rc_bk=$?
echo "=== bench_kernels --attn, BT_PREFILL_KERNEL=mma0 (round-2 load order)" >> "$log"
BT_PREFILL_KERNEL=mma0 timeout 40 "$build/gpu/bench_kernels" --attn --reps 5 >> "$log" 2>&1

echo "=== bench_cuda (autotuned)" >> "$log"
timeout 170 "$build/gpu/bench_cuda" --model synth:llama3-8b --batch 1,64 \
  --ctx 512,2048 --prefill 512,2048 --table "$out/.t_tuned" >> "$log" 2>&1
rc_bc=$?
if [ $norm_ok -eq 1 ]; then
  echo "=== bench_cuda BT_GEMV_NORM=1 (RMSNorm fused into the ring GEMV)" >> "$log"
  BT_GEMV_NORM=1 timeout 90 "$build/gpu/bench_cuda" --model synth:llama3-8b \
    --batch 1 --ctx 512,2048 --prefill 2048 --table "$out/.t_norm" >> "$log" 2>&1
fi
echo "=== bench_cuda BT_GEMM_TUNE=0 BT_PREFILL_KERNEL=mma0 (round-2 defaults)" >> "$log"
BT_GEMM_TUNE=0 BT_PREFILL_KERNEL=mma0 timeout 90 "$build/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1 --ctx 512 --prefill 2048 --table "$out/.t_old" >> "$log" 2>&1

{
  echo "## gemv helper run $(date -u +%FT%TZ), $(( $(date +%s) - t_start )) s"
  echo "rc: test_gemm $rc_gemm, test_attn $rc_attn, bench_kernels $rc_bk, bench_cuda $rc_bc; disabled: ${disable:-none}"
  echo
  echo "| variant | PASS | FAIL |"
  echo "| --- | ---: | ---: |"
  for v in rows rows8 stream ring bulk mma1 mma2; do
    echo "| $v | $(grep -c "^PASS gemv $v " "$log") | $(grep -c "^FAIL gemv $v " "$log") |"
  done
  echo "| worker_gemm | $(grep -c '^PASS gemm' "$log") | $(grep -c '^FAIL gemm' "$log") |"
  echo "| gemv+rmsnorm | $(grep -c '^PASS gemv+rmsnorm' "$log") | $(grep -c '^FAIL gemv+rmsnorm' "$log") |"
  echo "| test_attn | $(sed -n '/^=== test_attn/,/^=== bench_kernels/p' "$log" | grep -c '^PASS') | $(sed -n '/^=== test_attn/,/^=== bench_kernels/p' "$log" | grep -c '^FAIL') |"
  echo
  echo "### GEMV per shape (us, TB/s of weights): best | tuned"
  grep -E '^gemv ' "$log" | sed -E 's/^gemv ([a-z_]+) +t= *([0-9]+) o=.*tuned=([a-z0-9]+) ([0-9.]+) \(([0-9.]+) TB\/s\) \| best=([a-zA-Z0-9]+) ([0-9.]+) us ([0-9.]+) TB\/s.*/\1 t=\2: best \6 \7 (\8) tuned \3 \4 (\5)/' | paste -sd'|' | sed 's/|/\n/g' | awk '{printf "%s%s", $0, (NR%4==0 ? "\n" : " ; ")} END {print ""}'
  echo
  grep -E '^gemvsum ' "$log"
  grep -E '^(attn |small )' "$log"
  grep -E 'gemm tune o=.*ms$' "$log" | sed 's/^.*gemm tune/tune/' | head -8
  echo
  echo "### bench_cuda, autotuned"
  cat "$out/.t_tuned" 2>/dev/null
  echo
  echo "### bench_cuda, BT_GEMV_NORM=1"
  cat "$out/.t_norm" 2>/dev/null
  echo
  echo "### bench_cuda, BT_GEMM_TUNE=0 (round-2 defaults)"
  cat "$out/.t_old" 2>/dev/null
} > "$table"
rm -f "$out/.t_tuned" "$out/.t_norm" "$out/.t_old"
echo
cat "$table"
