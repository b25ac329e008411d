#!/bin/bash
# run_gpu_round14f.sh [CARRY] - round 14 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the engine sweep of `make gpu-bench` at the landed
# code (bench_cuda: decode batch 1-128 x ctx 512 / 2k / 8k, prefill 512 /
# 2k / 8k, against the floors) and the same shapes through PyTorch +
# transformers (tests/gpu/torch_bench.py), without the kernel benchmarks.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r14f "${1:-build-r14f}"
report() {
  {
    echo "## round 14f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    echo "### baton"; cat "$tmp/t_sweep" 2>/dev/null
    echo "### torch"; cat "$out/torch_table.md" 2>/dev/null
  } > "$table"
}
run bc_sweep 260 "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1,8,32,64,128 --ctx 512,2048,8192 --prefill 512,2048,8192 \
  --table "$tmp/t_sweep"
report
run torch 200 env PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/../torch_bench.py" \
  --table "$out/torch_table.md"
report
cat "$table"
