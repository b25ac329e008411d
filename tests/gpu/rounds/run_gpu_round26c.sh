#!/bin/bash
# run_gpu_round26c.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: (1) where fa2pp128's cycles go, by the phase
# profiler (gpu/bench_kernels_prof: a build with cmake
# -DBT_PREFILL_PROF=ON; bench_kernels --attn prints "attn prof" lines);
# (2) whether the GEMM tuner's prefill picks, timed on a cool board, are
# the fastest inside a power-capped prefill: prefill 2048 / 8192 with
# every one of cuBLASLt's first 8 candidates forced on all prefill
# shapes (BT_GEMM_BIG_PICK=i), the tuned default before and after.
# Carry: gpu/bench_kernels_prof, gpu/bench_kernels, gpu/bench_cuda, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26c "${1:-build-r26c}"
run prof 90 "$c/gpu/bench_kernels_prof" --attn
run plain 60 "$c/gpu/bench_kernels" --attn
args=(--batch 1 --ctx 512 --prefill 2048,8192)
run bc_d0 90 env BT_LOG=INFO BT_GEMM_CACHE=$tmp/gc_d.txt "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 20 --table "$tmp/t_d0" "${args[@]}"
for i in 0 1 2 3 4 5 6 7; do
  bc p$i BT_GEMM_CACHE=$tmp/gc_$i.txt BT_GEMM_BIG_PICK=$i -- "${args[@]}"
done
bc d1 BT_GEMM_CACHE=$tmp/gc_d.txt -- "${args[@]}"
{
  echo "## round 26c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -h "^attn prefill\|^attn prof" "$tmp/prof"
  grep -h "^attn prefill" "$tmp/plain"
  for f in d0 p0 p1 p2 p3 p4 p5 p6 p7 d1; do echo "$f: $(bc_ttft $f)"; done
  grep -ih "n_tok=2048\|2048 tok\|tuned.*2048" "$tmp/bc_d0" | head -12
  head -1 "$log"
} > "$table"
cat "$table"
