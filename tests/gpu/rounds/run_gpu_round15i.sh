#!/bin/bash
# run_gpu_round15i.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4 review: the mma / mma2 prefill kernels removed from
# attn_prefill.cu: test_attn (every remaining prefill variant), its
# --bench prefill table (the default first), and bench_cuda batch 1 @2k
# with the 2048-token prefill.
# Carry: gpu/test_attn, gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15i "${1:-build-r15i}"
report() {
  {
    echo "## round 15i $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn
    grep "prefill attn" "$tmp/test_attn" 2>/dev/null | head -20
    bc_rows b1
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn" --bench
report
bc b1 BT_X=1 -- --batch 1 --ctx 2048 --prefill 2048
report
cat "$table"
