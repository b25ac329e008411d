#!/bin/bash
# run_gpu_round19b.sh [CARRY] - round 19 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the decode attention's TMA copy at two stages
# (BT_ATTN_TMA=2: 65 KB of shared memory, three blocks an SM instead of
# two) against three stages (BT_ATTN_TMA=3, round 18h's kernel) and the
# cp.async copy (0).  (1) test_attn --bench without the fa2 prefill
# passes (KT_ATTN_FA2=0): every TMA pass, then the kernel bench; (2)
# bench_cuda b32 / b64 / b128 @2k, the three copies, two
# interleaved rounds.  Carry: gpu/{test_attn,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r19b "${1:-build-r19b}"
report() {
  {
    echo "## round 19b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn 2>/dev/null
    grep -E "^decode attn" "$tmp/test_attn" 2>/dev/null
    for v in t3 t2 off; do
      echo "### $v: b32@2k b64@2k b128@2k step ms"
      for i in 1 2; do
        bc_steps "$v$i"
      done
    done
  } > "$table"
}
run test_attn 150 env KT_ATTN_FA2=0 "$c/gpu/test_attn" --bench
report
for i in 1 2; do
  bc t3$i BT_ATTN_TMA=3 -- --batch 32,64,128 --ctx 2048 --prefill 0
  bc t2$i BT_ATTN_TMA=2 -- --batch 32,64,128 --ctx 2048 --prefill 0
  bc off$i BT_ATTN_TMA=0 -- --batch 32,64,128 --ctx 2048 --prefill 0
  report
done
cat "$table"
