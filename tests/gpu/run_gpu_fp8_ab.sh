#!/bin/bash
# run_gpu_fp8_ab.sh [CARRY] - ON THE DEVICE MACHINE: precision fp8's
# GEMV before (gpu/X_b, AB_FROM) and after (gpu/X), one call:
#   AB_FROM=DIR bash tests/gpu/pack_carry.sh fp8ab tests/gpu/run_gpu_fp8_ab.sh \
#     gpu/test_cuda_fp8 gpu/bench_cuda gpu/test_cuda_model \
#     gpu/test_gemm gpu/libbt_kernel_trace.so shared
# 1. test_cuda_fp8 after (checks + INFO timings) and before (timings);
# 2. test_cuda_model --fp8 and test_gemm (bf16 GEMVs share the ring) after;
# 3. bench_cuda --precision fp8 b1/b8/b64 @2k + prefill 2048, after and
#    before interleaved, and bf16 once;
# 4. one fp8 b1 step under the CUPTI tracer, by kernel (step_timeline.py).
set -u
c=${1:-build-fp8ab}
out=${OUT:-/tmp/baton-fp8ab}
mkdir -p "$out"
log=$out/fp8ab.log
: > "$log"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
if [ -d "$c/shared/models" ]; then export BT_SHARED_DIR=$PWD/$c/shared
else export BT_SHARED_DIR=$(cd .. && pwd)/shared; fi
export BT_LOG=${BT_LOG:-WARN}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> "$log" 2>&1
step() { echo "=== $*" >> "$log"; timeout -k 5 "$@" >> "$log" 2>&1 || echo "rc $?: $*" >> "$log"; }
step 240 $c/gpu/test_cuda_fp8
echo "=== before: test_cuda_fp8_b timings" >> "$log"
timeout -k 5 240 $c/gpu/test_cuda_fp8_b 2>&1 | grep -E "INFO fp8 time" | sed 's/^/BEFORE /' >> "$log"
step 200 $c/gpu/test_cuda_model --fp8
step 200 $c/gpu/test_gemm
B="--model synth:llama3-8b --batch 1,8,64 --ctx 2048 --prefill 2048"
step 200 $c/gpu/bench_cuda $B --precision fp8 --table "$out/fp8_after.md"
step 200 $c/gpu/bench_cuda_b $B --precision fp8 --table "$out/fp8_before.md"
step 200 $c/gpu/bench_cuda $B --precision fp8 --table "$out/fp8_after2.md"
step 200 $c/gpu/bench_cuda --model synth:llama3-8b --batch 1,64 --ctx 2048 --prefill 2048 --table "$out/bf16.md"
echo "=== trace fp8 b1" >> "$log"
CUDA_INJECTION64_PATH=$PWD/$c/gpu/libbt_kernel_trace.so BT_TRACE_OUT=$out/trace_b1.csv \
  timeout -k 5 200 $c/gpu/bench_cuda --model synth:llama3-8b --batch 1 --ctx 2048 --prefill 0 \
  --precision fp8 --steps 20 >> "$log" 2>&1 || echo "rc $?: trace" >> "$log"
python3 tests/gpu/step_timeline.py "$out/trace_b1.csv" > "$out/timeline_b1.txt" 2>&1
CUDA_INJECTION64_PATH=$PWD/$c/gpu/libbt_kernel_trace.so BT_TRACE_OUT=$out/trace_b64.csv \
  timeout -k 5 200 $c/gpu/bench_cuda --model synth:llama3-8b --batch 64 --ctx 2048 --prefill 0 \
  --precision fp8 --steps 20 >> "$log" 2>&1 || echo "rc $?: trace64" >> "$log"
python3 tests/gpu/step_timeline.py "$out/trace_b64.csv" > "$out/timeline_b64.txt" 2>&1
rm -f "$out"/trace_*.csv
{ grep -E "^(FAIL|PASS fp8 (gemv|cublaslt) 8b|PASS fp8 top-1)|^rc |INFO fp8 time|^BEFORE|^FAIL|test_gemm" "$log"
  for f in fp8_after fp8_before fp8_after2 bf16; do echo "## $f"; cat "$out/$f.md" 2>/dev/null; done
  echo "## timeline b1"; cat "$out/timeline_b1.txt"; echo "## timeline b64"; cat "$out/timeline_b64.txt"; } > "$out/summary.md"
tail -c 11000 "$out/summary.md"
