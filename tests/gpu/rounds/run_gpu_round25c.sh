#!/bin/bash
# run_gpu_round25c.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: fa2pp128 as the default prefill attention at head
# 128 (fa3's overlap removed again):
#   1. test_attn, test_cuda_model and test_spec_cuda (tree verification
#      through the prefill kernel's masks) on the default;
#   2. bench_kernels --attn (default, fa2pp, fa2wqv);
#   3. the target rows twice (b1 / b64 @2k, prefill 512 / 2048 / 8192),
#      with fa2pp for the prefill in between.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/test_spec_cuda
# gpu/bench_kernels gpu/bench_cuda, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25c "${1:-build-r25c}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 25c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_model test_spec
    grep -h "^PASS golden\|^INFO bf16\|^PASS bf16\|^PASS synth" "$tmp/test_model" 2>/dev/null | head -4
    grep -h "^attn prefill" "$tmp/attn_b" 2>/dev/null
    bc_rows t1 pp t2
    head -1 "$log"
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
run test_model 150 stdbuf -oL "$c/gpu/test_cuda_model"
report; cat "$table"
run attn_b 60 "$c/gpu/bench_kernels" --attn
bc t1 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 512,2048,8192
bc pp BT_PREFILL_KERNEL=fa2pp BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 2048,8192
bc t2 BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 512,2048,8192
report; cat "$table"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
report; cat "$table"
