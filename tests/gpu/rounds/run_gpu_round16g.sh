#!/bin/bash
# run_gpu_round16g.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the split combine's maximum and scales by one warp's
# shuffle reduction (instead of every thread walking the maxima) against
# call 5's binary (bench_cuda_b, AB_FROM=build-r16e); (1) test_attn;
# (2) batch 1 and 2 at 512 / 2k / 8k, interleaved three times;
# (3) the targets: batch 1 / 64 @2k, prefill 2048.
# Carry: gpu/{test_attn,bench_cuda,bench_cuda_b}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16g "${1:-build-r16g}"
report() {
  {
    echo "## round 16g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn 2>/dev/null
    for i in 1 2 3; do bc_cols new$i old$i; done
    echo "### targets"; bc_rows tgt
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
report
if grep -q "^FAIL" "$tmp/test_attn"; then cat "$table"; exit 0; fi
for i in 1 2 3; do
  bc new$i BT_X=1 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bcb old$i --batch 1,2 --ctx 512,2048,8192 --prefill 0
  report
done
bc tgt BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
report
cat "$table"
