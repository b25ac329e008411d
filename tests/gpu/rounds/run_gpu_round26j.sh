#!/bin/bash
# run_gpu_round26j.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: fa3 (FlashAttention-3's overlap inside a warpgroup,
# tile kt's softmax under tile kt-1's P V, K and V released apart)
# rebuilt on the producer warp: test_attn (its fa3 pass); the default
# (fa2pp128) against d60a7ee's binary (X_b: the consumer code was
# refactored into lambdas), then fa3 and fa2pp128, scattered and in
# order; fa3 in the engine.  (Cut to fit the session's last device
# minutes.)  Carry: gpu/test_attn, gpu/bench_kernels(_b), gpu/bench_cuda,
# lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26j "${1:-build-r26j}"
run attn 120 "$c/gpu/test_attn"
for v in "" _b; do
  i=$(( ${i:-0} + 1 ))
  run "d$i$v" 30 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/bench_kernels$v" --attn
done
for k in fa3 fa2pp128; do
  i=$(( ${i:-0} + 1 ))
  run "s$i$k" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels" --attn
  run "r$i$k" 30 env BT_PREFILL_KERNEL=$k "$c/gpu/bench_kernels" --attn-runs
done
gc=$tmp/gc.txt
bc warm BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048,8192
bc e1 BT_GEMM_CACHE=$gc BT_PREFILL_KERNEL=fa3 -- --batch 1 --ctx 512 --prefill 2048,8192
bc e2 BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048,8192
{
  echo "## round 26j $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in $(cd "$tmp" && ls | grep -E '^[dsr][0-9]' | sort -k1.2n); do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  for f in e1 e2; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
