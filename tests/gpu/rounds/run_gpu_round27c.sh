#!/bin/bash
# run_gpu_round27c.sh [CARRY] - round 27 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: test_cuda_model with the golden-sequence agreement
# now held against the cpu backend's bf16 mode (>= 99%).
# Carry: gpu/test_cuda_model, lib/, shared.
set -u
c=${1:-build-r27c}
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r27c "$c"
export BT_SHARED_DIR=$PWD/$c/shared
run model 120 "$c/gpu/test_cuda_model"
{
  echo "## round 27c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -E "^(PASS|FAIL|INFO)" "$tmp/model"
  head -1 "$log"
} > "$table"
cat "$table"
