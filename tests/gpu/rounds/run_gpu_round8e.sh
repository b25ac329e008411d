#!/bin/bash
# run_gpu_round8e.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: where a 2048-token prefill goes (bench_cuda --prefill 2048 with
# each per-layer op left out, BT_PROFILE_SKIP), fa2wq with 4 warps a
# block (2 blocks an SM) against fa2 and fa2wq (bench_kernels --attn,
# test_attn's fa2wq4 pass), and whether nsys is installed.
# Carry: gpu/{test_attn,bench_kernels,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8e "${1:-build-r8e}"
run test_attn 200 "$c/gpu/test_attn"
run kattn 120 env BT_PREFILL_KERNEL=fa2wq4 "$c/gpu/bench_kernels" --attn
for op in none norm qkv rope attn o gu swiglu down; do
  bc "skip_$op" BT_PROFILE_SKIP=$op -- --batch 1 --ctx 64 --prefill 2048
done
bc wq4 BT_PREFILL_KERNEL=fa2wq4 -- --batch 1 --ctx 64 --prefill 2048
{
  echo "## round 8e $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  echo "nsys: $(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)"
  pass_fail test_attn
  grep -h "^attn " "$tmp/kattn"
  for op in none norm qkv rope attn o gu swiglu down; do
    echo "skip $op: $(grep -E '^\| prefill \| 2048' "$tmp/t_skip_$op" | cut -d'|' -f5)"
  done
  echo "fa2wq4: $(grep -E '^\| prefill \| 2048' "$tmp/t_wq4" | cut -d'|' -f5)"
} > "$table"
cat "$table"
