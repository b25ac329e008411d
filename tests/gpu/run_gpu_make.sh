#!/bin/bash
# run_gpu_make.sh [CARRY] - ON THE DEVICE MACHINE: `make gpu-test` then
# `make gpu-bench` on the folder `make gpu-carry` packed (its lib/ on the
# library path, its shared/ as the models), both logs and tables under
# $OUT.  The call: run(carry=[".carry"], command="bash .carry/call.sh").
set -u
c=${1:-build-gpumake}
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
make --no-print-directory gpu-test GPU_BUILD="$c"
rc=$?
make --no-print-directory gpu-bench GPU_BUILD="$c"
exit $(( rc | $? ))
