#!/bin/bash
# run_gpu_round10b.sh [CARRY] - round 10 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the L2 flush before a timed GEMM.  bench_kernels and
# the tuner used to flush with a 128-256 MB memset, which leaves L2 full
# of dirty lines whose write-back the timed kernel pays; a read-only
# flush leaves clean lines as inside a decode step.  bench_kernels --gemv
# at 8 / 64 tokens with the read flush (the new default); bench_cuda at
# batch 1 / 8 / 64 @2k with the tuner on the read flush (default), on the
# old write flush (BT_GEMM_FLUSH=write), with tma forced everywhere, and
# with tma disabled.
# Prediction: isolated figures drop ~5-8 us for the small shapes (qkv, o);
# the tuner's picks and the in-graph steps change little (+-1%); forced
# tma shows whether the tma kernel wins inside the graph where the tuner
# would not pick it.
# Carry: gpu/{bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r10b "${1:-build-r10b}"
run kern 150 "$c/gpu/bench_kernels" --gemv --toks 8,64
bc read BT_LOG=INFO -- --batch 1,8,64 --ctx 2048 --prefill 0
bc write BT_GEMM_FLUSH=write -- --batch 1,8,64 --ctx 2048 --prefill 0
bc ftma BT_GEMV_FORCE=tma -- --batch 1,8,64 --ctx 2048 --prefill 0
bc notma BT_GEMV_DISABLE=tma -- --batch 1,8,64 --ctx 2048 --prefill 0
{
  echo "## round 10b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -hE "^gemv(sum)? " "$tmp/kern" | sed 's/mma1.*tc /tc /'
  bc_rows read write ftma notma
  grep -h "gemm tune t=" "$tmp/bc_read" | sed 's/.*gemm tune/tune/' | head -40
} > "$table"
cat "$table"
