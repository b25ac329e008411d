#!/bin/bash
# run_gpu_round26d.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the ping-pong prefill kernels' producer as a warp
# (lane p reads page p's block-table entry and issues its copies) against
# round 25's one lane (BT_F2_PRODUCER=lane): test_attn, the phase profile
# of both (gpu/bench_kernels_prof, now with the producer's own wait and
# issue cycles), bench_kernels --attn ABBA, the engine's prefill ABBA.
# Carry: gpu/test_attn, gpu/bench_kernels(_prof), gpu/bench_cuda, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26d "${1:-build-r26d}"
run attn 200 "$c/gpu/test_attn"
run prof_w 90 "$c/gpu/bench_kernels_prof" --attn
run prof_l 90 env BT_F2_PRODUCER=lane "$c/gpu/bench_kernels_prof" --attn
run k_w1 60 "$c/gpu/bench_kernels" --attn
run k_l1 60 env BT_F2_PRODUCER=lane "$c/gpu/bench_kernels" --attn
run k_l2 60 env BT_F2_PRODUCER=lane "$c/gpu/bench_kernels" --attn
run k_w2 60 "$c/gpu/bench_kernels" --attn
gc=$tmp/gc.txt
args=(--batch 1 --ctx 512 --prefill 512,2048,8192)
bc warm BT_GEMM_CACHE=$gc -- "${args[@]}"
bc w1 BT_GEMM_CACHE=$gc -- "${args[@]}"
bc l1 BT_GEMM_CACHE=$gc BT_F2_PRODUCER=lane -- "${args[@]}"
bc l2 BT_GEMM_CACHE=$gc BT_F2_PRODUCER=lane -- "${args[@]}"
bc w2 BT_GEMM_CACHE=$gc -- "${args[@]}"
{
  echo "## round 26d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in prof_w prof_l; do echo "### $f"; grep -h "^attn prefill.*\(default\|fa2pp)\)\|^attn prof" "$tmp/$f" | grep -v "wg[01]: 1.0 tiles"; done
  for f in k_w1 k_l1 k_l2 k_w2; do echo "### $f"; grep -h "^attn prefill.*\(default\|fa2pp)\)" "$tmp/$f"; done
  for f in w1 l1 l2 w2; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
