#!/bin/bash
# run_gpu_round17b.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: does the decode attention find room beside the qkv
# GEMV?  (1) bench_cuda b1 / b2 / b64 @2k, interleaved x3: default;
# BT_ATTN_LOWREG=2 (the attention capped at 128 registers at <= 2
# tokens); BT_SMEM_CARVEOUT=100 (every kern_launch kernel prefers the
# largest shared-memory carveout); both; LOWREG=64; the folded norm with
# the carveout.  (2) test_attn with every decode case on the capped
# kernel.  Carry: gpu/{test_attn,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17b "${1:-build-r17b}"
vars="def lr cv lrcv lr64 foldcv"
envof() {
  case $1 in
    def) echo BT_X=1;;
    lr) echo BT_ATTN_LOWREG=2;;
    cv) echo BT_SMEM_CARVEOUT=100;;
    lrcv) echo BT_ATTN_LOWREG=2 BT_SMEM_CARVEOUT=100;;
    lr64) echo BT_ATTN_LOWREG=64;;
    foldcv) echo BT_NORM_FOLD=1 BT_SMEM_CARVEOUT=100;;
  esac
}
report() {
  {
    echo "## round 17b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for v in $vars; do
      echo "### $v: b1 / b2 / b64 step ms"
      for i in 1 2 3; do
        bc_steps "$v$i"
      done
    done
    pass_fail test_attn 2>/dev/null
  } > "$table"
}
for i in 1 2 3; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 1,2,64 --ctx 2048 --prefill 0; done
  report
done
run test_attn 150 env BT_ATTN_LOWREG=100000 "$c/gpu/test_attn"
report
cat "$table"
