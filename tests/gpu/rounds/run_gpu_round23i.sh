#!/bin/bash
# run_gpu_round23i.sh [CARRY] - prepared in round 23 (2026-12-03) for the
# next session, ON THE DEVICE MACHINE, issue 4: the down projection as
# K-slice partials with their reduction, the residual add and the next
# layer's RMSNorm in one kernel (BT_DOWN_KSPLIT=S, opt-in, compiled and
# CPU-built only): test_rmsnorm (cuda_rmsnorm_parts against the CPU
# reference), test_cuda_model with S = 4 (the synthetic bf16 agreement
# runs it where the hidden size allows), then ABBA of the default
# against S = 2 / 4 at b8..b128 @2k on one BT_GEMM_CACHE file and traces
# of a b64 step (default, S = 4). Predicted: -1.6..-2.3 us a layer at
# b64 if the strided-batched product (the heuristic's pick, untuned) is
# as fast as cuBLASLt's tuned split-K one (31.9 us).
# Carry: gpu/test_rmsnorm gpu/test_cuda_model gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23i "${1:-build-r23i}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([def]="BT_X=1" [ks2]="BT_DOWN_KSPLIT=2" [ks4]="BT_DOWN_KSPLIT=4")
vs="def ks2 ks4"
report() {
  {
    echo "## round 23i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_rmsnorm test_cuda_model_ks4 2>/dev/null
    echo "b8 b32 b64 b128 @2k"
    for v in $vs; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    head -1 "$log"
  } > "$table"
}
run test_rmsnorm 60 "$c/gpu/test_rmsnorm"
run test_cuda_model_ks4 150 env BT_DOWN_KSPLIT=4 BT_LOG=INFO "$c/gpu/test_cuda_model"
report
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order=$vs; [ $((k % 2)) = 0 ] && order="ks4 ks2 def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
trace_step def bench_cuda BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
trace_step ks4 bench_cuda ${env[ks4]} BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
report
for t in def ks4; do echo "### trace $t"; head -16 "$tmp/tl_$t"; done >> "$table"
cat "$table"
