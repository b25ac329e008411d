#!/bin/bash
# run_gpu_round26e.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: the ping-pong prefill producer reads the next tile's
# block-table entries a tile ahead, and copies a tile whose pages follow
# each other as one box a slab (runs; BT_F2_RUNS=0 off).  test_attn (a
# third of its batches now keep their blocks in order), the phase
# profile with scattered and in-order blocks, bench_kernels --attn /
# --attn-runs with runs on and off against round 26d's binary (X_b),
# the engine's prefill ABBA (runs on / off).
# Carry: gpu/test_attn, gpu/bench_kernels(_prof, _b), gpu/bench_cuda, lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26e "${1:-build-r26e}"
run attn 200 "$c/gpu/test_attn"
run prof_s 90 "$c/gpu/bench_kernels_prof" --attn
run prof_r 90 "$c/gpu/bench_kernels_prof" --attn-runs
run k_new 60 "$c/gpu/bench_kernels" --attn
run k_old 60 "$c/gpu/bench_kernels_b" --attn
run r_on 60 "$c/gpu/bench_kernels" --attn-runs
run r_off 60 env BT_F2_RUNS=0 "$c/gpu/bench_kernels" --attn-runs
run r_old 60 "$c/gpu/bench_kernels_b" --attn-runs
gc=$tmp/gc.txt
args=(--batch 1 --ctx 512 --prefill 512,2048,8192)
bc warm BT_GEMM_CACHE=$gc -- "${args[@]}"
bc on1 BT_GEMM_CACHE=$gc -- "${args[@]}"
bc off1 BT_GEMM_CACHE=$gc BT_F2_RUNS=0 -- "${args[@]}"
bc off2 BT_GEMM_CACHE=$gc BT_F2_RUNS=0 -- "${args[@]}"
bc on2 BT_GEMM_CACHE=$gc -- "${args[@]}"
{
  echo "## round 26e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail attn
  for f in prof_s prof_r; do echo "### $f"; grep -h "^attn prefill.*default\|^attn prof" "$tmp/$f" | grep -v "wg[01]: 1.0 tiles\|empty 0 issue 0" | awk '/default/ {n++} n % 1 == 0'; done
  for f in k_new k_old r_on r_off r_old; do echo "### $f"; grep -h "^attn prefill.*\(default\|fa2pp)\)" "$tmp/$f"; done
  for f in on1 off1 off2 on2; do echo "$f: $(bc_ttft $f)"; done
  head -1 "$log"
} > "$table"
cat "$table"
