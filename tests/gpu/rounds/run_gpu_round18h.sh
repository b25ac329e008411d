#!/bin/bash
# run_gpu_round18h.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the decode attention's TMA copy (BT_ATTN_TMA=1,
# opt-in: attn_decode_tc_kernel<HD, false, true>, each warp's 16 K / V
# rows of a tile as TMA boxes on a per-warp mbarrier, read swizzled).
# (1) test_attn --bench without the fa2 prefill passes (KT_ATTN_FA2=0):
# the TMA passes of every decode case, then the kernel bench (tc, tc tma,
# general); (2) bench_cuda b64 @2k / 8k and b8 @2k, TMA on / off, two
# interleaved rounds.  Carry: gpu/{test_attn,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18h "${1:-build-r18h}"
report() {
  {
    echo "## round 18h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn 2>/dev/null
    grep -E "^decode attn" "$tmp/test_attn" 2>/dev/null
    for v in tma off; do
      echo "### $v: b8@2k b64@2k b64@8k step ms"
      for i in 1 2; do
        bc_steps "$v$i"
      done
    done
  } > "$table"
}
run test_attn 120 env KT_ATTN_FA2=0 "$c/gpu/test_attn" --bench
report
for i in 1 2; do
  bc tma$i BT_ATTN_TMA=1 -- --batch 8,64 --ctx 2048,8192 --prefill 0
  bc off$i BT_ATTN_TMA=0 -- --batch 8,64 --ctx 2048,8192 --prefill 0
  report
done
cat "$table"
