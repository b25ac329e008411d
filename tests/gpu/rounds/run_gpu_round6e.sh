#!/bin/bash
# run_gpu_round6e.sh [CARRY] - round 6, fifth device call (2026-12-01),
# ON THE DEVICE MACHINE: late PDL triggers as the batch-1 default
# (cuda__pdl_late; BT_PDL_SMALL=0 the previous default, PDL off) against
# the old default, twice, and the checks of the changed kernels (GEMV,
# decode attention, RoPE, SwiGLU, the whole model and speculation).
# Writes $OUT/r6e.log and $OUT/r6e_table.md.  ~4 minutes.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r6e "${1:-build-r6e}"
export BT_SHARED_DIR=$PWD/$c/shared BT_SPEC_HEADS=$PWD/$c/shared/heads
bc late1 BT_X=1 -- --batch 1,8,64 --ctx 512,2048,8192 --prefill 0
bc off1 BT_PDL_SMALL=0 -- --batch 1 --ctx 512,2048,8192 --prefill 0
bc late2 BT_X=1 -- --batch 1 --ctx 512,2048,8192 --prefill 0
bc off2 BT_PDL_SMALL=0 -- --batch 1 --ctx 512,2048,8192 --prefill 0
bc late3 BT_X=1 -- --batch 1 --ctx 2048 --prefill 2048
for t in test_gemm test_attn test_rope_kv test_swiglu test_cuda_model test_spec_cuda; do
  run $t 200 "$c/gpu/$t"
done
{
  echo "## round 6e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_gemm test_attn test_rope_kv test_swiglu test_cuda_model test_spec_cuda
  grep -E "^(PASS|FAIL) golden" "$tmp/test_cuda_model"
  bc_rows late1 off1 late2 off2 late3
} > "$table"
cat "$table"
