#!/bin/bash
# run_gpu_round26a.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the head-64 default prefill attention (fa2wqv, was
# fa2pp) checked in the engine on synth:llama3.2-1b (head 64) against
# fa2pp, ABBA on one GEMM cache; test_attn and test_cuda_model on the
# new default; the SASS of the prefill attention object with the
# opcode counts of fa2pp128's instance (where its ~1000 instructions a
# warp per 128-key tile go, round 25h's Nsight count).
# Carry: gpu/test_attn, gpu/test_cuda_model, gpu/bench_kernels,
# gpu/bench_cuda, obj/attn_prefill_fa2.cu.o, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26a "${1:-build-r26a}"
export BT_SHARED_DIR=$PWD/$c/shared
run attn 200 "$c/gpu/test_attn"
run model 150 "$c/gpu/test_cuda_model"
run hd64 60 "$c/gpu/bench_kernels" --attn-hd 64
export BC_MODEL=synth:llama3.2-1b
gc=$tmp/gc.txt
args=(--batch 1,64 --ctx 2048 --prefill 512,2048,8192)
bc warm BT_GEMM_CACHE=$gc -- "${args[@]}"
bc a1 BT_GEMM_CACHE=$gc -- "${args[@]}"
bc b1 BT_GEMM_CACHE=$gc BT_PREFILL_KERNEL=fa2pp -- "${args[@]}"
bc b2 BT_GEMM_CACHE=$gc BT_PREFILL_KERNEL=fa2pp -- "${args[@]}"
bc a2 BT_GEMM_CACHE=$gc -- "${args[@]}"
# SASS: the whole object, then fa2pp128's instance's opcode histogram
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
run sass 60 "$cuobjdump" -sass "$c/obj/attn_prefill_fa2.cu.o"
xz -T4 -c "$tmp/sass" > "$out/attn_prefill_fa2.sass.xz"
awk '/Function : .*attn_prefill_fa2_kernel.*Li128ELi8ELb1ELb1ELb1ELi128E/ {on=1; next}
     /Function :/ {on=0}
     on && /\/\*[0-9a-f][0-9a-f][0-9a-f][0-9a-f]\*\// {
       sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]+/, ""); sub(/^@!?U?P[0-9T] +/, ""); split($0, w, /[ .;]/); n[w[1]]++; tot++}
     END {for (k in n) printf "%6d %s\n", n[k], k; printf "%6d total\n", tot}' \
  "$tmp/sass" | sort -rn > "$out/fa2pp128_ops.txt"
{
  echo "## round 26a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn model
  grep -h "^attn prefill" "$tmp/hd64" 2>/dev/null
  bc_rows a1 b1 b2 a2
  head -25 "$out/fa2pp128_ops.txt"
  head -1 "$log"
} > "$table"
cat "$table"
