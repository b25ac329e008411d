#!/bin/bash
# run_gpu_round11d.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the two decode-attention versions of round 11 in ONE
# call (every call so far got a fresh machine, and machines differ by up
# to 3% on the same binary): r11b's (warp-local loads, one block per
# item; binaries *_b, code not landed) against the persistent walk
# (r11c, current tree), interleaved, twice each.
# Prediction: equal within 1% (r11c showed PERSIST=0 and persistent
# equal); if so the simpler r11b structure lands.
# Carry: gpu/{bench_kernels,bench_cuda} and gpu/{bench_kernels,bench_cuda}_b,
# lib/.
# Ran binaries of uncommitted code (the persistent kernel, and call 4's
# as *_b); PERFORMANCE.md, round 11, section 5.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11d "${1:-build-r11d}"
for i in 1 2; do
  run dec_b$i 100 "$c/gpu/bench_kernels_b" --dec
  run dec_p$i 100 "$c/gpu/bench_kernels" --dec
done
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,8,64 --ctx 2048 --prefill 0
  bc p$i BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
done
smi_stop
{
  echo "## round 11d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in dec_b1 dec_p1 dec_b2 dec_p2; do echo "### $f"; grep -h "^attn" "$tmp/$f" | grep "plan=default"; done
  bc_rows b1 p1 b2 p2
  smi_summary
} > "$table"
cat "$table"
