#!/bin/bash
# run_gpu_round16h.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: with the fused norm one round trip shorter, is the
# qkv GEMV's one-wave grid of two rows a warp (384 blocks, every block
# staging the norm at once) still better than one row a warp (768
# blocks, 1.45 waves)?  BT_GEMV_RPW=1 changes only qkv at batch 1 (o,
# down and gate/up already run one row a warp); three interleaved pairs.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16h "${1:-build-r16h}"
report() {
  {
    echo "## round 16h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for i in 1 2 3; do bc_cols def$i rpw1$i; done
  } > "$table"
}
for i in 1 2 3; do
  bc def$i BT_X=1 -- --batch 1 --ctx 512,2048,8192 --prefill 0
  bc rpw1$i BT_GEMV_RPW=1 -- --batch 1 --ctx 512,2048,8192 --prefill 0
  report
done
cat "$table"
