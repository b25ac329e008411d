#!/bin/bash
# run_gpu_sample.sh [CARRY_DIR] - sampling on the GPU (issue 4:
# backend_forward_sample), ON THE DEVICE MACHINE (one GPU is enough; any
# kind).  About 1.5 minutes:
#   1. kernels: cuda_argmax / cuda_sample_top vs the CPU reference, odd
#      vocabularies, ties, NaN  (test_sample)
#   1b. whole-distribution sampling (cuda_sample_dist) vs its reference
#      and the host sampler's contract, end to end through cuda_sampling,
#      then its device time for 1/8/64 rows of 128,256 (test_sample_dist)
#   2. device sampling = the full-logits path: 12 streams (greedy, top-p,
#      top-k+top-p, min-p, top-k 1, plain temperature, top-k alone,
#      penalties) x 150 steps on aidreams260K and stories260K, bf16 and
#      f32; a mixed prefill/decode step; rows without a sampler
#      (test_cuda_sample; prints how rows were sampled)
#   3. baton run --device cuda (engine: device sampling) = the same with
#      BT_HOST_SAMPLE=1 (full logits to the host, host sampler): greedy
#      and seeded top-p / min-p, both models
#   4. bench_cuda synth:llama3-8b, batch 1 and 64 at context 2048: step
#      (logits stay on the device) / +logits (f32 rows to the host) /
#      +sample (greedy on the device, ids to the host) / +top-p (T 0.8,
#      top-p 0.95: 256 candidates per row to the host)
#
# Prepare here (CUDA build; the device lacks ZeroMQ/protobuf-c/UCX):
#   cmake -S . -B build-devsample -DCMAKE_CUDA_ARCHITECTURES=90a -DBT_WERROR=ON
#   cmake --build build-devsample -j2 --target baton test_sample \
#     gpu_test_cuda_sample gpu_test_sample_dist gpu_bench_cuda
#   C=build-devsample-carry; rm -rf $C; mkdir -p $C/bin $C/shared/models
#   strip -o $C/bin/baton build-devsample/bin/baton
#   for t in test_sample test_cuda_sample test_sample_dist bench_cuda; do
#     strip -o $C/bin/$t build-devsample/gpu/$t; done
#   cp -r ../shared/models/{aidreams260K.bin,stories260K.bin} $C/shared/models/
#   ../shared/tools/devlibs $C/devlibs $C/bin/*
#   (cd $C && tar czf bin.tgz bin && rm -rf bin)     # 66 MB -> 25 MB
# then run(carry=["build-devsample-carry"],
#          command="bash tests/gpu/run_gpu_sample.sh build-devsample-carry").
# $OUT (default /tmp/baton-gpu-sample) gets gpu_sample.log (everything)
# and gpu_sample_table.md (the table, also printed last).
set -u
carry=${1:-build-devsample-carry}
out=${OUT:-/tmp/baton-gpu-sample}
mkdir -p "$out"
log=$out/gpu_sample.log
table=$out/gpu_sample_table.md
bin=$PWD/$carry/bin
if [ ! -x "$bin/baton" ] && [ -f "$carry/bin.tgz" ]; then
  tmp=$(mktemp -d)
  tar xzf "$carry/bin.tgz" -C "$tmp" && bin=$tmp/bin
fi
: > "$log"
export LD_LIBRARY_PATH=$PWD/$carry/devlibs:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=${BT_SHARED_DIR:-$PWD/$carry/shared}
models=$BT_SHARED_DIR/models
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv \
  >> "$log" 2>&1
rows=""
fails=0
step() { # step NAME TIMEOUT CMD... : runs, logs, records rc
  local name=$1 t=$2 rc start
  shift 2
  echo "=== $name: $*" >> "$log"
  start=$(date +%s)
  timeout "$t" "$@" >> "$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then res=PASS; else res="FAIL (rc $rc)"; fails=$((fails+1)); fi
  rows="$rows| $name | $res | $(( $(date +%s) - start )) |\n"
}

step kernels 60 "$bin/test_sample"
step dist 120 "$bin/test_sample_dist"
step dist-bench 60 "$bin/test_sample_dist" --bench
step streams 120 "$bin/test_cuda_sample" 150

# baton run: device sampling (default) vs BT_HOST_SAMPLE=1
cli_cmp() { # NAME MODEL ARGS...
  local name=$1 model=$2 a b
  shift 2
  # (the exact paths: BT_SAMPLE_DIST=0, see test_cuda_sample.c)
  a=$(BT_SAMPLE_DIST=0 timeout 60 "$bin/baton" run --model "$models/$model" --device cuda \
      --prompt-ids "1 300 45 12" --ids --max-tokens 200 --ignore-eos "$@" \
      2>>"$log")
  b=$(BT_HOST_SAMPLE=1 timeout 60 "$bin/baton" run --model "$models/$model" \
      --device cuda --prompt-ids "1 300 45 12" --ids --max-tokens 200 \
      --ignore-eos "$@" 2>>"$log")
  echo "=== cli $name $model $*: device: $a" >> "$log"
  echo "=== cli $name $model $*: host:   $b" >> "$log"
  if [ -n "$a" ] && [ "$a" = "$b" ]; then res=PASS
  else res=FAIL; fails=$((fails+1)); fi
  rows="$rows| baton run $name $model | $res | |\n"
}
for m in aidreams260K.bin stories260K.bin; do
  cli_cmp greedy $m
  cli_cmp top-p $m --temperature 0.8 --top-p 0.9 --seed 11
  cli_cmp min-p $m --temperature 1.0 --min-p 0.05 --seed 12
  cli_cmp top-k+p $m --temperature 1.0 --top-k 50 --top-p 0.95 --seed 13
done

step bench 150 "$bin/bench_cuda" --model synth:llama3-8b --batch 1,64 \
  --ctx 2048 --prefill 512 --steps 20 --table "$out/bench.md"
cat "$out/bench.md" >> "$log" 2>/dev/null
{
  echo "| check | result | seconds |"
  echo "| --- | --- | ---: |"
  printf "$rows"
  echo
  grep -E '^(PASS|FAIL) (aidreams|stories|test_cuda_sample|sample_top rows=64|kernel vocab|end to end|test_sample_dist)' "$log"
  grep -E '^bench sample_dist' "$log"
  echo
  grep -E '^\| (decode|---)' "$out/bench.md" 2>/dev/null | head -4
  echo
  echo "failures: $fails"
} > "$table"
rm -f "$out/bench.md"
cat "$table"
exit $((fails > 0))
