#!/bin/bash
# run_gpu_round9l.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: batch 64 @2k with one GEMM kind forced for every
# shape (BT_GEMV_FORCE=lt / tc / wg): the tuner picks by isolated,
# L2-flushed timings (cuBLASLt 21 vs tc 30 us for qkv at 64 tokens),
# but inside the graph our kernels overlap their weight loads with the
# previous kernel's tail (PDL) and cuBLASLt's cannot.  Prediction: lt
# ~= default (9.1-9.2 ms), tc / wg slower (+0.3-0.8 ms).  Plus the
# default prefill 2048 twice.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9l "${1:-build-r9l}"
bc def BT_X=1 -- --batch 64 --ctx 2048 --prefill 2048
bc lt BT_GEMV_FORCE=lt -- --batch 64 --ctx 2048 --prefill 0
bc tc BT_GEMV_FORCE=tc -- --batch 64 --ctx 2048 --prefill 0
bc wg BT_GEMV_FORCE=wg -- --batch 64 --ctx 2048 --prefill 0
bc def2 BT_X=1 -- --batch 64 --ctx 2048 --prefill 2048
{
  echo "## round 9l $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  bc_rows def lt tc wg def2
} > "$table"
cat "$table"
