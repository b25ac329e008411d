#!/bin/bash
# run_gpu_round11e.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the code that lands -- decode attention with
# warp-local tile loads (r11b's kernel without the lazy rescale, which
# measured nothing), fa2wqv as the default prefill attention.
# (1) test_attn, test_cuda_model, test_spec_cuda (draft-tree masks
#     through the decode kernel), test_cuda_tp (attention per rank);
# (2) bench_kernels --dec;
# (3) the target rows: batch 1 / 8 / 64 at 2k, prefill 2048 with the
#     default (fa2wqv) and BT_PREFILL_KERNEL=fa2, interleaved, twice.
# Prediction: batch 64 at 2k 8.99-9.04 ms as r11b; prefill fa2wqv
# 0.5-0.8 ms under fa2.
# Carry: gpu/{test_attn,test_cuda_model,test_spec_cuda,test_cuda_tp,
# bench_kernels,bench_cuda}, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11e "${1:-build-r11e}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 200 stdbuf -oL "$c/gpu/test_attn"
run test_model 200 stdbuf -oL "$c/gpu/test_cuda_model"
run test_spec 200 stdbuf -oL "$c/gpu/test_spec_cuda"
run test_tp 150 stdbuf -oL "$c/gpu/test_cuda_tp"
run dec 100 "$c/gpu/bench_kernels" --dec
smi_start
bc a1 BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc f1 BT_PREFILL_KERNEL=fa2 -- --batch 1 --ctx 512 --prefill 2048
bc a2 BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc f2 BT_PREFILL_KERNEL=fa2 -- --batch 1 --ctx 512 --prefill 2048
smi_stop
{
  echo "## round 11e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model test_spec test_tp
  grep -h "^attn" "$tmp/dec" | grep "plan=default"
  bc_rows a1 f1 a2 f2
  smi_summary
} > "$table"
cat "$table"
