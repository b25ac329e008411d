#!/bin/bash
# run_gpu_round15h.sh [CARRY] - round 15 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the landing code.  (1) `make gpu-test` on the carried
# build (tests/gpu/run_gpu_test.sh); (2) the decode attention triggering
# once its keys are consumed (BT_ATTN_TRIG=loop) vs the default, batch 1
# at 512 / 2k / 8k and batch 2 @2k, interleaved twice; (3) the engine
# sweep of `make gpu-bench` (decode batch 1-128 x 512 / 2k / 8k, prefill
# 512 / 2k / 8k), without the transformers run.
# Carry: gpu/{test_*,bench_cuda}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r15h "${1:-build-r15h}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 15h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    cat "$out/gpu_test_table.md" 2>/dev/null
    for i in 1 2; do bc_cols def$i loop$i; done
    echo "### sweep"; cat "$tmp/t_sweep" 2>/dev/null
  } > "$table"
}
run gpu_test 330 bash "$(dirname "$0")/../run_gpu_test.sh" "$c"
report
for i in 1 2; do
  a="--batch 1,2 --ctx 512,2048,8192 --prefill 0"
  bc def$i BT_X=1 -- $a
  bc loop$i BT_ATTN_TRIG=loop -- $a
  report
done
run bc_sweep 200 "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1,8,32,64,128 --ctx 512,2048,8192 --prefill 512,2048,8192 \
  --table "$tmp/t_sweep"
report
cat "$table"
