#!/bin/bash
# run_gpu_round25g.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the backend tests through the prefill attention at
# the final landing code (wg_desc_add): test_cuda_model, test_spec_cuda
# (tree masks), then the target rows once.
# Carry: gpu/test_cuda_model gpu/test_spec_cuda gpu/bench_cuda, lib/,
# shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25g "${1:-build-r25g}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_model 150 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
bc t1 -- --batch 1,64 --ctx 2048 --prefill 2048
{
  echo "## round 25g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_model test_spec
  grep -h "^PASS golden" "$tmp/test_model" 2>/dev/null
  bc_rows t1
  grep -h "read ceiling" "$log" | head -1
  head -1 "$log"
} > "$table"
cat "$table"
