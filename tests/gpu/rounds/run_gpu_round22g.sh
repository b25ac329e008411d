#!/bin/bash
# run_gpu_round22g.sh [CARRY] - round 22 (2026-12-03), ON A 2-GPU DEVICE
# MACHINE (nvidia-h200-x2), issue 4: the GEMM tuner's graph capture
# (behind its lead) from tensor-parallel rank threads tuning at once:
# `test_cuda_tp check 2` (f32 TP = TP=1 = golden, bf16 8B teacher-forced
# with autotuning off and on, the all-reduces).  Carry: gpu/test_cuda_tp,
# lib/, shared.  NCCL from torch's pip package, as run_gpu_tp.sh finds it.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r22g "${1:-build-r22g}"
export BT_SHARED_DIR=$PWD/$c/shared NCCL_NVLS_ENABLE=0
nccl=$(python3 -c 'import nvidia.nccl as m, os
p = getattr(m, "__file__", None)
print(os.path.join(os.path.dirname(p) if p else list(m.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$nccl:$LD_LIBRARY_PATH
run tp2 200 "$c/gpu/test_cuda_tp" check 2
{
  echo "## round 22g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s, NCCL ${nccl:-none}"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail tp2
  grep -E "^(PASS|FAIL|INFO)" "$tmp/tp2" | cut -c1-200 | tail -30
} > "$table"
cat "$table"
