#!/bin/bash
# run_gpu_round12b.sh [CARRY] - round 12 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: stream-K decode attention, second version.  12a
# measured the first one 10% slower than the split kernel (64 x 2048:
# 155.1 vs 141.0 us a layer): runs over (token, KV head, tile) put
# neighbouring blocks on unrelated cache slots, and each tile's
# block-table entry was a dependent global load before its copies.  Now
# blocks come in groups of n_kv_heads over (token, tile) runs (the split
# kernel's slot locality) and the offsets are taken a tile ahead.  12a
# also measured the tile step moved into attn_decode_tc.cuh 1-4% slower
# in the split kernel; it now calls a masked or an unmasked instance.
# Same steps as run_gpu_round12a.sh; *_b = HEAD a268679.
# Prediction: sk 64 x 2048 <= 137 us (split ~139); split kernel back to
# HEAD's figures within 1%.
# (Ran when stream-K was on by default where items outnumbered block
# slots, so "p" rows are stream-K; it is opt-in now, BT_ATTN_SK=1.)
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda} and
# gpu/{bench_kernels,bench_cuda}_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r12b "${1:-build-r12b}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 150 stdbuf -oL "$c/gpu/test_attn"
run test_model 120 env BT_ATTN_SK=1 stdbuf -oL "$c/gpu/test_cuda_model"
run dec_b 60 "$c/gpu/bench_kernels_b" --dec
run dec_p 60 "$c/gpu/bench_kernels" --dec
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1,64,128 --ctx 2048 --prefill 0
  bc p$i BT_X=1 -- --batch 1,64,128 --ctx 2048 --prefill 0
  bc s$i BT_ATTN_SK=0 -- --batch 1,64,128 --ctx 2048 --prefill 0
done
bc p3 BT_X=1 -- --batch 64 --ctx 512,8192 --prefill 0
bc s3 BT_ATTN_SK=0 -- --batch 64 --ctx 512,8192 --prefill 0
smi_stop
{
  echo "## round 12b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model
  grep -h "stream-K" "$tmp/test_attn" | grep -c "^PASS" | sed 's/^/stream-K PASS lines: /'
  tail -2 "$tmp/test_attn"
  for f in dec_b dec_p; do echo "### $f"; grep -h "^attn" "$tmp/$f" | grep -v "plan=fill"; done
  bc_rows b1 p1 s1 b2 p2 s2 p3 s3
  smi_summary
} > "$table"
cat "$table"
