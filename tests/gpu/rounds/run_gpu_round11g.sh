#!/bin/bash
# run_gpu_round11g.sh [CARRY] - round 11 (2026-12-01), ON THE DEVICE
# MACHINE, issue 4: fa2wqv with FlashAttention-3's intra-warpgroup
# overlap -- the next key tile's S = Q K^T is issued on wgmma before this
# tile's softmax and waited for together with this tile's P V (one stage
# more, so as many tiles stay in flight; 186-188 registers at head 128,
# was 156-160) -- against call 7's binaries (*_b: fa2wqv without it), in
# one call, interleaved.
# (1) test_attn (every prefill pass), test_cuda_model;
# (2) bench_kernels --attn, new and *_b;
# (3) prefill 2048, new and *_b, twice each.
# Prediction: attention at 2048 tokens 162 -> 130-145 us a layer (the S
# wgmma, ~1/4 of a tile's time, hidden under the softmax); prefill 2048
# -0.5 to -1.0 ms.
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda} and
# gpu/{bench_kernels,bench_cuda}_b, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r11g "${1:-build-r11g}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 200 stdbuf -oL "$c/gpu/test_attn"
run test_model 200 stdbuf -oL "$c/gpu/test_cuda_model"
run attn_p 100 "$c/gpu/bench_kernels" --attn
run attn_b 100 "$c/gpu/bench_kernels_b" --attn
smi_start
for i in 1 2; do
  run bc_b$i 90 "$c/gpu/bench_cuda_b" --model synth:llama3-8b --steps 20 --table "$tmp/t_b$i" --batch 1 --ctx 512 --prefill 2048
  bc p$i BT_X=1 -- --batch 1 --ctx 512 --prefill 2048
done
smi_stop
{
  echo "## round 11g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model
  grep -h "^FAIL" "$tmp/test_attn" | head -8
  echo "### new"; grep -h "^attn" "$tmp/attn_p"
  echo "### _b"; grep -h "^attn" "$tmp/attn_b"
  bc_rows b1 p1 b2 p2
  smi_summary
} > "$table"
cat "$table"
