#!/bin/bash
# run_cuda_ipc_window.sh BUILD - runs gpu/test_cuda_ipc_window from a
# carried build (tests/gpu/pack_carry.sh cipcwin ... shared) ON THE DEVICE
# MACHINE: the CUDA IPC link's per-reservation windows (issue 42 item 3).
# Its log goes to $OUT/cuda_ipc_window.log when $OUT is set.
set -u
build=${1:-build-cuda}
export BT_SHARED_DIR=${BT_SHARED_DIR:-$build/shared}
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$build/lib:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/baton-gpu-test}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/cuda_ipc_window.log"
timeout 300 "$build/gpu/test_cuda_ipc_window" 2>&1 | tee -a "$out/cuda_ipc_window.log"
exit "${PIPESTATUS[0]}"
