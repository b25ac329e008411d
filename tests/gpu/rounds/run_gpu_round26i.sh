#!/bin/bash
# run_gpu_round26i.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the once-a-block runs check with its loads issued
# together (26h's early exit made them one at a time): test_attn;
# fa2pp128 with scattered and in-order blocks against 26h's binary
# (X_b), A B B A; the engine's prefill rows.
# Carry: gpu/test_attn, gpu/bench_kernels(_b), gpu/bench_cuda, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26i "${1:-build-r26i}"
run attn 200 "$c/gpu/test_attn"
for v in "" _b _b ""; do
  i=$(( ${i:-0} + 1 ))
  run "s$i$v" 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels$v" --attn
  run "r$i$v" 60 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels$v" --attn-runs
done
bc t1 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 512,2048,8192
bc t2 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 512,2048,8192
{
  echo "## round 26i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in s1 r1 s2_b r2_b s3_b r3_b s4 r4; do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  for f in t1 t2; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
