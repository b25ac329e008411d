#!/bin/bash
# run_gpu_round15d.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: early PDL triggers for one-wave rows GEMVs
# (BT_GEMV_TRIGGER=single: qkv, o, down launch their successor at their
# top) vs the default late triggers vs early for all: bench_cuda batch 1
# at 512 / 2k / 8k and batch 2 @2k, interleaved twice; CUPTI traces of a
# batch-1 step @2k with single and the default.
# Carry: gpu/bench_cuda, gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15d "${1:-build-r15d}"
report() {
  {
    echo "## round 15d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2; do bc_cols def$i single$i early$i; done
    for v in single def; do echo "### trace $v"; head -12 "$tmp/tl_$v" 2>/dev/null; grep -A16 "first 24" "$tmp/tl_$v" 2>/dev/null | sed -n 8,18p; done
  } > "$table"
}
for i in 1 2; do
  a="--batch 1,2 --ctx 512,2048,8192 --prefill 0"
  bc def$i BT_X=1 -- $a
  bc single$i BT_GEMV_TRIGGER=single -- $a
  bc early$i BT_GEMV_TRIGGER=early -- $a
  report
done
trace_step single bench_cuda BT_GEMV_TRIGGER=single -- --steps 4 --batch 1 --ctx 2048 --prefill 0
trace_step def bench_cuda -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
