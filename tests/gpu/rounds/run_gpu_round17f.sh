#!/bin/bash
# run_gpu_round17f.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: the split that holds the new key copies its tile
# before the PDL wait with the new key's row left out, and the fused
# RoPE prologue writes that row into shared memory (no fence, no copy
# after the wait).  (1) test_attn; (2) bench_cuda new vs the previous
# binary (bench_cuda_b), b1 / b2 @512 / 2k / 8k and b64 @2k, three
# interleaved rounds.  Carry: gpu/{test_attn,bench_cuda,bench_cuda_b},
# lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17f "${1:-build-r17f}"
report() {
  {
    echo "## round 17f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn 2>/dev/null
    for v in new old; do
      echo "### $v: b1@512 b2@512 b1@2k b2@2k b1@8k b2@8k step ms"
      for i in 1 2 3; do
        bc_steps "$v$i"
      done
      echo "### $v: b64@2k"
      for i in 1 2 3; do
        bc_steps "${v}64$i"
      done
    done
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
report
for i in 1 2 3; do
  bc new$i BT_X=1 -- --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bcb old$i --batch 1,2 --ctx 512,2048,8192 --prefill 0
  bc new64$i BT_X=1 -- --batch 64 --ctx 2048 --prefill 0
  bcb old64$i --batch 64 --ctx 2048 --prefill 0
  report
done
cat "$table"
