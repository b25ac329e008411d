#!/bin/bash
# run_gpu_round13a.sh [CARRY] - round 13 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) the tuner's per-shape candidate times at 8-64
# tokens (BT_LOG=INFO), without and with BT_GEMM_LT_SPLITK=1 (split-K
# variants of cuBLASLt's picks), and the engine rows of both,
# interleaved; (2) where one batch-1 and one batch-64 step goes, kernel
# by kernel (nsys timeline of the graph's nodes when nsys is installed,
# reduced by tests/gpu/step_timeline.py).  The table is rewritten after
# every step (the call may be cut short).  Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r13a "${1:-build-r13a}"
here=$(dirname "$0")/..
report() {
  {
    echo "## round 13a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/info"; cat "$tmp/rcs" | tr '\n' ' '; echo
    for f in tune tunesk; do
      echo "### $f"; grep -E "^\| decode " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f2-6
      echo '```'; grep -o "gemm tune t=\(4\|8\|16\|32\|64\) .*" "$tmp/$f" 2>/dev/null | cut -c1-230; echo '```'
    done
    echo "split variants dropped: $(grep -c disagrees "$tmp/tunesk" 2>/dev/null)"
    bc_rows def1 sk1 def2 sk2
    for b in 1 64; do echo "### batch $b timeline"; cat "$tmp/tl_b$b" 2>/dev/null | head -70; done
  } > "$table"
}
nsys=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}" >> "$tmp/info"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader >> "$tmp/info" 2>&1
run tune 120 env BT_LOG=INFO "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 10 --batch 1,64 --ctx 2048 --prefill 0 --table "$tmp/t_tune"
run tunesk 150 env BT_LOG=INFO BT_GEMM_LT_SPLITK=1 "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 10 --batch 1,64 --ctx 2048 --prefill 0 --table "$tmp/t_tunesk"
report
bc def1 BT_X=1 -- --batch 8,32,64 --ctx 2048 --prefill 0
bc sk1 BT_GEMM_LT_SPLITK=1 -- --batch 8,32,64 --ctx 2048 --prefill 0
report
for b in 1 64; do
  [ -n "$nsys" ] || break
  run nsys_b$b 120 "$nsys" profile -t cuda --cuda-graph-trace=node -f true -o "$tmp/b$b" \
    "$c/gpu/bench_cuda" --model synth:llama3-8b --steps 4 --batch $b --ctx 2048 --prefill 0
  run stats_b$b 120 "$nsys" stats -r cuda_gpu_trace -f csv -o "$tmp/b$b" "$tmp/b$b.nsys-rep"
  f=$(ls "$tmp"/b${b}*cuda_gpu_trace*.csv 2>/dev/null | head -1)
  if [ -n "$f" ]; then
    run tl_b$b 60 python3 "$here/step_timeline.py" "$f"
    { head -1 "$f"; tail -n 4000 "$f"; } | xz -T4 > "$out/trace_b$b.csv.xz"
  fi
  report
done
bc def2 BT_X=1 -- --batch 8,32,64 --ctx 2048 --prefill 0
bc sk2 BT_GEMM_LT_SPLITK=1 -- --batch 8,32,64 --ctx 2048 --prefill 0
report
cat "$table"
