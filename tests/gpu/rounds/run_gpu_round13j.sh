#!/bin/bash
# run_gpu_round13j.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE: CUPTI traces of a batch-64 top-p step, new (bench_cuda) and
# call 6's binary (bench_cuda_b): the top-k kernels' times, kernel by
# kernel.  Carry: gpu/{bench_cuda,bench_cuda_b,libbt_kernel_trace.so},
# lib/ (+ libcupti).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13j "${1:-build-r13j}"
for b in bench_cuda bench_cuda_b; do
  trace_step $b $b -- --steps 3 --batch 64 --ctx 2048 --prefill 0
done
{
  echo "## round 13j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for b in bench_cuda bench_cuda_b; do
    echo "### $b, batch-64 top-p step"
    grep -E "step:|sd_kernel|top_|nvjet_sm90_tss_168" "$tmp/tl_$b"
  done
} > "$table"
cat "$table"
