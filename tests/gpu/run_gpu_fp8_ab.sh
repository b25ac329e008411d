#!/bin/bash
# run_gpu_fp8_ab.sh [CARRY] - ON THE DEVICE MACHINE: the FP8 GEMV's
# workbench variants (BT_GF8=ring-int|ring-f2fp|ring-mix|reg), one call:
#   bash tests/gpu/pack_carry.sh fp8ab tests/gpu/run_gpu_fp8_ab.sh \
#     gpu/test_cuda_fp8 gpu/bench_cuda gpu/test_cuda_model shared
# For each variant: test_cuda_fp8 (checks + INFO timings), bench_cuda
# --precision fp8 decode b1/b8/b64 @2k; then test_cuda_model --fp8.
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
for v in ring-int ring-f2fp ring-mix reg; do
  echo "=== variant $v" >> "$log"
  BT_GF8=$v timeout -k 5 150 $c/gpu/test_cuda_fp8 > "$out/t_$v.log" 2>&1 || echo "rc $?: test $v" >> "$log"
  grep -E "^FAIL" "$out/t_$v.log" | head -5 | sed "s/^/$v /" >> "$log"
  echo "$v: $(grep -c '^PASS' "$out/t_$v.log") PASS $(grep -c '^FAIL' "$out/t_$v.log") FAIL" >> "$log"
  grep -E "INFO fp8 time gemv" "$out/t_$v.log" | sed -e "s/^/$v /" -e 's/per-channel weights, //' >> "$log"
  BT_GF8=$v timeout -k 5 150 $c/gpu/bench_cuda --model synth:llama3-8b --batch 1,8,64 --ctx 2048 \
    --prefill 0 --precision fp8 --table "$out/b_$v.md" > /dev/null 2>> "$log" || echo "rc $?: bench $v" >> "$log"
  grep -E "^\| decode" "$out/b_$v.md" | sed "s/^/$v /" >> "$log"
done
grep -E "INFO fp8 time (cublaslt|quant)" "$out/t_ring-int.log" | head -20 >> "$log"
echo "=== test_cuda_model --fp8 (ring-int)" >> "$log"
timeout -k 5 200 $c/gpu/test_cuda_model --fp8 2>&1 | grep -E "^(PASS|FAIL)" | sed -e 's/top-1 agreement with the cpu.s fp8 mode, //' >> "$log"
cat "$log"
