#!/bin/bash
# run_gpu_round8h.sh [CARRY] - round 8 (2026-12-01), ON THE DEVICE
# MACHINE: fa2wq software-pipelined (the next tile's S on wgmma while
# this tile's softmax and P V run) against fa2: test_attn, test_cuda_model
# with fa2wq, bench_kernels --attn both ways, bench_cuda prefill 2048 /
# 8192 both ways, twice.
# Carry: gpu/{test_attn,test_cuda_model,bench_kernels,bench_cuda}, lib/,
# shared/models.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r8h "${1:-build-r8h}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_attn 200 "$c/gpu/test_attn"
run test_model_wq 200 env BT_PREFILL_KERNEL=fa2wq "$c/gpu/test_cuda_model"
run kattn 120 "$c/gpu/bench_kernels" --attn
run kattnwq 120 env BT_PREFILL_KERNEL=fa2wq "$c/gpu/bench_kernels" --attn
for r in a b; do
  bc f2$r BT_X=1 -- --batch 1 --ctx 64 --prefill 2048,8192
  bc wq$r BT_PREFILL_KERNEL=fa2wq -- --batch 1 --ctx 64 --prefill 2048,8192
done
{
  echo "## round 8h $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_model_wq
  grep -h "^attn " "$tmp/kattn" "$tmp/kattnwq"
  for f in f2a wqa f2b wqb; do
    echo "$f: $(grep -E '^\| prefill \|' "$tmp/t_$f" | cut -d'|' -f3,5 | tr '\n' ' ')"
  done
} > "$table"
cat "$table"
# Result (call 8, 15:04): fa2wq pipelined 192.6 us a layer at 2048 tokens
# against fa2 184.8 (246 registers); reverted, this script needs a build
# of that state to repeat the call.
