#!/bin/bash
# run_gpu_round7f.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE, the session's last checks: test_cuda_model (the backend now
# keeps every hidden row of a step on the device), bench_cuda's defaults
# (batch 1 / 64 at 2k, prefill 2048: no regression), and bench-engine's
# chain of 2 at batch 64 (the round-6 "KV pool full" case: bench_prefill
# no longer decodes finished prompts while others prefill) next to the
# chain of 1.  Carry: bin/baton, gpu/{test_cuda_model,bench_cuda}, lib/,
# shared/models.  Writes $OUT/r7f.log and $OUT/r7f_table.md.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7f "${1:-build-r7f}"
export BT_SHARED_DIR=$PWD/$c/shared
run test_cuda_model 120 "$c/gpu/test_cuda_model"
bc def BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 2048
run chains 150 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 1,2 --spec-topk 1
{
  echo "## round 7f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_cuda_model
  grep -hE "^(PASS|FAIL) (golden|bf16)" "$tmp/test_cuda_model" | head -4
  bc_rows def
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) |KV pool" "$tmp/chains"; echo '```'
  grep -h "bench-engine: batch" "$tmp/chains"
} > "$table"
cat "$table"
