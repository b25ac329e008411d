#!/bin/bash
# run_gpu_round11c.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: the persistent decode attention.  Round 11b's
# warp-local loads took the 64 x 2048 launch 144.5 -> 137.1 us; a fit over
# 64 x 512 and 64 x 2048 (same grid, two waves) gives 4.26 TB/s of
# streaming plus ~11 us fixed a launch, ~5 us of it per wave (block
# start, first tiles' latency, merge).  Now a grid of at most the
# resident blocks walks the items and each warp's pipeline runs on across
# them.
# (1) test_attn (all passes, incl. the new 3-block-grid pass), its decode
#     cases with one block per item (BT_ATTN_PERSIST=0), test_cuda_model;
# (2) bench_kernels --dec: persistent vs BT_ATTN_PERSIST=0;
# (3) the target rows: batch 1 / 8 / 64 at 2k (twice), PERSIST=0 once,
#     prefill 2048.
# Prediction: 64 x 2048 137 -> 131-134 us; 64 x 512 42 -> 38-40 us;
# batch 64 at 2k 8.99-9.03 -> 8.85-8.95 ms.
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda}, lib/,
# shared/.
# The persistent kernel and its switches (BT_ATTN_PERSIST, BT_ATTN_GRID)
# did not land; PERFORMANCE.md, round 11, section 5, describes it.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11c "${1:-build-r11c}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 200 stdbuf -oL "$c/gpu/test_attn"
run test_np 150 env BT_ATTN_PERSIST=0 KT_ATTN_FA2=0 stdbuf -oL "$c/gpu/test_attn"
run test_model 200 stdbuf -oL "$c/gpu/test_cuda_model"
run dec 100 "$c/gpu/bench_kernels" --dec
run dec_np 100 env BT_ATTN_PERSIST=0 "$c/gpu/bench_kernels" --dec
smi_start
bc a BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
bc np BT_ATTN_PERSIST=0 -- --batch 1,8,64 --ctx 2048 --prefill 0
bc a2 BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 2048
smi_stop
{
  echo "## round 11c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_np test_model
  for f in dec dec_np; do echo "### $f"; grep -h "^attn" "$tmp/$f"; done
  bc_rows a np a2
  smi_summary
} > "$table"
cat "$table"
