#!/bin/bash
# run_gpu_round15a.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the decode attention's splits merged in a thread-block
# cluster (BT_ATTN_CLUSTER=1, no combine kernel): test_attn, then
# test_cuda_model with clusters on, then bench_cuda batch 1 and 8 at
# 512 / 2k / 8k: off vs on vs on without the trigger before the merge
# (BT_ATTN_CLTRIG=0), interleaved twice; a CUPTI trace of a batch-1 step
# with clusters on.
# Carry: gpu/bench_cuda, gpu/test_attn, gpu/test_cuda_model,
# gpu/libbt_kernel_trace.so, shared, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15a "${1:-build-r15a}"
report() {
  {
    echo "## round 15a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_model_cl
    for i in 1 2; do bc_cols off$i on$i ontr$i; done
    cat "$tmp/tl_cl" 2>/dev/null | head -40
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
report
run test_model_cl 200 env BT_ATTN_CLUSTER=1 BT_SHARED_DIR="$PWD/$c/shared" "$c/gpu/test_cuda_model"
report
for i in 1 2; do
  a="--batch 1,8 --ctx 512,2048,8192 --prefill 0"
  bc off$i BT_ATTN_CLUSTER=0 -- $a
  bc on$i BT_ATTN_CLUSTER=1 -- $a
  bc ontr$i BT_ATTN_CLUSTER=1 BT_ATTN_CLTRIG=0 -- $a
  report
done
trace_step cl bench_cuda BT_ATTN_CLUSTER=1 -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
