#!/bin/bash
# run_gpu_round5f.sh [CARRY] - the split merge inside the tensor-core
# decode attention kernel (cuda_attn_args_t.d_split_cnt), ON THE DEVICE
# MACHINE: test_attn (fused = two kernels bit for bit, counters back to
# zero), bench_cuda with it (BT_ATTN_FUSED=1, the default when this ran;
# now opt-in) and BT_ATTN_FUSED=0.  ~2 minutes.
set -u
. "$(dirname "$0")/gpu_steps.sh"
gpu_steps_init r5f "${1:-build-c8}"
run test_attn 120 "$c/gpu/test_attn"
bc fused BT_ATTN_FUSED=1 -- --batch 1,8 --ctx 2048,8192 --prefill 0
bc fused0 BT_ATTN_FUSED=0 -- --batch 1,8 --ctx 2048,8192 --prefill 0
bc fused2 BT_ATTN_FUSED=1 -- --batch 1 --ctx 2048 --prefill 0
{
  echo "## round 5f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn
  grep -c "fused merge" "$tmp/test_attn"
  bc_rows fused fused0 fused2
} > "$table"
cat "$table"
