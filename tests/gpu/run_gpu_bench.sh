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
# The machine's identity: H200s of one kind differ by ~2% in decode speed
# (PERFORMANCE.md round 22), and these fields are where to look for why.
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit,vbios_version,ecc.mode.current,pci.bus_id \
  --format=csv >> "$log" 2>&1
echo "=== kernels" >> "$log"
timeout 120 "$build/gpu/test_attn" --bench 2>&1 | grep -E '^(decode|prefill|bench)' >> "$log"
timeout 120 "$build/gpu/test_gemm" --bench 2>&1 | grep -E '^(gemm |bench)' >> "$log"
echo "=== engine" >> "$log"
# Power and SM clock over the sweep: the prefill rows run at the board's
# power cap with the clock well below boost (docs/PERFORMANCE.md round
# 18 §6), so every table says what clock it was measured at.
nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 100 > "$out/smi_engine.csv" 2>/dev/null &
smi_pid=$!
timeout 240 "$build/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1,8,32,64,128 --ctx 512,2048,8192 --prefill 512,2048,8192 \
  --table "$out/baton_table.md" >> "$log" 2>&1 || echo "bench_cuda rc $?" >> "$log"
kill "$smi_pid" 2>/dev/null
smi_line=$(awk -F', *' '$2 + 0 > 0 {p += $1; c += $2; n++;
    if (min == "" || $2 + 0 < min) min = $2 + 0;
    if ($3 ~ /[4567cdefCDEF]$/) cap++} # bit 0x4: SW power cap
  END {if (n) printf "power and SM clock over the engine sweep (nvidia-smi every 100 ms): mean %.0f W, mean SM clock %.0f MHz (min %d), %d of %d samples at the power cap (throttle reason 0x4)", p / n, c / n, min, cap, n}' \
  "$out/smi_engine.csv")
echo "$smi_line" >> "$log"
echo "=== torch" >> "$log"
PYTHONUNBUFFERED=1 timeout -k 10 150 python3 tests/gpu/torch_bench.py \
  --table "$out/torch_table.md" >> "$log" 2>&1 || echo "torch_bench rc $?" >> "$log"
{
  echo "## baton (CUDA backend), synth:llama3-8b bf16, H200"
  cat "$out/baton_table.md" 2>/dev/null
  echo
  echo "$smi_line"
  echo
  echo "## PyTorch + transformers (bf16, sdpa, static cache), same shapes"
  cat "$out/torch_table.md" 2>/dev/null
  echo
  echo "## kernels"
  grep -E '^(decode attn|prefill attn|gemm )' "$log"
} > "$table"
echo
cat "$table"
