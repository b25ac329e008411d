#!/bin/bash
# run_gpu_round13c.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the batch-1 decode attention prefetching the o
# projection's weights into L2 (BT_ATTN_PF_MB, BT_ATTN_PF=pre), A/B
# interleaved at batch 1 and 2 @2k; a CUPTI trace of batch 1 with it;
# test_attn.  Carry: gpu/bench_cuda, gpu/test_attn,
# gpu/libbt_kernel_trace.so, lib/ (+ libcupti).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13c "${1:-build-r13c}"
report() {
  {
    echo "## round 13c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn
    bc_rows def1 pf16 pf32 pre32 def2 pf16b pf32b pre32b
    echo "### batch 1 timeline, BT_ATTN_PF_MB=32"; cat "$tmp/tl_b1" 2>/dev/null | head -45
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
report
for r in "" b; do
  bc def$([ "$r" = b ] && echo 2 || echo 1) BT_X=1 -- --batch 1,2 --ctx 2048 --prefill 0
  bc pf16$r BT_ATTN_PF_MB=16 -- --batch 1,2 --ctx 2048 --prefill 0
  bc pf32$r BT_ATTN_PF_MB=32 -- --batch 1,2 --ctx 2048 --prefill 0
  bc pre32$r BT_ATTN_PF_MB=32 BT_ATTN_PF=pre -- --batch 1,2 --ctx 2048 --prefill 0
  report
done
trace_step b1 bench_cuda BT_ATTN_PF_MB=32 -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
