#!/bin/bash
# run_gpu_round17g.sh [CARRY] - round 17 (2026-12-02; prepared, NOT RUN:
# the session's device time ran out), ON THE DEVICE MACHINE, issue 4:
# the decode attention's new-row instance (attn_decode_tc_kernel<HD,
# NEWROW>, BT_ATTN_NEWROW=1: at <= 2 tokens with splits of <= 2 tiles the
# split holding the new key copies its tile before the PDL wait with the
# new key's row left out, and the fused RoPE prologue writes that row
# into shared memory).  17f measured the same path compiled into every
# step's kernel (b1 -0.02 to -0.04 ms, b64 +0.08).  (1) test_attn (its
# 1-2 token RoPE cases run the instance on and off); (2) test_cuda_model
# with it on; (3) bench_cuda on / off, b1 / b2 @512 / 2k / 8k and b64
# @2k, three interleaved rounds.  If all PASS and batch 1 gains: make it
# the default (attn_decode_tc.cu, cuda_attn_decode_tc).  Also the rows
# GEMV with rows from a ticket counter (cuda_gemv_dyn, BT_GEMV_DYN=qkv
# or qkv,down; opt-in, not run yet): test_gemm --norm has its cases, and
# the A/B runs it (round 17's profile: qkv's one-wave blocks ended 9 us
# apart).
# Carry: gpu/{test_attn,test_gemm,test_cuda_model,bench_cuda}, lib/,
# shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17g "${1:-build-r17g}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 17g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_gemm model_newrow model_dyn 2>/dev/null
    for v in on off dynq dynqd; do
      echo "### $v: b1@512 b2@512 b1@2k b2@2k b1@8k b2@8k / b64@2k step ms"
      for i in 1 2 3; do
        bc_steps "$v$i" "${v}64$i"
      done
    done
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
run test_gemm 150 "$c/gpu/test_gemm" --norm
run model_newrow 120 env BT_ATTN_NEWROW=1 "$c/gpu/test_cuda_model"
run model_dyn 120 env BT_GEMV_DYN=qkv,o,down "$c/gpu/test_cuda_model"
report
for i in 1 2 3; do
  bc on$i BT_ATTN_NEWROW=1 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bc off$i BT_ATTN_NEWROW=0 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bc on64$i BT_ATTN_NEWROW=1 -- --batch 64 --ctx 2048 --prefill 0
  bc off64$i BT_ATTN_NEWROW=0 -- --batch 64 --ctx 2048 --prefill 0
  bc dynq$i BT_GEMV_DYN=qkv -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bc dynqd$i BT_GEMV_DYN=qkv,down -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  report
done
cat "$table"
