#!/bin/bash
# run_gpu_round13b.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) one batch-1 and one batch-64 step kernel by
# kernel, traced with CUPTI (gpu/libbt_kernel_trace.so through
# CUDA_INJECTION64_PATH; no nsys here), reduced by step_timeline.py;
# (2) the tuner's picks at 4-64 tokens without and with
# BT_GEMM_LT_SPLITK=1; (3) the engine rows of both, interleaved three
# times.  The table is rewritten after every step.
# Carry: gpu/bench_cuda, gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13b "${1:-build-r13b}"
report() {
  {
    echo "## round 13b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for b in 1 64; do echo "### batch $b timeline"; cat "$tmp/tl_b$b" 2>/dev/null | head -60; done
    for f in tune tunesk; do
      echo "### $f"
      echo '```'; grep -o "gemm tune t=\(4\|8\|16\|32\|64\) .*" "$tmp/$f" 2>/dev/null | cut -c1-200; echo '```'
    done
    echo "split variants dropped: $(grep -c disagrees "$tmp/tunesk" 2>/dev/null)"
    bc_rows def1 sk1 def2 sk2 def3 sk3
  } > "$table"
}
for b in 1 64; do
  trace_step b$b bench_cuda -- --steps 4 --batch $b --ctx 2048 --prefill 0
  { head -1 "$tmp/trace_b$b.csv"; tail -n 3000 "$tmp/trace_b$b.csv"; } | xz -T4 > "$out/trace_b$b.csv.xz"
  report
done
run tune 120 env BT_LOG=INFO "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 10 --batch 64 --ctx 2048 --prefill 0
run tunesk 150 env BT_LOG=INFO BT_GEMM_LT_SPLITK=1 "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 10 --batch 64 --ctx 2048 --prefill 0
report
for i in 1 2 3; do
  bc def$i BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
  bc sk$i BT_GEMM_LT_SPLITK=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
  report
done
cat "$table"
