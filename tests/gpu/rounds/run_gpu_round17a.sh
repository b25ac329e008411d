#!/bin/bash
# run_gpu_round17a.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the RMSNorm weights folded into wqkv / w_gate|up
# (BT_NORM_FOLD, cuda_fold_norm) so the 1-token norm GEMVs stream from
# their PDL wait with no norm staged.  (1) test_gemm --norm (the folded
# cases); (2) bench_cuda b1 / b2 / b64 @2k, fold on and off, interleaved;
# (3) `make gpu-test` (also the first device run of 440818c).
# Carry: gpu/{test_*,bench_cuda}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17a "${1:-build-r17a}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 17a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    grep -E "fold" "$tmp/test_gemm" 2>/dev/null | grep -v "^PASS" | head -10
    for i in 1 2; do for v in fold nofold; do bc_cols $v$i; done; done
    cat "$out/gpu_test_table.md" 2>/dev/null
  } > "$table"
}
run test_gemm 150 "$c/gpu/test_gemm" --norm
report
for i in 1 2; do
  bc fold$i BT_X=1 -- --batch 1,2,64 --ctx 2048 --prefill 0
  bc nofold$i BT_NORM_FOLD=0 -- --batch 1,2,64 --ctx 2048 --prefill 0
  report
done
run gpu_test 300 bash "$(dirname "$0")/../run_gpu_test.sh" "$c"
report
cat "$table"
