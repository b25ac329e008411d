#!/bin/bash
# run_gpu_round18e.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: 18d's trace showed the 2048-token prefill's attention
# at 174 us a layer in the engine, fa2wqv's figure in test_attn --bench
# (fa2pp 137.8): which kernel does the engine run?  The full kernel names
# of one traced prefill, then BT_PREFILL_KERNEL unset / fa2pp / fa2wqv,
# two interleaved rounds.  Carry: gpu/{bench_cuda,libbt_kernel_trace.so},
# lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18e "${1:-build-r18e}"
trace_step pf bench_cuda -- --steps 1 --batch 1 --ctx 512 --prefill 2048
for i in 1 2; do
  bc def$i BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
  bc pp$i BT_PREFILL_KERNEL=fa2pp -- --batch 1 --ctx 512 --prefill 2048
  bc wqv$i BT_PREFILL_KERNEL=fa2wqv -- --batch 1 --ctx 512 --prefill 2048
done
{
  echo "## round 18e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  echo "### prefill kernels traced (count, mangled name)"
  grep -o "attn_prefill[A-Za-z0-9_]*" "$tmp/trace_pf.csv" | sort | uniq -c
  head -3 "$tmp/trace_pf.csv"
  bc_rows def1 pp1 wqv1 def2 pp2 wqv2
} > "$table"
cat "$table"
