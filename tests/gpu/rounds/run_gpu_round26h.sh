#!/bin/bash
# run_gpu_round26h.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: runs checked once a block (every block the tiles
# read adjacent in the pool) instead of once a tile: test_attn,
# test_cuda_model, test_spec_cuda; fa2pp128 with scattered and in-order
# blocks against call 5's binary (X_b, no runs), order A B B A; then the
# target rows twice.
# Carry: the three tests, gpu/bench_kernels(_b), gpu/bench_cuda, lib/,
# shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26h "${1:-build-r26h}"
export BT_SHARED_DIR=$PWD/$c/shared
run attn 200 "$c/gpu/test_attn"
run model 150 "$c/gpu/test_cuda_model"
run spec 200 "$c/gpu/test_spec_cuda"
for v in "" _b _b ""; do
  i=$(( ${i:-0} + 1 ))
  run "s$i$v" 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels$v" --attn
  run "r$i$v" 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels$v" --attn-runs
done
for i in 1 2; do
  bc t$i BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 512,2048,8192
done
{
  echo "## round 26h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn model spec
  for f in s1 r1 s2_b r2_b s3_b r3_b s4 r4; do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  bc_rows t1 t2
  head -1 "$log"
} > "$table"
cat "$table"
