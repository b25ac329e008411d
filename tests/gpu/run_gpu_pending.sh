#!/bin/bash
# run_gpu_pending.sh [CARRY] - the measurements a session without a GPU
# (2026-12-05 evening) left for the next device call, ON THE DEVICE
# MACHINE from a folder packed here (~6 minutes; delete this script once
# its figures are in docs/PERFORMANCE.md):
#   cmake --build build-cuda -j2 --target test_cuda_fp8 test_cuda_model \
#     bench_cuda bt_kernel_trace test_cuda_ipc_window
#   bash tests/gpu/pack_carry.sh pending tests/gpu/run_gpu_pending.sh \
#     gpu/test_cuda_fp8 gpu/test_cuda_model gpu/bench_cuda \
#     gpu/libbt_kernel_trace.so gpu/test_cuda_ipc_window shared
#   then run(carry=[".carry"], command="bash .carry/call.sh")
#   0. test_cuda_ipc_window: the CUDA IPC link's receive windows, now
#      through kv_link.c's shared slot table (kv_link__win_slots, merged
#      from s11-winslots without a GPU): hand-off byte-exact, stale
#      writers revoked, the made-ahead window (all checks must PASS).
#   1. BT_FP8_FAST_ACCUM's A/B (gemm.c): test_cuda_fp8 --paths (the 8B
#      linears' relative error vs the cpu and TFLOP/s, exact vs fast
#      accumulation); bench_cuda fp8 + FP8 KV, batch 1 / 64 @2k and
#      prefill 2053, A B B A (each variant its own BT_GEMM_CACHE, tuned by
#      its first run); test_cuda_model --fp8 with the switch on (top-1
#      against the cpu's fp8 mode, held to the test's bounds).
#      Measured on an H100 (2026-12-05, PERFORMANCE.md): prefill 2053
#      40.0 -> 35.2 ms, so fast accumulation is now the default; this
#      step wants the H200's figures (EX = exact, FA = the default).
#   1b. FP8 2048/2048's decode step at serving shape: fp8 + FP8 KV,
#      batch 128 and 224 at context 3072 (a 2048/2048 stream's mean),
#      exact and fast accumulation (the rows 12,500 tok/s needs: 224
#      rows in <= ~15 ms with the prefills between).
#   2. The mixed serving step (issue 36): bench_cuda --mixed in bf16 and
#      fp8 + FP8 KV (85 decode rows @2k + one 1,365-token chunk, two
#      683-token chunks @1024, the chunk alone), then the bf16 one under
#      the CUPTI tracer (step_timeline.py: where a mixed step's time goes).
# Writes pending.log and pending_table.md under $OUT; prints the table.
set -u
. "$(dirname "$0")/gpu_steps.sh"
gpu_steps_init pending "${1:-build-pending}"
[ -d "$c/shared/models" ] && export BT_SHARED_DIR=$PWD/$c/shared
FA=BT_FP8_FAST_ACCUM=1
EX=BT_FP8_FAST_ACCUM=0
CE="BT_GEMM_CACHE=$tmp/cache_exact"
CF="BT_GEMM_CACHE=$tmp/cache_fast"
FP8="--precision fp8 --kv-dtype fp8 --batch 1,64 --ctx 2048 --prefill 2053"
MIX=85:2048:1:1365:0,85:2048:2:683:1024,0:2048:1:1365:0

# 0. the CUDA IPC receive windows
run cipc_window 300 "$c/gpu/test_cuda_ipc_window"
# 1. fast accumulation
run fp8_paths 200 "$c/gpu/test_cuda_fp8" --paths
bc ex1 $EX "$CE" -- $FP8
bc fa1 $FA "$CF" -- $FP8
bc fa2 $FA "$CF" -- $FP8
bc ex2 $EX "$CE" -- $FP8
run model_fa 200 env $FA "$c/gpu/test_cuda_model" --fp8
SERVE8="--precision fp8 --kv-dtype fp8 --batch 128,224 --ctx 3072 --prefill 0"
bc s8ex $EX "$CE" -- $SERVE8
bc s8fa $FA "$CF" -- $SERVE8
# 2. the mixed step
bc mix_bf16 "$CE" -- --batch 1 --ctx 512 --prefill 0 --mixed $MIX
bc mix_fp8 $EX "$CE" -- --precision fp8 --kv-dtype fp8 --batch 1 \
  --ctx 512 --prefill 0 --mixed $MIX
trace_step mix bench_cuda "$CE" -- --steps 4 --batch 1 --ctx 512 \
  --prefill 0 --mixed 85:2048:1:1365:0

{
  echo "## pending measurements ($(date -u +%F\ %H:%M) UTC)"
  echo; cat "$tmp/rcs"; echo
  echo "### test_cuda_ipc_window"
  pass_fail cipc_window
  grep -E "^INFO" "$tmp/cipc_window" | head -8
  echo
  echo "### test_cuda_fp8 --paths"
  pass_fail fp8_paths
  grep -E "^(PASS|FAIL) fp8 cublaslt.* 2048 tokens|^INFO fp8 gemm 2048" \
    "$tmp/fp8_paths"
  echo; echo "### test_cuda_model --fp8, BT_FP8_FAST_ACCUM=1"
  pass_fail model_fa
  grep -E "top-1" "$tmp/model_fa" | head -12
  echo; echo "### bench_cuda fp8 + FP8 KV, A B B A (exact, fast, fast, exact)"
  bc_rows ex1 fa1 fa2 ex2
  echo "### fp8 + FP8 KV decode at 3072 (exact, fast)"
  bc_rows s8ex s8fa
  echo "### mixed steps"
  for t in mix_bf16 mix_fp8; do grep -E "^\| mixed" "$tmp/t_$t"; done
  echo; echo "### the bf16 mixed step's kernels (CUPTI)"
  head -40 "$tmp/tl_mix"
} > "$table"
cat "$table"
