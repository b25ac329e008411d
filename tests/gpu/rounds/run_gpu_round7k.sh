#!/bin/bash
# run_gpu_round7k.sh [CARRY] - round 7 (2026-12-01), ON THE DEVICE
# MACHINE: the device argmax with 8 float4 loads in flight a thread
# (test_sample: against argmax_ref incl. odd vocabs, and its time at
# 1 / 64 rows of 128K), bench_cuda's "+sample" column (greedy ids on the
# device) at batch 1 / 64, 256 and 2048 context, and bench-engine's
# chain of one at batch 64 (plain and verification both sample on the
# device).  Carry: bin/baton, gpu/{test_sample,bench_cuda}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r7k "${1:-build-r7k}"
run test_sample 120 "$c/gpu/test_sample"
bc s256 BT_X=1 -- --batch 1,64 --ctx 256 --prefill 0
bc s2k BT_X=1 -- --batch 1,64 --ctx 2048 --prefill 0
run chain1 120 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --ctx 256 --steps 16 --spec-accept-rate 0.8 --batch 64 --spec-tokens 1 --spec-topk 1
{
  echo "## round 7k $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_sample
  grep -h "^INFO argmax" "$tmp/test_sample"
  for f in s256 s2k; do echo "### $f"; grep -E "^\| decode " "$tmp/t_$f"; done
  echo '```'; grep -hE "^ *(batch|[0-9]+ +(plain|[0-9]+)) " "$tmp/chain1"; echo '```'
  grep -h "bench-engine: batch" "$tmp/chain1"
} > "$table"
cat "$table"
