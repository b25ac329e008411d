#!/bin/bash
# run_gpu_round18a.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: `make gpu-test` on the round-17 code (gemv.cu and
# attn_decode_tc.cu changed after the last device run), then the
# correctness half of 17g (test_gemm --norm with the ticket GEMV,
# test_cuda_model with BT_ATTN_NEWROW=1 and with BT_GEMV_DYN=qkv,o,down)
# and one interleaved A/B round: NEWROW on / off, DYN=qkv, DYN=qkv,down.
# Carry: the gpu-test binaries, bench_cuda, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18a "${1:-build-r18a}"
export BT_SHARED_DIR=$PWD/$c/shared
OUT=$out bash "$(dirname "$0")/../run_gpu_test.sh" "$c" > "$tmp/gputest" 2>&1
echo "gpu-test rc=$?" >> "$tmp/rcs"
report() {
  {
    echo "## round 18a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    tail -20 "$tmp/gputest"
    pass_fail test_gemm model_newrow model_dyn 2>/dev/null
    for v in on off dynq dynqd; do
      echo "### $v: b1@512 b2@512 b1@2k b2@2k b1@8k b2@8k / b64@2k step ms"
      bc_steps "$v" "${v}64"
    done
  } > "$table"
}
run test_gemm 150 "$c/gpu/test_gemm" --norm
run model_newrow 120 env BT_ATTN_NEWROW=1 "$c/gpu/test_cuda_model"
run model_dyn 120 env BT_GEMV_DYN=qkv,o,down "$c/gpu/test_cuda_model"
report
bc on BT_ATTN_NEWROW=1 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
bc off BT_ATTN_NEWROW=0 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
bc on64 BT_ATTN_NEWROW=1 -- --batch 64 --ctx 2048 --prefill 0
bc off64 BT_ATTN_NEWROW=0 -- --batch 64 --ctx 2048 --prefill 0
bc dynq BT_GEMV_DYN=qkv -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
bc dynqd BT_GEMV_DYN=qkv,down -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
report
cat "$table"
