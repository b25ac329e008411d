#!/bin/bash
# run_gpu_round22e.sh [CARRY] - round 22 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: `make gpu-bench` (kernels, the engine sweep, the
# PyTorch peer) at the landing code (the tuner's lead + final round).
# Carry: gpu/test_attn gpu/test_gemm gpu/bench_cuda, lib/.
set -u
c=${1:-build-r22e}
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_LOG=${BT_LOG:-WARN}
bash "$(dirname "$0")/../run_gpu_bench.sh" "$c" | tail -70
