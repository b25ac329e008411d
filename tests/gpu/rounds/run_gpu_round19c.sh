#!/bin/bash
# run_gpu_round19c.sh [CARRY] - round 19 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the compiled transformers peer side by side with
# baton on one machine: bench_cuda b1 / b64 @2k and the 2048-token
# prefill (twice), then torch_bench.py --compile (static cache,
# torch.compile'd decode step; b1 / b64 @2k, prompt 2048; rows printed
# as they finish, so a timeout keeps what ran).  Carry: gpu/bench_cuda,
# lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r19c "${1:-build-r19c}"
for i in 1 2; do
  bc base$i BT_LOG=WARN -- --batch 1,64 --ctx 2048 --prefill 2048
done
{ echo "## baton (bench_cuda, two runs)"; bc_rows base1 base2; } > "$table"
cat "$table"
timeout -k 5 470 python3 "$(dirname "$0")/../torch_bench.py" --compile \
  --table "$out/torch_compiled.md" 2>&1 | grep -v "^W[0-9]" | tail -30 | tee -a "$log"
