#!/bin/bash
# run_gpu_round23g.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the 128-byte L2 prefetch size on the decode
# attention's K / V copies is now the default (23f: -0.11 ms at b64
# @2k): test_attn and test_cuda_model at the default, then the target
# rows (b1 / b64 @2k, prefill 2048) and b64 with BT_ATTN_KV_PF=0 beside
# them once each.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/bench_cuda, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23g "${1:-build-r23g}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 23g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_cuda_model 2>/dev/null
    grep -E '^(PASS|FAIL) golden' "$tmp/test_cuda_model" 2>/dev/null
    bc_rows t_1 pf0_1
    grep -h "read ceiling" "$tmp"/t_t_1 2>/dev/null
    head -1 "$log"
  } > "$table"
}
bc t_1 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
bc pf0_1 BT_ATTN_KV_PF=0 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 64 --ctx 2048 --prefill 0
report
run test_attn 60 "$c/gpu/test_attn"
report
run test_cuda_model 100 "$c/gpu/test_cuda_model"
report
cat "$table"
