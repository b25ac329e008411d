#!/bin/bash
# run_gpu_round15b.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the fused RMSNorm's scale moved to the row sums
# (gemv_norm_stage: one pass, no block sum): test_gemm --norm, then
# bench_cuda batch 1 at 512 / 2k / 8k and batch 2 @2k, new (bench_cuda)
# vs old (bench_cuda_b, AB_FROM), interleaved three times; a CUPTI trace
# of a batch-1 step of each.
# Carry: gpu/bench_cuda(+_b), gpu/test_gemm, gpu/libbt_kernel_trace.so, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15b "${1:-build-r15b}"
report() {
  {
    echo "## round 15b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm_norm
    for i in 1 2 3; do bc_cols new$i old$i; done
    for n in new old; do echo "### trace $n"; head -12 "$tmp/tl_$n" 2>/dev/null; grep -A12 "first 24" "$tmp/tl_$n" 2>/dev/null | sed -n 8,14p; done
  } > "$table"
}
run test_gemm_norm 150 "$c/gpu/test_gemm" --norm
report
for i in 1 2 3; do
  a="--batch 1 --ctx 512,2048,8192 --prefill 0"
  bc new$i BT_X=1 -- $a
  bcb old$i $a
  report
done
trace_step new bench_cuda -- --steps 4 --batch 1 --ctx 2048 --prefill 0
trace_step old bench_cuda_b -- --steps 4 --batch 1 --ctx 2048 --prefill 0
report
cat "$table"
