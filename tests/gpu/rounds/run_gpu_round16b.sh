#!/bin/bash
# run_gpu_round16b.sh [CARRY] - round 16 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the fused MLP's grid barrier.  (1) test_gemm --norm
# (the fused MLP in every barrier mode, with the phase profile on);
# (2) bench_cuda batch 1 and 2 at 512 / 2k: the barrier with its words a
# line apart and relaxed polls (default, BT_GEMV_MLP_BAR=1), round 16a's
# (=0), with a 64 ns sleep a poll (=2), and no fused MLP (BT_GEMV_MLP=0),
# interleaved twice; (3) the per-block phase profile of the last layer of
# a batch-1 step @2k (BT_GEMV_MLP_PROF=1) in modes 1 and 0, batch 2 mode 1.
# Carry: gpu/{test_gemm,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r16b "${1:-build-r16b}"
vars="def bar0 bar2 off"
envof() { case $1 in def) echo BT_X=1;; bar0) echo BT_GEMV_MLP_BAR=0;; bar2) echo BT_GEMV_MLP_BAR=2;; off) echo BT_GEMV_MLP=0;; esac; }
report() {
  {
    echo "## round 16b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_gemm 2>/dev/null
    for i in 1 2; do for v in $vars; do bc_cols $v$i; done; done
    for p in p1 p0 p1b2; do echo "### profile $p"; grep -A7 "gemv_mlp phases" "$tmp/bc_$p" 2>/dev/null; done
  } > "$table"
}
run test_gemm 200 "$c/gpu/test_gemm" --norm
report
if grep -q "^FAIL gemv mlp" "$tmp/test_gemm" || ! grep -q "^PASS gemv mlp" "$tmp/test_gemm"; then
  echo "fused MLP failed its test: no benchmark" >> "$log"; cat "$table"; exit 0
fi
for i in 1 2; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1,2 --ctx 512,2048 --prefill 0; done
  report
done
bc p1 BT_GEMV_MLP_PROF=1 -- --batch 1 --ctx 2048 --prefill 0 --steps 5
bc p0 BT_GEMV_MLP_PROF=1 BT_GEMV_MLP_BAR=0 -- --batch 1 --ctx 2048 --prefill 0 --steps 5
bc p1b2 BT_GEMV_MLP_PROF=1 -- --batch 2 --ctx 2048 --prefill 0 --steps 5
report
cat "$table"
