#!/bin/bash
# run_gpu_round14e.sh [CARRY] - round 14 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the landing code.  (1) `make gpu-test` on the carried
# build (tests/gpu/run_gpu_test.sh: every kernel test, the whole-model
# test); (2) bench_cuda batch 1 at 512 / 2k / 8k and batch 2 / 8 / 64 at
# 2k: new vs the round-14a binary with BT_O_PRELOAD=0 (= HEAD but the
# attention's stage-sized shared memory), interleaved R14E_REPS times
# (default 3); BT_ATTN_TRIG=late once; (3) a CUPTI trace of a batch-1
# step.
# Carry: gpu/{test_*,bench_cuda,bench_cuda_b,libbt_kernel_trace.so},
# lib/ (+ libcupti), shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r14e "${1:-build-r14e}"
export BT_SHARED_DIR=$PWD/$c/shared
reps=${R14E_REPS:-3}
report() {
  {
    echo "## round 14e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    cat "$out/gpu_test_table.md" 2>/dev/null
    for i in $(seq "$reps"); do bc_cols new$i old$i; done
    bc_cols late b2 b2old
    echo "### batch 1 step"; head -40 "$tmp/tl_b1" 2>/dev/null
  } > "$table"
}
run gpu_test 420 bash "$(dirname "$0")/../run_gpu_test.sh" "$c"
report
for i in $(seq "$reps"); do
  a="--batch 1 --ctx 512,2048,8192 --prefill 0"
  bc new$i BT_X=1 -- $a
  run bc_old$i 90 env BT_O_PRELOAD=0 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_old$i" $a
  report
done
bc late BT_ATTN_TRIG=late -- --batch 1 --ctx 512,2048,8192 --prefill 0
trace_step b1 bench_cuda -- --steps 4 --batch 1 --ctx 2048 --prefill 0
b="--batch 2,8,64 --ctx 2048 --prefill 0"
bc b2 BT_X=1 -- $b
run bc_b2old 90 env BT_O_PRELOAD=0 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b2old" $b
report
cat "$table"
