#!/bin/bash
# run_gpu_round25f.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the prefill attention's wgmma descriptors built once
# a tile and advanced by one add a k step (wg_desc_add) instead of ~14
# instructions before every wgmma (call 2's Nsight: ~1150 instructions a
# warp a tile, the kernel issue-bound at 2 warps a scheduler).
# Predicted -5 to -10% at 2048 / 8192 tokens.  A/B against the binaries
# of bdcf62e (`*_b`, AB_FROM=build-r25e).
#   1. test_attn;
#   2. bench_kernels --attn, new and old, twice (ABBA);
#   3. prefill 2048 / 8192 in the engine, new and old, ABBA.
# Carry: gpu/test_attn gpu/bench_kernels gpu/bench_cuda (+ _b), lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25f "${1:-build-r25f}"
report() {
  {
    echo "## round 25f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn
    for f in kn1 ko1 ko2 kn2; do
      echo "### $f"; grep -h "^attn prefill" "$tmp/$f" 2>/dev/null | grep "default"
    done
    for v in new_1 old_1 old_2 new_2; do
      echo "$v: $(bc_ttft $v)"
    done
    head -1 "$log"
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
report; cat "$table"
run kn1 60 "$c/gpu/bench_kernels" --attn
run ko1 60 "$c/gpu/bench_kernels_b" --attn
run ko2 60 "$c/gpu/bench_kernels_b" --attn
run kn2 60 "$c/gpu/bench_kernels" --attn
report; cat "$table"
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 64
a="--batch 1 --ctx 512 --prefill 2048,8192"
bc new_1 BT_GEMM_CACHE=$tmp/gc.txt -- $a
run bc_old_1 90 env BT_GEMM_CACHE=$tmp/gc.txt "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_old_1" $a
run bc_old_2 90 env BT_GEMM_CACHE=$tmp/gc.txt "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_old_2" $a
bc new_2 BT_GEMM_CACHE=$tmp/gc.txt -- $a
report; cat "$table"
