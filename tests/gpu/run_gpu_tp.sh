#!/bin/bash
# run_gpu_tp.sh [CARRY_DIR] - tensor parallelism of the cuda backend
# (issue 8), ON A DEVICE MACHINE WITH 2 GPUs (kind nvidia-h200-x2; never
# in CI).  About 2-3 minutes:
#   1. f32 TP=2 greedy = TP=1 = golden.jsonl on every golden line (.bin and
#      -hf), mixed batches with hidden rows, device-generated synth weights
#      = host generator, KV copies on every rank  (test_cuda_tp check)
#   2. synth:llama3-8b bf16 teacher-forced top-1 TP=2 vs TP=1 >= 99%
#   3. decode step time at batch 1 and 64, context 2048: llama3-8b TP 1
#      and 2 (all-reduce auto = the peer-memory kernel at these sizes,
#      nccl, none = no reduction, for its cost),
#      llama3-70b TP 2, each against the floor (weights/tp + KV/tp per GPU
#      at 4.5 TB/s)  (test_cuda_tp bench)
#   4. all-reduce latency per call, NCCL vs the peer-memory kernel, at the
#      decode sizes  (test_cuda_tp arbench)
#   5. the CLI: baton run --tp 2 = --tp 1 (f32, aidreams), baton
#      bench-engine --tp 2 (floor column)
# NCCL comes from PyTorch's pip package (nvidia/nccl/lib/libnccl.so.2,
# found through python; never carried: 218 MB); NCCL_NVLS_ENABLE=0.
#
# Prepare here (CUDA build; the device lacks ZeroMQ/protobuf-c/UCX):
#   cmake -S . -B build-tp -DCMAKE_CUDA_ARCHITECTURES=90a -DBT_WERROR=ON
#   cmake --build build-tp -j2 --target baton gpu_test_cuda_tp
#   C=build-tp-carry; rm -rf $C; mkdir -p $C/bin $C/shared/models
#   strip -o $C/bin/baton build-tp/bin/baton
#   strip -o $C/bin/test_cuda_tp build-tp/gpu/test_cuda_tp
#   cp -r ../shared/models/{aidreams260K.bin,aidreams-tok512.bin,\
#   stories260K.bin,aidreams260K-hf,stories260K-hf,golden.jsonl} \
#      $C/shared/models/
#   ../shared/tools/devlibs $C/devlibs $C/bin/*
# then run(kind="nvidia-h200-x2", carry=["build-tp-carry"],
#          command="bash tests/gpu/run_gpu_tp.sh build-tp-carry").
# $OUT (default /tmp/baton-gpu-tp) gets gpu_tp.log (everything) and
# gpu_tp_table.md (the table, also printed last).
set -u
carry=${1:-build-tp-carry}
out=${OUT:-/tmp/baton-gpu-tp}
mkdir -p "$out"
log=$out/gpu_tp.log
table=$out/gpu_tp_table.md
bin=$PWD/$carry/bin
: > "$log"
export LD_LIBRARY_PATH=$PWD/$carry/devlibs:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=${BT_SHARED_DIR:-$PWD/$carry/shared}
export NCCL_NVLS_ENABLE=0
models=$BT_SHARED_DIR/models

# NCCL from torch's pip package: site-packages/nvidia/nccl/lib
nccl_dir=$(python3 -c 'import nvidia.nccl as m, os
p = getattr(m, "__file__", None)
print(os.path.join(os.path.dirname(p) if p else list(m.__path__)[0], "lib"))' \
  2>/dev/null)
if [ -z "$nccl_dir" ] || [ ! -e "$nccl_dir/libnccl.so.2" ]; then
  nccl_dir=""
  for sp in $(python3 -c 'import site, sys
print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' \
      2>/dev/null); do
    [ -d "$sp" ] || continue
    f=$(find "$sp" -maxdepth 5 -name libnccl.so.2 2>/dev/null | head -1)
    if [ -n "$f" ]; then nccl_dir=$(dirname "$f"); break; fi
  done
fi
if [ -n "$nccl_dir" ]; then
  export LD_LIBRARY_PATH=$nccl_dir:$LD_LIBRARY_PATH
  echo "NCCL: $nccl_dir/libnccl.so.2" >> "$log"
else
  echo "NCCL: libnccl.so.2 not found under python's site-packages" >> "$log"
fi
{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
} >> "$log" 2>&1

step() { # step NAME TIMEOUT CMD... : runs, logs, records rc
  local name=$1 t=$2 rc start
  shift 2
  echo "=== $name: $*" >> "$log"
  start=$(date +%s)
  timeout "$t" "$@" >> "$log" 2>&1
  rc=$?
  echo "=== $name: rc $rc, $(( $(date +%s) - start )) s" >> "$log"
  [ $rc -eq 0 ] || fails="$fails $name(rc $rc)"
  return $rc
}
fails=""

# 1 + 2: correctness
step check 150 "$bin/test_cuda_tp" check 2

# 5: the CLI (f32 on a golden prompt: identical text at tp 1 and 2)
for tp in 1 2; do
  timeout 60 "$bin/baton" run --device cuda --tp $tp --precision f32 \
    --model "$models/aidreams260K.bin" \
    --tokenizer "$models/aidreams-tok512.bin" --prompt "Once upon" \
    --max-tokens 48 > "$out/.run_tp$tp.txt" 2>> "$log"
  echo "=== baton run --tp $tp rc $?: $(head -c 300 "$out/.run_tp$tp.txt")" \
    >> "$log"
done
if [ -s "$out/.run_tp1.txt" ] && cmp -s "$out/.run_tp1.txt" "$out/.run_tp2.txt"
then cli=PASS; else cli=FAIL; fails="$fails cli-run"; fi
echo "$cli baton run --tp 2 = --tp 1 (f32, aidreams260K)" >> "$log"
rm -f "$out/.run_tp1.txt" "$out/.run_tp2.txt"
step bench-engine 90 "$bin/baton" bench-engine --device cuda --tp 2 \
  --model synth:llama3-8b --batch 1,16 --ctx 512 --steps 16 --seconds 0.3

# 3: decode steps against the floor
step b-8b-tp1 60 "$bin/test_cuda_tp" bench synth:llama3-8b 1 1,64 2048
step b-8b-tp2 60 "$bin/test_cuda_tp" bench synth:llama3-8b 2 1,64 2048
BT_TP_ALLREDUCE=nccl step b-8b-tp2-nccl 60 \
  "$bin/test_cuda_tp" bench synth:llama3-8b 2 1,64 2048
BT_TP_ALLREDUCE=none step b-8b-tp2-none 60 \
  "$bin/test_cuda_tp" bench synth:llama3-8b 2 1,64 2048
step b-70b-tp2 120 "$bin/test_cuda_tp" bench synth:llama3-70b 2 1,64 2048
BT_TP_ALLREDUCE=none step b-70b-tp2-none 120 \
  "$bin/test_cuda_tp" bench synth:llama3-70b 2 1,64 2048

# 4: all-reduce latency per call
step arbench 60 "$bin/test_cuda_tp" arbench synth:llama3-8b 2

# the table
{
  echo "## baton tensor parallelism on $(nvidia-smi --query-gpu=name \
--format=csv,noheader | head -1) x $(nvidia-smi -L | wc -l), $(date -u +%F)"
  echo
  echo "| check | result |"
  echo "| --- | --- |"
  grep -E '^(PASS|FAIL) ' "$log" | sed -E 's/^(PASS|FAIL) (.*)$/| \2 | \1 |/'
  echo
  echo "Decode step (median ms, logits copied to the host; \"gpu\": logits"
  echo "kept on the device), context 2048, bf16; floor = (weights + KV read)"
  echo "/ tp / 4.5 TB/s per GPU."
  echo
  echo "| model | tp | batch | all-reduce | step ms | gpu ms | floor ms | floor/step |"
  echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
  grep '^ROW|decode|' "$log" | awk -F'|' \
    '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $3, $4, $5, \
       $7, $8, $10, $11, $12 }'
  echo
  echo "All-reduce cost inside the decode step ((auto - none) / (2 x layers)):"
  echo
  echo "| model | batch | us per all-reduce in the step |"
  echo "| --- | ---: | ---: |"
  grep '^ROW|decode|' "$log" | awk -F'|' '
    $4 == 2 && $7 == "auto" { a[$3 "|" $5] = $8 }
    $4 == 2 && $7 == "none" { n[$3 "|" $5] = $8 }
    END { for (k in a) if (k in n) { split(k, p, "|");
            L = (p[1] ~ /70b/) ? 80 : 32;
            printf "| %s | %s | %.1f |\n", p[1], p[2],
                   (a[k] - n[k]) * 1000 / (2 * L) } }' | sort
  echo
  echo "All-reduce latency per call (2 GPUs, CUDA-graph replay of 64 calls):"
  echo
  echo "| f32 floats | KiB | NCCL us | peer-memory kernel us |"
  echo "| --- | ---: | ---: | ---: |"
  grep '^ROW|allreduce|' "$log" | awk -F'|' \
    '{ printf "| %s x %s | %s | %s | %s |\n", $4, $5, $6, $7, $8 }'
  echo
  if [ -z "$fails" ]; then echo "all steps passed"
  else echo "FAILED steps:$fails"; fi
} > "$table"
echo
cat "$table"
[ -z "$fails" ]
