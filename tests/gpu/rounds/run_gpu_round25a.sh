#!/bin/bash
# run_gpu_round25a.sh [CARRY] - round 25 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the prefill attention on 128-key tiles
# (BT_PREFILL_KERNEL=fa2pp128, new: m64n128 S, 3 stages, the producer a
# whole warpgroup that gives the consumers its registers by setmaxnreg):
#   1. test_attn (its new fa2pp128 pass) and test_cuda_model with it;
#   2. bench_kernels --attn: fa2pp, fa2wqv, fa2pp128 at 512 / 2048 / 8192
#      tokens (predicted: 2048 from ~125 to 95-110 us a layer);
#   3. prefill 512 / 2048 / 8192 in the engine, fa2pp against fa2pp128,
#      ABBA x2 on one BT_GEMM_CACHE file.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/bench_kernels
# gpu/bench_cuda, lib/, shared.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r25a "${1:-build-r25a}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([pp]="BT_X=1" [p128]="BT_PREFILL_KERNEL=fa2pp128")
report() {
  {
    echo "## round 25a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn model128
    grep -h "fa2pp128" "$tmp/test_attn" 2>/dev/null | grep -v "^PASS" | head -5
    grep -h "^attn prefill" "$tmp/attn_b" 2>/dev/null
    for v in pp p128; do
      for k in 1 2; do
        echo "$v $k: $(bc_ttft ${v}_$k)"
      done
    done
    head -1 "$log"
  } > "$table"
}
run test_attn 200 "$c/gpu/test_attn"
report; cat "$table"
run attn_b 60 "$c/gpu/bench_kernels" --attn
run model128 150 env BT_PREFILL_KERNEL=fa2pp128 "$c/gpu/test_cuda_model"
report; cat "$table"
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 64
a="--batch 1 --ctx 512 --prefill 512,2048,8192"
for k in 1 2; do
  order="pp p128"; [ $k = 2 ] && order="p128 pp"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
  report
done
cat "$table"
