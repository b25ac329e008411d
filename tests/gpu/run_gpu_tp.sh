#!/bin/bash
# run_gpu_tp.sh [CARRY_DIR] - tensor parallelism of the cuda backend
# (issue 8), ON A DEVICE MACHINE WITH 2 OR 4 GPUs (kind nvidia-h200-x2 or
# -x4; never in CI).  About 2.5 minutes on 2 GPUs, 3.5 on 4:
#   1. correctness (test_cuda_tp check TP, TP = 2, and 4 with 4 GPUs):
#      f32 TP greedy = TP=1 = golden.jsonl on every golden line (.bin and
#      -hf), mixed batches with hidden rows, device-generated synth
#      weights = host generator, KV copies on every rank; bf16
#      synth:llama3-8b teacher-forced top-1 TP vs TP=1 judged against
#      TP=1's agreement with itself under other computation orders; the
#      custom and NCCL all-reduces under load (every element exact)
#   2. the CLI: baton run --tp 2 = --tp 1 (f32, aidreams)
#   3. disaggregated TP: 1 prefill (TP=2) + 1 decode (TP=1) and 1 prefill
#      (TP=1) + 1 decode (TP=2) over CUDA IPC with KV heads re-sharded on
#      the way (kv_reshard), f32 aidreams260K greedy = golden.jsonl
#      (tests/gpu/gpu_tp_cluster.py; needs baton-router/-prefill/-decode)
#   4. decode step time at batch 1 and 64, context 2048, against the
#      floor (weights/tp + KV/tp per GPU at 4.5 TB/s): llama3-8b TP 1, 2
#      (all-reduce auto, nccl, custom, none = no reduction: its cost in the
#      step), llama3-70b TP 2 (auto, none); with 4 GPUs also TP 4 rows
#   5. all-reduce latency per call, NCCL vs the peer-memory kernel
# NCCL comes from PyTorch's pip package (nvidia/nccl/lib/libnccl.so.2,
# found through python; never carried: 218 MB); NCCL_NVLS_ENABLE=0.
#
# Prepare here (CUDA build; the device lacks ZeroMQ/protobuf-c/UCX):
#   B=build-tp2
#   cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DBT_WERROR=ON
#   cmake --build $B -j2 --target baton baton-router baton-prefill \
#         baton-decode gpu_test_cuda_tp
#   C=build-tp2-carry; rm -rf $C; mkdir -p $C/bin $C/shared/models
#   for b in baton baton-router baton-prefill baton-decode; do
#     strip -o $C/bin/$b $B/bin/$b; done
#   strip -o $C/bin/test_cuda_tp $B/gpu/test_cuda_tp
#   cp -r ../shared/models/{aidreams260K.bin,aidreams-tok512.bin,\
#   stories260K.bin,aidreams260K-hf,stories260K-hf,golden.jsonl} \
#      $C/shared/models/
#   ../shared/tools/devlibs $C/devlibs $C/bin/*
#   tar czf $C/bin.tgz -C $C bin && rm -rf $C/bin && du -sh $C  # <= 64 MiB
# then run(kind="nvidia-h200-x2", carry=["build-tp2-carry"], timeout_s=300,
#          command="bash tests/gpu/run_gpu_tp.sh build-tp2-carry").
# $OUT (default /tmp/baton-gpu-tp) gets gpu_tp.log (everything, cluster
# process logs included) and gpu_tp_table.md (the table, printed last).
set -u
t_start=$(date +%s)
carry=${1:-build-tp2-carry}
out=${OUT:-/tmp/baton-gpu-tp}
mkdir -p "$out"
log=$out/gpu_tp.log
table=$out/gpu_tp_table.md
cdir=$PWD/$carry
: > "$log"
if [ -f "$cdir/bin.tgz" ]; then # binaries travel compressed
  x=/tmp/baton-gpu-tp-carry
  rm -rf "$x" && mkdir -p "$x" && tar xzf "$cdir/bin.tgz" -C "$x" || exit 1
  bin=$x/bin
else
  bin=$cdir/bin
fi
export LD_LIBRARY_PATH=$cdir/devlibs:${LD_LIBRARY_PATH:-}
[ -d "$cdir/devlibs/ucx" ] && export UCX_MODULE_DIR=$cdir/devlibs/ucx
export BT_SHARED_DIR=${BT_SHARED_DIR:-$cdir/shared}
export NCCL_NVLS_ENABLE=0
models=$BT_SHARED_DIR/models
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)

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
  timeout -k 5 "$t" "$@" >> "$log" 2>&1
  rc=$?
  echo "=== $name: rc $rc, $(( $(date +%s) - start )) s" >> "$log"
  [ $rc -eq 0 ] || fails="$fails $name(rc $rc)"
  return $rc
}
fails=""

# 1: correctness
step check-tp2 120 "$bin/test_cuda_tp" check 2
[ "$ngpu" -ge 4 ] && step check-tp4 120 "$bin/test_cuda_tp" check 4

# 2: the CLI (f32 on a golden prompt: identical text at tp 1 and 2)
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

# 3: disaggregated prefill/decode with different TP (CUDA IPC, re-shard)
if [ -x "$bin/baton-router" ] && [ -f tests/gpu/gpu_tp_cluster.py ]; then
  step cluster 75 python3 tests/gpu/gpu_tp_cluster.py "$bin" "$models" \
    /tmp/baton-gpu-tp-cluster
  for f in /tmp/baton-gpu-tp-cluster/*.log; do
    [ -f "$f" ] && { echo "--- $f (tail)"; tail -n 25 "$f"; } >> "$log"
  done
fi

# 4: decode steps against the floor
B8=synth:llama3-8b
B70=synth:llama3-70b
step b-8b-tp1 60 "$bin/test_cuda_tp" bench $B8 1 1,64 2048
for ar in auto nccl custom none; do
  BT_TP_ALLREDUCE=$ar step b-8b-tp2-$ar 60 \
    "$bin/test_cuda_tp" bench $B8 2 1,64 2048
done
for ar in auto none; do
  BT_TP_ALLREDUCE=$ar step b-70b-tp2-$ar 90 \
    "$bin/test_cuda_tp" bench $B70 2 1,64 2048
done
if [ "$ngpu" -ge 4 ]; then
  for ar in auto none; do
    BT_TP_ALLREDUCE=$ar step b-8b-tp4-$ar 60 \
      "$bin/test_cuda_tp" bench $B8 4 1,64 2048
    BT_TP_ALLREDUCE=$ar step b-70b-tp4-$ar 90 \
      "$bin/test_cuda_tp" bench $B70 4 1,64 2048
  done
fi

# 5: all-reduce latency per call
step arbench-tp2 60 "$bin/test_cuda_tp" arbench $B8 2
[ "$ngpu" -ge 4 ] && step arbench-tp4 60 "$bin/test_cuda_tp" arbench $B8 4

# the table
{
  echo "## baton tensor parallelism on $(nvidia-smi --query-gpu=name \
--format=csv,noheader | head -1) x $ngpu, $(date -u +%F)"
  echo
  echo "| check | result |"
  echo "| --- | --- |"
  grep -E '^(PASS|FAIL) ' "$log" | sed -E 's/^(PASS|FAIL) (.*)$/| \2 | \1 |/'
  grep -E '^INFO bf16 ' "$log" | sed -E 's/^INFO (.*)$/| \1 | info |/'
  echo
  echo "Decode step (median ms, logits copied to the host; \"gpu\": logits"
  echo "kept on the device), context 2048, bf16; floor = (weights + KV read)"
  echo "/ tp / 4.5 TB/s per GPU.  Same method as bench_cuda (64-token"
  echo "warm-up prefill for the GEMM autotuner, KV filled with 0x3c, 128"
  echo "sequences / 8192 batch tokens), so TP=1 \"gpu ms\" = its \"step ms\"."
  echo
  echo "| model | tp | batch | all-reduce | step ms | gpu ms | floor ms | floor/step |"
  echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
  grep '^ROW|decode|' "$log" | awk -F'|' \
    '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $3, $4, $5, \
       $7, $8, $10, $11, $12 }'
  echo
  echo "All-reduce cost inside the decode step ((auto - none) / (2 x layers),"
  echo "gpu ms):"
  echo
  echo "| model | tp | batch | us per all-reduce in the step |"
  echo "| --- | ---: | ---: | ---: |"
  grep '^ROW|decode|' "$log" | awk -F'|' '
    $4 > 1 && $7 == "auto" { a[$3 "|" $4 "|" $5] = $10 }
    $4 > 1 && $7 == "none" { n[$3 "|" $4 "|" $5] = $10 }
    END { for (k in a) if (k in n) { split(k, p, "|");
            L = (p[1] ~ /70b/) ? 80 : 32;
            printf "| %s | %s | %s | %.1f |\n", p[1], p[2], p[3],
                   (a[k] - n[k]) * 1000 / (2 * L) } }' | sort
  echo
  echo "All-reduce latency per call (CUDA-graph replay of 64 calls):"
  echo
  echo "| tp | f32 floats | KiB | NCCL us | peer-memory kernel us |"
  echo "| ---: | --- | ---: | ---: | ---: |"
  grep '^ROW|allreduce|' "$log" | awk -F'|' \
    '{ printf "| %s | %s x %s | %s | %s | %s |\n", $3, $4, $5, $6, $7, $8 }'
  echo
  if [ -z "$fails" ]; then echo "all steps passed"
  else echo "FAILED steps:$fails"; fi
  echo "($(( $(date +%s) - t_start )) s)"
} > "$table"
echo
cat "$table"
[ -z "$fails" ]
