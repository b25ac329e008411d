#!/bin/bash
# run_gpu_round16c.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: is the fused norm's first wave bound by every block
# reading the same x from L2?  test_gemm --mlp-prof: the fused MLP's
# per-block phase profile after an L2 flush with the norm reading x from
# 1, 2, 8, 32 copies (an experiment build; the copies are not in the
# landed code).  Carry: gpu/test_gemm, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16c "${1:-build-r16c}"
run mlp_prof 120 "$c/gpu/test_gemm" --mlp-prof
cp "$tmp/mlp_prof" "$table"
cat "$table"
