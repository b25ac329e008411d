#!/bin/bash
# bench_gpu_cluster.sh [CARRY_DIR] - issue 7 on one GPU, ON THE DEVICE
# MACHINE (never in CI), in one call: the correctness checks A-D of
# tests/gpu/run_gpu_cluster.sh, then tests/gpu/bench_gpu_cluster.py (KV
# hand-off over CUDA IPC per prompt length; `baton bench` 1P+1D vs
# aggregated) on the synthetic Llama-3-8B in bf16.
#
# Prepare the carry folder here exactly as run_gpu_cluster.sh's header
# says (stripped baton, baton-router, baton-prefill, baton-decode,
# devlibs, the aidreams260K model files), then `run` with carry
# ["build-gpucluster-carry"], timeout_s 300 and the command
#   bash tests/gpu/bench_gpu_cluster.sh
# $OUT gets (at most 8 files come back): gpu_cluster.log and
# gpu_cluster_logs.tgz (checks), bench.log (benchmark output),
# bench_results.md (the tables, rewritten as they fill), bench_logs.tgz
# (every process's log and the bench JSON files).  The tables print last.
# BT_BENCH_BUDGET_S (250) bounds the whole script; the benchmark skips
# what no longer fits.  Dry run without a GPU (dev machine):
#   BT_GPU_CLUSTER_DEVICE=cpu BT_BENCH_DEVICE=cpu BT_BENCH_MODEL=synth:tiny
#   BT_BENCH_PRECISION=f32 BT_BENCH_PLENS=32,64,200 BT_BENCH_VOCAB=512
#   BT_BENCH_RUNS="64x8@1:4,4:8;32x32@4:4" BT_BENCH_BATCH_TOKENS=256
#   BT_BENCH_DEC_BLOCKS=256 BT_BENCH_PRE_BLOCKS=128 bash tests/gpu/...
set -u
carry=${1:-build-gpucluster-carry}
out=${OUT:-/tmp/baton-gpu-bench-cluster}
work=${BT_BENCH_WORK:-/tmp/baton-gpu-bench-work}
budget=${BT_BENCH_BUDGET_S:-250}
t0=$(date +%s)
rm -rf "$work"
mkdir -p "$out" "$work"
export LD_LIBRARY_PATH=$PWD/$carry/devlibs:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$PWD/$carry/devlibs/ucx
export BT_SHARED_DIR=${BT_SHARED_DIR:-$PWD/$carry/shared}

BT_GPU_CLUSTER_TIMEOUT=${BT_GPU_CLUSTER_TIMEOUT:-90} \
  bash tests/gpu/run_gpu_cluster.sh "$carry"
rc_check=$?

left=$((budget - ($(date +%s) - t0) - 10))
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
    --format=csv 2>&1
  echo "checks rc $rc_check; benchmark budget ${left}s"
} | tee "$out/bench.log"
PYTHONUNBUFFERED=1 BT_BENCH_DEADLINE_S=$((left - 20)) timeout "$left" \
  python3 tests/gpu/bench_gpu_cluster.py "$PWD/$carry/bin" "$work" \
  "$out/bench_results.md" 2>&1 | tee -a "$out/bench.log"
rc_bench=${PIPESTATUS[0]}
tar czf "$out/bench_logs.tgz" -C "$work" --exclude mps-pipe . \
  2>>"$out/bench.log"
echo
echo "== checks (rc $rc_check)"
grep '^| ' "$out/gpu_cluster.log"
echo "== benchmarks (rc $rc_bench, $(($(date +%s) - t0)) s in all)"
cat "$out/bench_results.md" 2>/dev/null
[ "$rc_check" -eq 0 ] && [ "$rc_bench" -eq 0 ]
