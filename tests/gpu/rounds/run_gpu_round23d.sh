#!/bin/bash
# run_gpu_round23d.sh [CARRY] - round 23 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: evict-first K / V is now the default ("def"); the
# projections' weights under a streaming access policy window
# (BT_GEMM_W_STREAMING=1, "ws", removed after this call: the same idea for the GEMMs' reads, if
# captured kernel nodes keep the stream's window) against it, ABBA at
# b1..b128 @2k on one BT_GEMM_CACHE file, a trace of a ws b64 step;
# the target rows twice (b1 / b64 @2k, prefill 2048); test_attn,
# test_cuda_model, test_spec_cuda at the new default.
# Carry: gpu/test_attn gpu/test_cuda_model gpu/test_spec_cuda gpu/bench_cuda gpu/libbt_kernel_trace.so, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r23d "${1:-build-r23d}"
export BT_SHARED_DIR=$PWD/$c/shared
declare -A env=([def]="BT_X=1" [ws]="BT_GEMM_W_STREAMING=1")
vs="def ws"
report() {
  {
    echo "## round 23d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn test_cuda_model test_spec_cuda 2>/dev/null
    grep -E '^(PASS|FAIL) golden' "$tmp/test_cuda_model" 2>/dev/null
    echo "b1 b8 b32 b64 b128 @2k"
    for v in $vs; do echo "$v: $(bc_steps ${v}_1 ${v}_2 ${v}_3 ${v}_4)"; done
    bc_rows t_1 t_2
    grep -h "read ceiling" "$tmp"/t_t_1 "$tmp"/t_t_2 2>/dev/null
  } > "$table"
}
bc warm BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1 --ctx 512 --prefill 0
a="--batch 1,8,32,64,128 --ctx 2048 --prefill 0"
for k in 1 2 3 4; do
  order=$vs; [ $((k % 2)) = 0 ] && order="ws def"
  for v in $order; do
    bc ${v}_$k ${env[$v]} BT_GEMM_CACHE=$tmp/gc.txt -- $a
  done
done
report
for r in 1 2; do
  bc t_$r BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
done
report
trace_step ws bench_cuda ${env[ws]} BT_GEMM_CACHE=$tmp/gc.txt -- --steps 3 --batch 64 --ctx 2048 --prefill 0
{ echo "### trace ws"; head -18 "$tmp/tl_ws"; head -1 "$log"; } > "$tmp/tail"
report; cat "$tmp/tail" >> "$table"
run test_attn 150 "$c/gpu/test_attn"
run test_cuda_model 150 "$c/gpu/test_cuda_model"
run test_spec_cuda 150 "$c/gpu/test_spec_cuda"
report; cat "$tmp/tail" >> "$table"
cat "$table"
