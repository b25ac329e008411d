#!/bin/bash
# run_gpu_cluster.sh [CARRY_DIR] - the cluster on one GPU (issue 7), ON
# THE DEVICE MACHINE (never in CI): aggregated vs 1 prefill + 1 decode
# over CUDA IPC vs golden.jsonl, bf16 agreement, kill -9 of the prefill
# mid-prompt (CUDA MPS when available), speculation with the draft head on
# the GPU (phase E; needs a trained head in $C/shared/heads, e.g.
# `baton eagle train --target ../shared/models/aidreams260K.bin --out
# $C/shared/heads/aidreams260K.bin.head.safetensors`; skipped without).
# BT_GPU_CLUSTER_PHASES=E runs phase E alone.  See tests/gpu/gpu_cluster.py.
#
# Prepare here (the device has no ZeroMQ/protobuf-c/UCX):
#   cmake -S . -B build-gpucluster -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpucluster -j2 --target baton baton-router \
#         baton-prefill baton-decode
#   C=build-gpucluster-carry; mkdir -p $C/bin $C/shared/models
#   for b in baton baton-router baton-prefill baton-decode; do
#     strip -o $C/bin/$b build-gpucluster/bin/$b; done
#   cp ../shared/models/{aidreams260K.bin,aidreams-tok512.bin,golden.jsonl} \
#      $C/shared/models/
#   ../shared/tools/devlibs $C/devlibs $C/bin/*
# then `run` with carry ["build-gpucluster-carry"] and the command
#   bash tests/gpu/run_gpu_cluster.sh
# (tests/gpu/bench_gpu_cluster.sh runs it first, then the benchmarks).
# $OUT (default /tmp/baton-gpu-cluster) gets gpu_cluster.log (the output
# and the summary table) and gpu_cluster_logs.tgz (every process's log):
# the device tool brings back at most 8 files, so the per-phase folders
# are written under $BT_GPU_CLUSTER_WORK and packed at the end.
# BT_GPU_CLUSTER_TIMEOUT (220) bounds the checks.
set -u
carry=${1:-build-gpucluster-carry}
out=${OUT:-/tmp/baton-gpu-cluster}
work=${BT_GPU_CLUSTER_WORK:-/tmp/baton-gpu-cluster-work}
rm -rf "$work"
mkdir -p "$out" "$work"
export LD_LIBRARY_PATH=$PWD/$carry/devlibs:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$PWD/$carry/devlibs/ucx
export BT_SHARED_DIR=${BT_SHARED_DIR:-$PWD/$carry/shared}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  > "$out/gpu_cluster.log" 2>&1
PYTHONUNBUFFERED=1 timeout "${BT_GPU_CLUSTER_TIMEOUT:-220}" \
  python3 tests/gpu/gpu_cluster.py "$PWD/$carry/bin" "$work" \
  2>&1 | tee -a "$out/gpu_cluster.log"
rc=${PIPESTATUS[0]}
tar czf "$out/gpu_cluster_logs.tgz" -C "$work" --exclude mps-pipe . \
  2>>"$out/gpu_cluster.log"
exit "$rc"
