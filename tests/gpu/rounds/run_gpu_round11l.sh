#!/bin/bash
# run_gpu_round11l.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: fa2pp (TMA producer) as the default prefill
# attention: the backend tests through it (test_cuda_model; test_spec_cuda,
# whose tree verification goes through the prefill kernels with masks),
# bench_kernels --attn (default, then fa2wqv), the issue-4 target rows
# (batch 1 / 8 / 64 at 2k, prefill 512 / 2048 / 8192) at the new
# default, and prefill 2048 / 8192 with fa2wqv between two default runs.
# Carry: gpu/{test_cuda_model,test_spec_cuda,bench_kernels,bench_cuda},
# lib/, shared/.
# Prepared, NOT YET RUN: the session's device time ran out (call 14 was
# refused).  Run it first next session:
#   bash tests/gpu/pack_carry.sh r11l tests/gpu/rounds/run_gpu_round11l.sh \
#     gpu/test_cuda_model gpu/test_spec_cuda gpu/bench_kernels \
#     gpu/bench_cuda shared
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11l "${1:-build-r11l}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_model 120 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
run attn 40 "$c/gpu/bench_kernels" --attn
smi_start
bc d BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 512,2048,8192
bc w BT_PREFILL_KERNEL=fa2wqv -- --batch 1 --ctx 512 --prefill 2048,8192
bc d2 BT_X=1 -- --batch 1 --ctx 512 --prefill 2048,8192
smi_stop
{
  echo "## round 11l $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_model test_spec
  grep -h "^attn" "$tmp/attn"
  bc_rows d w d2
  smi_summary
} > "$table"
cat "$table"
