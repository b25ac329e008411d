#!/bin/bash
# run_gpu_round19a.sh [CARRY] - round 19 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: `make gpu-test` on the review refactor of round 18
# (3fbaedf, 2cd7460: gemv.cu's one rows kernel, tc_launch_hd, the
# test_attn split table), then round 18h's TMA decode-attention test and
# A/B (BT_ATTN_TMA=1 vs 0) on the same machine.  Carry: the gpu-test
# binaries, bench_cuda, lib/, shared.
set -u
c=${1:-build-r19a}
d=$(dirname "$0")
(
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
  bash "$d/../run_gpu_test.sh" "$c" | tail -16
)
bash "$d/run_gpu_round18h.sh" "$c"
