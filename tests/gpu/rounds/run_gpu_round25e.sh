#!/bin/bash
# run_gpu_round25e.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: `make gpu-test` at the round's landing code
# (fa2pp128 the default prefill attention at head 128; mbar_wait's
# timeout by wg_abort instead of a trap), bench_kernels --attn, then the
# target rows twice (b1 / b64 @2k, prefill 512 / 2048 / 8192).
# Carry: the gpu-test binaries, bench_kernels, bench_cuda, lib/, shared.
set -u
c=${1:-build-r25e}
d=$(dirname "$0")
(
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
  bash "$d/../run_gpu_test.sh" "$c" | tail -18
)
. "$d/../gpu_steps.sh"
gpu_steps_init r25e "$c"
run attn_b 60 "$c/gpu/bench_kernels" --attn
for i in 1 2; do
  bc t$i BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 512,2048,8192
done
{
  echo "## round 25e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "^attn prefill" "$tmp/attn_b" 2>/dev/null
  bc_rows t1 t2
  head -1 "$log"
} > "$table"
cat "$table"
