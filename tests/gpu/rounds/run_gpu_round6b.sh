#!/bin/bash
# run_gpu_round6b.sh [NEW] [OLD] - round 6, second device call
# (2026-12-01), ON THE DEVICE MACHINE: the prefill element-wise kernels
# (SwiGLU 4 chunks a thread with all loads first, RoPE+KV with the V copy
# and first chunk loaded before the sincos table, RMSNorm threads a row)
# from carry NEW against the same kernels of carry OLD (the code before
# them): their tests, bench_kernels --small, whole prefills and a decode
# check.  Writes $OUT/r6b.log and $OUT/r6b_table.md.  ~3 minutes.
# The one-pass SwiGLU and the RMSNorm thread counts it compares were
# reverted after its run (the switches BT_SWIGLU_U and BT_RMSNORM_THREADS
# no longer exist; see docs/PERFORMANCE.md round 6).
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6b "${1:-build-r6b}"
old=${2:-build-r6a}
for t in test_swiglu test_rmsnorm test_rope_kv; do run $t 120 "$c/gpu/$t"; done
run small_old 60 "$old/gpu/bench_kernels" --small --reps 15
run small_new 60 "$c/gpu/bench_kernels" --small --reps 15
run small_t128 60 env BT_RMSNORM_THREADS=128 "$c/gpu/bench_kernels" --small --reps 15
run small_t512 60 env BT_RMSNORM_THREADS=512 "$c/gpu/bench_kernels" --small --reps 15
run small_u0 60 env BT_SWIGLU_U=0 "$c/gpu/bench_kernels" --small --reps 15
bc new1 BT_X=1 -- --batch 1 --ctx 2048 --prefill 2048
c0=$c; c=$old; bc old1 BT_X=1 -- --batch 1 --ctx 2048 --prefill 2048; c=$c0
bc t128 BT_RMSNORM_THREADS=128 -- --batch 1 --ctx 2048 --prefill 2048
bc t512 BT_RMSNORM_THREADS=512 -- --batch 1 --ctx 2048 --prefill 2048
bc new2 BT_X=1 -- --batch 64 --ctx 2048 --prefill 2048,8192
c0=$c; c=$old; bc old2 BT_X=1 -- --batch 64 --ctx 2048 --prefill 2048,8192; c=$c0
{
  echo "## round 6b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_swiglu test_rmsnorm test_rope_kv
  for s in small_old small_new small_t128 small_t512 small_u0; do
    echo "### $s"; grep "^small" "$tmp/$s"
  done
  bc_rows new1 old1 t128 t512 new2 old2
} > "$table"
cat "$table"
