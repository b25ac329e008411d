#!/bin/bash
# run_gpu_round26b.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the prefill attention's softmax with fewer
# instructions (the mask pass behind one branch instead of a test per
# score pair, row maxima in four chains, l summed from f32 p in
# partials) against the binaries of round 26a (X_b): test_attn, then
# bench_kernels --attn / --attn-hd 64 in ABBA order, then the engine's
# prefill (synth:llama3-8b, 512 / 2048 / 8192 tokens) ABBA on one GEMM
# cache, then the new SASS opcode counts of fa2pp128.
# Carry: gpu/test_attn, gpu/bench_kernels(+_b), gpu/bench_cuda(+_b),
# obj/attn_prefill_fa2.cu.o, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26b "${1:-build-r26b}"
run attn 200 "$c/gpu/test_attn"
run k_a1 60 "$c/gpu/bench_kernels" --attn
run k_b1 60 "$c/gpu/bench_kernels_b" --attn
run k_b2 60 "$c/gpu/bench_kernels_b" --attn
run k_a2 60 "$c/gpu/bench_kernels" --attn
run h_a1 60 "$c/gpu/bench_kernels" --attn-hd 64
run h_b1 60 "$c/gpu/bench_kernels_b" --attn-hd 64
gc=$tmp/gc.txt
args=(--batch 1 --ctx 512 --prefill 512,2048,8192)
bc warm BT_GEMM_CACHE=$gc -- "${args[@]}"
bc a1 BT_GEMM_CACHE=$gc -- "${args[@]}"
run bc_b1 90 env BT_GEMM_CACHE=$gc "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b1" "${args[@]}"
run bc_b2 90 env BT_GEMM_CACHE=$gc "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b2" "${args[@]}"
bc a2 BT_GEMM_CACHE=$gc -- "${args[@]}"
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
run sass 60 "$cuobjdump" -sass "$c/obj/attn_prefill_fa2.cu.o"
xz -T4 -c "$tmp/sass" > "$out/attn_prefill_fa2.sass.xz"
{
  echo "## round 26b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in k_a1 k_b1 k_b2 k_a2 h_a1 h_b1; do
    echo "### $f"; grep -h "^attn prefill.*default" "$tmp/$f"; done
  for f in a1 b1 b2 a2; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
