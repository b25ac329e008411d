#!/bin/bash
# run_gpu_round20c.sh [CARRY] - round 20 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the stream-K decode attention with runs of whole
# tokens (BT_ATTN_SK=2: where the items outnumber the block slots, each
# block two tokens' items at batch 64, the pipeline running on across
# the item boundary; no pieces, fences or counters) against the split
# kernel's two waves (the default).  test_attn (its new whole-token
# passes), bench_cuda b32 / b64 / b128 @2k interleaved twice, b64 @512
# and @8k once, and a CUPTI trace of a b64 @2k step with it.  Carry:
# gpu/{test_attn,bench_cuda,libbt_kernel_trace.so}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r20c "${1:-build-r20c}"
report() {
  {
    echo "## round 20c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail attn 2>/dev/null
    grep -c "whole tokens" "$tmp/attn" 2>/dev/null
    echo "### step ms b32 b64 b128 @2k: default / BT_ATTN_SK=2"
    for i in 1 2; do
      echo "def$i: $(bc_steps def$i)  sk$i: $(bc_steps sk$i)"
    done
    echo "### b64 @512 @8k: default / SK=2"
    echo "def: $(bc_steps defx)  sk: $(bc_steps skx)"
    bc_cols def1 sk1
    echo "### trace b64 SK=2"; cat "$tmp/tl_b64" 2>/dev/null | head -16
  } > "$table"
}
run attn 240 "$c/gpu/test_attn"
report
for i in 1 2; do
  bc def$i BT_LOG=WARN -- --batch 32,64,128 --ctx 2048 --prefill 0
  bc sk$i BT_ATTN_SK=2 -- --batch 32,64,128 --ctx 2048 --prefill 0
  report
done
bc defx BT_LOG=WARN -- --batch 64 --ctx 512,8192 --prefill 0
bc skx BT_ATTN_SK=2 -- --batch 64 --ctx 512,8192 --prefill 0
report
trace_step b64 bench_cuda BT_ATTN_SK=2 -- --steps 3 --batch 64 --ctx 2048 --prefill 0
report
cat "$table"
