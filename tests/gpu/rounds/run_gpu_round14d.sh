#!/bin/bash
# run_gpu_round14d.sh [CARRY] - round 14 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the rows GEMV with the fused RMSNorm loading its norm
# weights' first chunks before the PDL wait (round 14c's 2 U chunks
# before the wait spilled and is gone), and BT_ATTN_TRIG=combine / top.
# (1) test_gemm --norm and --variant rows / rows8, test_cuda_model (also
# with BT_ATTN_TRIG=combine); (2) bench_cuda batch 1 at 512 / 2k / 8k,
# batch 2 / 8 / 64 at 2k: new vs the round-14a binary with
# BT_O_PRELOAD=0 (= HEAD but the attention's stage-sized shared memory)
# vs BT_ATTN_TRIG=top / combine vs BT_ATTN_SPLIT=128 (alone and with
# combine), interleaved R14D_REPS times (default 3); (3) a CUPTI trace of
# a batch-1 step with BT_ATTN_TRIG=combine.
# Carry: gpu/{bench_cuda,bench_cuda_b,test_gemm,test_cuda_model,
# libbt_kernel_trace.so}, lib/ (+ libcupti), shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r14d "${1:-build-r14d}"
export BT_SHARED_DIR=$PWD/$c/shared
reps=${R14D_REPS:-3}
report() {
  {
    echo "## round 14d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm_norm test_gemm_rows test_gemm_rows8 test_cuda_model test_cuda_model_tc
    for i in $(seq "$reps"); do bc_cols new$i old$i ttop$i tcomb$i s128_$i s128c_$i; done
    bc_cols b2 b2c b2old
    echo "### batch 1 step"; head -40 "$tmp/tl_b1" 2>/dev/null
  } > "$table"
}
ab() {
  local i=$1 a="--batch 1 --ctx 512,2048,8192 --prefill 0"
  bc new$i BT_X=1 -- $a
  run bc_old$i 90 env BT_O_PRELOAD=0 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_old$i" $a
  bc ttop$i BT_ATTN_TRIG=top -- $a
  bc tcomb$i BT_ATTN_TRIG=combine -- $a
  bc s128_$i BT_ATTN_SPLIT=128 -- --batch 1 --ctx 2048 --prefill 0
  bc s128c_$i BT_ATTN_SPLIT=128 BT_ATTN_TRIG=combine -- --batch 1 --ctx 2048 --prefill 0
  report
}
run test_gemm_norm 150 "$c/gpu/test_gemm" --norm
run test_gemm_rows 150 "$c/gpu/test_gemm" --variant rows
run test_gemm_rows8 150 "$c/gpu/test_gemm" --variant rows8
report
ab 1
trace_step b1 bench_cuda BT_ATTN_TRIG=combine -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
run test_cuda_model 240 "$c/gpu/test_cuda_model"
run test_cuda_model_tc 240 env BT_ATTN_TRIG=combine "$c/gpu/test_cuda_model"
report
for i in $(seq 2 "$reps"); do ab $i; done
b="--batch 2,8,64 --ctx 2048 --prefill 0"
bc b2 BT_X=1 -- $b
bc b2c BT_ATTN_TRIG=combine -- $b
run bc_b2old 90 env BT_O_PRELOAD=0 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b2old" $b
report
cat "$table"
