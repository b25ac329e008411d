#!/bin/bash
# run_gpu_round27b.sh [CARRY] - round 27 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: `make gpu-bench` at 5b2ef62 (kernels, the engine
# sweep, the transformers peer side by side; the last full one was
# round 22's).  Carry: as run_gpu_round27a.sh.
set -u
c=${1:-build-r27a}
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
make gpu-bench GPU_BUILD="$c"
