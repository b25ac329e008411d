#!/bin/bash
# run_gpu_bench.sh BUILD_DIR - `make gpu-bench`, ON THE DEVICE MACHINE
# from a build made elsewhere: kernel benchmarks (attention, GEMM), the
# engine sweep (bench_cuda: decode batch x ctx and prefill against the
# floor) and the same shapes through PyTorch + transformers.  Writes
# gpu_bench.log and gpu_bench_table.md under $OUT when set; prints the
# table last.  BT_BENCH_QUICK=1 runs a reduced sweep.
set -u
build=${1:-build-cuda}
out=${OUT:-/tmp/baton-gpu-bench}
mkdir -p "$out"
log=$out/gpu_bench.log
table=$out/gpu_bench_table.md
: > "$log"
[ -d .devlibs ] && export LD_LIBRARY_PATH=$PWD/.devlibs:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv >> "$log" 2>&1
echo "=== kernels" >> "$log"
timeout 120 "$build/gpu/test_attn" --bench 2>&1 | grep -E '^(decode|prefill|bench)' >> "$log"
timeout 120 "$build/gpu/test_gemm" --bench 2>&1 | grep -E '^(gemm |bench)' >> "$log"
echo "=== engine" >> "$log"
timeout 240 "$build/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1,8,32,64,128 --ctx 512,2048,8192 --prefill 512,2048,8192 \
  --table "$out/baton_table.md" >> "$log" 2>&1 || echo "bench_cuda rc $?" >> "$log"
echo "=== torch" >> "$log"
PYTHONUNBUFFERED=1 timeout 150 python3 tests/gpu/torch_bench.py \
  --table "$out/torch_table.md" >> "$log" 2>&1 || echo "torch_bench rc $?" >> "$log"
{
  echo "## baton (CUDA backend), synth:llama3-8b bf16, H200"
  cat "$out/baton_table.md" 2>/dev/null
  echo
  echo "## PyTorch + transformers (bf16, sdpa, static cache), same shapes"
  cat "$out/torch_table.md" 2>/dev/null
  echo
  echo "## kernels"
  grep -E '^(decode attn|prefill attn|gemm )' "$log"
} > "$table"
echo
cat "$table"
