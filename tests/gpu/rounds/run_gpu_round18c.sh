#!/bin/bash
# run_gpu_round18c.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the landing code (the new-row attention instance by
# default, the ticket / even-rows GEMVs and the product trigger removed):
# `make gpu-test` then `make gpu-bench` (engine sweep + PyTorch peer) on
# the carried build.  Carry: the gpu-test binaries, bench_cuda, lib/,
# shared.
set -u
c=${1:-build-r18c}
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
bash "$(dirname "$0")/../run_gpu_test.sh" "$c" | tail -14
bash "$(dirname "$0")/../run_gpu_bench.sh" "$c"
