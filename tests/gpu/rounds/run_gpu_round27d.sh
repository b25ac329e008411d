#!/bin/bash
# run_gpu_round27d.sh [CARRY] - round 27 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: fa3's producer issues V a tile behind K (the order
# its consumers wait in) and reuses K's slots; every producer reads its
# page's slot before the empty wait.  test_attn (its fa3 pass), then
# bench_kernels --attn / --attn-runs for the default and fa3 against
# 9c454ce's binary (X_b) in ABBA order, then the engine's prefill with
# fa3 and the default, ABBA, on one GEMM cache file.
# Carry: gpu/test_attn, gpu/bench_kernels(_b), gpu/bench_cuda, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r27d "${1:-build-r27d}"
run attn 120 "$c/gpu/test_attn"
i=0
for v in "" _b _b ""; do
  for k in fa2pp128 fa3; do
    i=$((i + 1))
    run "s$i$k$v" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels$v" --attn
    run "r$i$k$v" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels$v" --attn-runs
  done
done
gc=$tmp/gc.txt
bc warm BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048,8192
bc e1fa3 BT_GEMM_CACHE=$gc BT_PREFILL_KERNEL=fa3 -- --batch 1 --ctx 512 --prefill 2048,8192
bc e2def BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048,8192
bc e3def BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048,8192
bc e4fa3 BT_GEMM_CACHE=$gc BT_PREFILL_KERNEL=fa3 -- --batch 1 --ctx 512 --prefill 2048,8192
{
  echo "## round 27d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in $(cd "$tmp" && ls | grep -E '^[sr][0-9]' | sort -k1.2n); do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  for f in e1fa3 e2def e3def e4fa3; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
