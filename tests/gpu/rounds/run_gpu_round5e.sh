#!/bin/bash
# run_gpu_round5e.sh [CARRY] - A/B of the GEMM autotuner's cuBLASLt
# candidate count (BT_GEMM_LT_CANDS for decode buckets, default 4;
# BT_GEMM_LT_CANDS_BIG for prefill shapes, default 8) on synth:llama3-8b,
# ON THE DEVICE MACHINE from a carried bench_cuda.  ~2 minutes.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r5e "${1:-build-c7}"
bc default BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc c16 BT_GEMM_LT_CANDS=16 BT_GEMM_LT_CANDS_BIG=16 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc c32 BT_GEMM_LT_CANDS=32 BT_GEMM_LT_CANDS_BIG=32 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc default2 BT_X=2 -- --batch 1,8,64 --ctx 2048 --prefill 2048
{
  echo "## round 5e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows default c16 c32 default2
  grep -h "warm-up prefill" "$tmp"/bc_* | head -4
} > "$table"
cat "$table"
