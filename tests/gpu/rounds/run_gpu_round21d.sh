#!/bin/bash
# run_gpu_round21d.sh [CARRY] - round 21 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the TMA decode attention as the default (BT_ATTN_TMA
# unset = on, =0 off).  test_attn (both copies, every mask / split
# case), test_cuda_model; then on one BT_GEMM_CACHE file the engine at
# b8 / b32 / b64 / b128 @2k and the 2048 prefill, default vs BT_ATTN_TMA=0, two
# interleaved rounds (b64 @8k was equal in 21c).  Carry: gpu/test_attn gpu/test_cuda_model
# gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.  Then traces
# of a b64 step with gate/up tuned vs forced to cuBLASLt's first pick.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r21d "${1:-build-r21d}"
export BT_SHARED_DIR=$PWD/$c/shared
gc=$tmp/gc.txt
report() {
  {
    echo "## round 21d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail attn model 2>/dev/null
    grep -E '^(PASS|FAIL) golden' "$tmp/model" 2>/dev/null
    for v in on off; do echo "$v: $(bc_steps ${v}_1 ${v}_2)"; done
    bc_rows on_1 off_1 2>/dev/null
  } > "$table"
}
run attn 200 "$c/gpu/test_attn"
run model 200 "$c/gpu/test_cuda_model"
report
bc warm BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 0
for r in 1 2; do
  bc on_$r BT_GEMM_CACHE=$gc -- --batch 8,32,64,128 --ctx 2048 --prefill 2048
  bc off_$r BT_GEMM_CACHE=$gc BT_ATTN_TMA=0 -- --batch 8,32,64,128 --ctx 2048 --prefill 2048
done
report
# Round 21c's trace: 4.7-9.3 us before every gate/up GEMM (nvjet 80x64
# 4x1 on 120 blocks), 0.3-0.8 before the others.  The heuristic's first
# algorithm forced on gate/up only: does the gap go with the kernel?
trace_step gu_tuned bench_cuda BT_GEMM_CACHE=$gc -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step gu_lt0 bench_cuda BT_GEMV_FORCE=lt BT_GEMV_FORCE_OUT=28672 -- --steps 3 --batch 64 --ctx 2048 --prefill 0
bc gu_lt0 BT_GEMV_FORCE=lt BT_GEMV_FORCE_OUT=28672 -- --batch 64 --ctx 2048 --prefill 0
bc gu_tuned BT_GEMM_CACHE=$gc -- --batch 64 --ctx 2048 --prefill 0
{
  echo "gate/up forced to the heuristic's first: $(bc_steps gu_lt0), tuned: $(bc_steps gu_tuned)"
  for t in gu_tuned gu_lt0; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done
} >> "$table"
cat "$table"
