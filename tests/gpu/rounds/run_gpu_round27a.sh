#!/bin/bash
# run_gpu_round27a.sh [CARRY] - round 27 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: round 26's review commit (5b2ef62: the wgmma chains
# as lambdas, never run) checked: `make gpu-test` on its binaries, then
# bench_kernels --attn / --attn-runs against 0218186's (X_b) in ABBA
# order.  `make gpu-bench` is the next call (run_gpu_round27b.sh).
# Carry: the gpu-test binaries, bench_kernels(_b), bench_cuda, lib/, shared.
set -u
c=${1:-build-r27a}
d=$(dirname "$0")
(
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_SHARED_DIR=$PWD/$c/shared BT_LOG=${BT_LOG:-WARN}
  bash "$d/../run_gpu_test.sh" "$c" | tail -18
)
. "$d/../gpu_steps.sh"
gpu_steps_init r27a "$c"
i=0
for v in "" _b _b ""; do
  i=$((i + 1))
  run "s$i$v" 30 "$c/gpu/bench_kernels$v" --attn
  run "r$i$v" 30 "$c/gpu/bench_kernels$v" --attn-runs
done
run s9fa3 30 env BT_PREFILL_KERNEL=fa3 "$c/gpu/bench_kernels" --attn
run r9fa3 30 env BT_PREFILL_KERNEL=fa3 "$c/gpu/bench_kernels" --attn-runs
{
  echo "## round 27a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in $(cd "$tmp" && ls | grep -E '^[sr][0-9]' | sort -k1.2n); do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  head -1 "$log"
} > "$table"
cat "$table"
