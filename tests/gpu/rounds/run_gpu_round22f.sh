#!/bin/bash
# run_gpu_round22f.sh [CARRY] - round 22 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: bench_cuda's new last line, the device's own read
# ceiling, twice, with the target rows (b1 / b64 @2k, prefill 2048).
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r22f "${1:-build-r22f}"
for r in 1 2; do
  bc t_$r BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
done
{
  echo "## round 22f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows t_1 t_2
  grep -h "read ceiling" "$tmp/t_t_1" "$tmp/t_t_2"
  head -1 "$log"
} > "$table"
cat "$table"
