#!/bin/bash
# run_gpu_tc.sh [CARRY] - round 5 of issues 4/6 ON THE DEVICE MACHINE from
# a carried build (nothing is rebuilt): the tensor-core skinny GEMM
# ("tc", kernels/gemv_tc.cu) and the new defaults (fa2 prefill).
#   1. test_gemm (every GEMV variant incl. tc with and without split K,
#      worker_gemm), test_attn (fa2 now the default prefill kernel);
#   2. bench_kernels --gemv at 1..64 tokens (tc against the others and
#      cuBLASLt, L2 flushed);
#   3. bench_cuda synth:llama3-8b: decode batch 1/8/64 x ctx 512/2048 and
#      prefill 2048/8192 with the defaults (the autotuner now sees tc),
#      the same with BT_PDL=0, and with tc kept out (BT_GEMV_DISABLE=tc);
#   4. where a decode step goes: BT_PROFILE_SKIP=op rows (one op left out
#      of every layer; step time differences), batch 1 and 64 @2k;
#   5. EAGLE on the 8B shape: bench-engine --spec-accept-rate 0.8 (host
#      draft loop and BT_DRAFT_LOOP=device).
# CARRY holds gpu/{test_gemm,test_attn,bench_kernels,bench_cuda}, bin/baton
# and lib/ (../shared/tools/devlibs).  Writes $OUT/tc.log and
# $OUT/tc_table.md, prints the table last.  About 6-7 minutes.
set -u
. "$(dirname "$0")/gpu_steps.sh"
gpu_steps_init tc "${1:-build-tc-carry}"
run test_gemm 150 "$c/gpu/test_gemm"
run test_attn 120 "$c/gpu/test_attn"
tc_fail=$(grep -c "^FAIL gemv tc" "$tmp/test_gemm")
[ "$tc_fail" -eq 0 ] || export BT_GEMV_DISABLE=tc
run bench_gemv 120 "$c/gpu/bench_kernels" --gemv --toks 1,2,4,8,16,32,64 --reps 7
bc default BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 2048,8192
bc pdl0 BT_PDL=0 -- --batch 1,8,64 --ctx 2048 --prefill 2048
bc notc BT_GEMV_DISABLE=tc -- --batch 1,8,64 --ctx 2048 --prefill 0
for op in attn rope swiglu norm qkv o gu down; do
  bc "skip_$op" BT_PROFILE_SKIP=$op -- --batch 1,64 --ctx 2048 --prefill 0
done
run spec_host 100 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,8,32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8,16
run spec_devloop 100 env BT_DRAFT_LOOP=device "$c/bin/baton" bench-engine \
  --model synth:llama3-8b --device cuda --batch 1,8,64 --ctx 256 --steps 16 \
  --spec-accept-rate 0.8 --spec-tokens 4,8
{
  echo "## tc run $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s; tc failures: $tc_fail"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  grep -E "^(FAIL|INFO variant)" "$tmp/test_gemm" | head -20
  echo "test_gemm: $(grep -c '^PASS' "$tmp/test_gemm") PASS, $(grep -c '^FAIL' "$tmp/test_gemm") FAIL; test_attn: $(grep -c '^PASS' "$tmp/test_attn") PASS, $(grep -c '^FAIL' "$tmp/test_attn") FAIL"
  echo '```'
  grep -E "^gemv |step" "$tmp/bench_gemv" | cut -c1-400
  echo '```'
  bc_rows default pdl0 notc
  echo "### skip rows (step ms): op | b1@2k | b64@2k"
  for op in attn rope swiglu norm qkv o gu down; do
    echo "$op $(grep -E '^\| decode \| (1|64) \| 2048' "$tmp/t_skip_$op" 2>/dev/null | cut -d'|' -f5 | tr '\n' ' ')"
  done
  echo '```'
  grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec_host"; echo "--- device loop"
  grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec_devloop"
  echo '```'
} > "$table"
cat "$table"
