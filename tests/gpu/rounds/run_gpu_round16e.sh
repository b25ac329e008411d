#!/bin/bash
# run_gpu_round16e.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) `make gpu-test` on the landing build (the fused
# norm keeping x in registers); (2) a CUPTI trace of a batch-64 step @2k
# (where its 9.0 ms go: kernels, gaps, cuBLASLt against the rest);
# (3) bench_cuda batch 1 / 64 @2k with the norm registers on and off.
# Carry: gpu/{test_*,bench_cuda,libbt_kernel_trace.so}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16e "${1:-build-r16e}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 16e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    cat "$out/gpu_test_table.md" 2>/dev/null
    for v in def reg0; do bc_cols $v; done
    echo "### trace b64"; head -45 "$tmp/tl_b64" 2>/dev/null
  } > "$table"
}
run gpu_test 330 bash "$(dirname "$0")/../run_gpu_test.sh" "$c"
report
bc def BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 0
bc reg0 BT_GEMV_NORM_REG=0 -- --batch 1,64 --ctx 2048 --prefill 0
trace_step b64 bench_cuda -- --steps 4 --batch 64 --ctx 2048 --prefill 0
report
cat "$table"
