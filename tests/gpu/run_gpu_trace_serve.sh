#!/bin/bash
# run_gpu_trace_serve.sh CARRY - where a serving step's time goes against
# bench_cuda --mixed's step of the same tokens (H100 fp8 + FP8 KV
# 2048/128: 38.6 vs 36.0 ms): both under the CUPTI tracer
# (gpu/libbt_kernel_trace.so in the carry), the bench's mixed forward by
# step_timeline.py, the serving worker's steps by serve_steps.py
# (PERFORMANCE.md "A serving step runs the bench's kernels"); ~3 min.
# Pack (repository root):
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode gpu_bench_cuda bt_kernel_trace
#   bash tests/gpu/pack_carry.sh trace tests/gpu/run_gpu_trace_serve.sh \
#     bin/baton bin/baton-router bin/baton-prefill bin/baton-decode \
#     gpu/bench_cuda gpu/libbt_kernel_trace.so
#   run(carry=[".carry"], command="bash .carry/call.sh")
set -u
c=${1:-build-trace}
out=${OUT:-/tmp/baton-trace-serve}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_GEMM_CACHE=/tmp/baton-trace-gemm.cache
md=$out/trace.md
nvidia-smi --query-gpu=name,clocks.max.memory,power.limit --format=csv,noheader > "$md"
inj=$PWD/$c/gpu/libbt_kernel_trace.so
timeout -k 5 150 env CUDA_INJECTION64_PATH="$inj" BT_TRACE_OUT=/tmp/tb.csv \
  "$c/gpu/bench_cuda" --model synth:llama3-8b --precision fp8 --kv-dtype fp8 \
  --batch 1 --ctx 2048 --prefill 0 --mixed 124:2048:1:1920:0 --steps 5 \
  > "$out/bench.txt" 2>&1
{ echo "### bench rc $?"; grep "^| mixed" "$out/bench.txt"
  python3 tests/gpu/step_timeline.py /tmp/tb.csv embed_kernel 19 | head -40; } >> "$md"
t=$(( 560 - SECONDS ))
env CUDA_INJECTION64_PATH="$inj" BT_TRACE_OUT=/tmp/ts.csv OUT="$out/serve" \
  BT_SERVE_TIMEOUT=$t BT_SERVE_DEADLINE_S=$(( t - 15 )) BT_SERVE_MODES=agg \
  BT_SERVE_COLD=0 BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
  BT_SERVE_RUNS="2048x128@256:512" bash tests/gpu/run_gpu_serve.sh "$c" > /dev/null 2>&1
{ echo; echo "### serve rc $? (trace $(du -m /tmp/ts.csv | cut -f1) MB)"
  grep "^| agg" "$out/serve/serve.md"; grep -h "a step (" "$out/serve/serve.md" | cut -c1-600
  python3 tests/gpu/serve_steps.py /tmp/ts.csv; } >> "$md"
rm -f "$out/serve/serve_logs.tgz"
cat "$md"
