#!/bin/bash
# run_gpu_round17e.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: where a batch-1 layer's time goes, per block: the
# -DBT_KPROF=1 build of bench_cuda (build-prof) stamps each block's
# entry, PDL wait, norm / q staged, last product and end in the qkv,
# attention, combine, o, gate/up and down kernels of the last layer
# (kern_common.cuh KPROF); tests/gpu/kprof_table.py makes the tables.
# Batch 1 and 2 @512 / 2k / 8k.  Carry: gpu/bench_cuda_prof (the
# profiling build), lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17e "${1:-build-r17e}"
run prof 120 "$c/gpu/bench_cuda_prof" --model synth:llama3-8b --steps 5 \
  --batch 1,2 --ctx 512,2048,8192 --prefill 0
python3 "$(dirname "$0")/../kprof_table.py" "$tmp/prof" > "$table" 2>&1
grep -E "^\| decode " "$tmp/prof" >> "$table"
cat "$table"
