#!/bin/bash
# run_gpu_kernels.sh [BUILD_DIR] - issue 4 speed work (helpers "gemv",
# "gemv2"), ON THE DEVICE MACHINE from a carried build (nothing is
# rebuilt):
#   1. kernel tests against the CPU references: test_gemm (worker_gemm,
#      every GEMV variant, the RMSNorm-fused rows GEMV, the prefetch /
#      trigger switches), test_rmsnorm + test_rope_kv (vector and scalar
#      kernels), test_attn (decode + prefill attention).  A variant that
#      fails its test is switched off for everything after it (GEMV
#      variants through BT_GEMV_DISABLE, the fused norm through
#      BT_GEMV_NORM=0, the vector kernels through BT_RMSNORM_VEC=0 /
#      BT_ROPE_VEC=0, the prefill kernel through BT_PREFILL_KERNEL=mma);
#      a crash of test_gemm re-runs it with the prefetch off (BT_GEMV_PF=0).
#   2. bench_kernels: GEMV variants at 1/2/64 tokens, decode attention
#      (planner default vs fill), prefill attention, small kernels.
#   3. bench_cuda (synth:llama3-8b, bf16): decode batch 1,64 x ctx
#      512,2048 and prefill 512,2048 with the defaults, then A/B rows with
#      each new switch off, and all of them off (round-4 baseline); the
#      FA2-class prefill attention (BT_PREFILL_KERNEL=fa2, fa2w4) as its
#      own rows unless it failed test_attn (a failure or a crash of its
#      passes switches it off; the test then re-runs without them).
# Writes $OUT/gemv2_kernels.log and $OUT/gemv2_table.md; prints the table
# last.  About 2.5-3 minutes.  Carry one folder (stripped binaries + the
# libraries the device lacks), made here after building build-gemv2:
#   cmake --build build-gemv2 -j2 --target gpu_bench_kernels gpu_bench_cuda \
#     test_gemm test_attn test_rmsnorm test_rope_kv
#   rm -rf build-gemv2-carry && mkdir -p build-gemv2-carry/gpu && \
#   for b in test_gemm test_attn test_rmsnorm test_rope_kv bench_kernels \
#     bench_cuda; do strip -o build-gemv2-carry/gpu/$b build-gemv2/gpu/$b; \
#   done && ../shared/tools/devlibs build-gemv2-carry/lib build-gemv2-carry/gpu/*
# then run(carry=["build-gemv2-carry"], kind nvidia-h200,
#   command="bash tests/gpu/rounds/run_gpu_kernels.sh build-gemv2-carry").
set -u
build=${1:-build-gemv2-carry}
out=${OUT:-/tmp/baton-gpu-kernels}
mkdir -p "$out"
log=$out/gemv2_kernels.log
table=$out/gemv2_table.md
tmp=$(mktemp -d)
: > "$log"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$PWD/$build/lib:${LD_LIBRARY_PATH:-}
[ -d .devlibs ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$PWD/.devlibs
export BT_LOG=${BT_LOG:-WARN}
t_start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv >> "$log" 2>&1
switched=""

# ---- 1. tests ----------------------------------------------------------
echo "=== test_gemm" >> "$log"
timeout 120 "$build/gpu/test_gemm" > "$tmp/tg" 2>&1
rc_gemm=$?
cat "$tmp/tg" >> "$log"
if [ $rc_gemm -ne 0 ] && ! grep -q "comparison(s) FAILED" "$tmp/tg"; then
  echo "=== test_gemm crashed (rc $rc_gemm): again with BT_GEMV_PF=0" >> "$log"
  export BT_GEMV_PF=0
  switched="$switched BT_GEMV_PF=0"
  timeout 120 "$build/gpu/test_gemm" > "$tmp/tg" 2>&1
  rc_gemm=$?
  cat "$tmp/tg" >> "$log"
fi
if grep -q "^FAIL .*RPW=2" "$tmp/tg"; then
  # two rows per warp is wrong: off, and test again without it
  export BT_GEMV_RPW=1; switched="$switched BT_GEMV_RPW=1"
  echo "=== test_gemm again with BT_GEMV_RPW=1" >> "$log"
  timeout 120 "$build/gpu/test_gemm" > "$tmp/tg" 2>&1
  rc_gemm=$?
  cat "$tmp/tg" >> "$log"
fi
disable=""
for v in rows rows8 stream ring bulk mma1 mma2 tc; do
  if grep "^FAIL gemv $v " "$tmp/tg" | grep -qv "RPW=2"; then
    disable="$disable,$v"
  fi
done
if [ $rc_gemm -ne 0 ] && ! grep -q "comparison(s) FAILED" "$tmp/tg"; then
  last=$(grep -oE "^(PASS|FAIL) gemv [a-z0-9]+" "$tmp/tg" | tail -1 | awk '{print $3}')
  disable="$disable,bulk${last:+,$last}"
fi
disable=${disable#,}
export BT_GEMV_DISABLE=$disable
if grep "^FAIL gemv+rmsnorm (rows)" "$tmp/tg" | grep -qv "RPW=2" || \
   { [ $rc_gemm -ne 0 ] && ! grep -q "comparison(s) FAILED" "$tmp/tg"; }; then
  export BT_GEMV_NORM=0; switched="$switched BT_GEMV_NORM=0"
fi
if echo ",$disable," | grep -q ",rows,"; then
  export BT_GEMV=0; switched="$switched BT_GEMV=0"
fi
echo "test_gemm rc=$rc_gemm; disabled variants: ${disable:-none}" >> "$log"

echo "=== test_rmsnorm" >> "$log"
timeout 60 "$build/gpu/test_rmsnorm" > "$tmp/tr" 2>&1
rc_rms=$?
cat "$tmp/tr" >> "$log"
if [ $rc_rms -ne 0 ]; then
  export BT_RMSNORM_VEC=0; switched="$switched BT_RMSNORM_VEC=0"
fi
echo "=== test_rope_kv" >> "$log"
timeout 60 "$build/gpu/test_rope_kv" > "$tmp/tp" 2>&1
rc_rope=$?
cat "$tmp/tp" >> "$log"
if [ $rc_rope -ne 0 ]; then
  export BT_ROPE_VEC=0; switched="$switched BT_ROPE_VEC=0"
fi
echo "=== test_attn" >> "$log"
timeout 120 "$build/gpu/test_attn" > "$tmp/ta" 2>&1
rc_attn=$?
cat "$tmp/ta" >> "$log"
# fa2 (attn_prefill_fa2.cu, off by default): any failed comparison, or a
# crash, switches its rows off; after a crash the test runs again without
# the fa2 passes (KT_ATTN_FA2=0) so the other kernels are judged alone.
fa2_ok=1
if grep -q "^FAIL attn prefill (fa2" "$tmp/ta"; then
  fa2_ok=0
fi
if [ $rc_attn -ne 0 ] && ! grep -q "comparison(s) FAILED" "$tmp/ta"; then
  fa2_ok=0
  echo "=== test_attn crashed (rc $rc_attn): again with KT_ATTN_FA2=0" >> "$log"
  KT_ATTN_FA2=0 timeout 120 "$build/gpu/test_attn" > "$tmp/ta" 2>&1
  rc_attn=$?
  cat "$tmp/ta" >> "$log"
fi
if [ $fa2_ok -eq 0 ]; then
  switched="$switched fa2(off)"
fi
if grep -q "^FAIL attn decode" "$tmp/ta" && ! grep -q "^FAIL attn decode .*early=0" "$tmp/ta"; then
  export BT_ATTN_EARLY=0; switched="$switched BT_ATTN_EARLY=0"
fi
if grep -q "^FAIL attn prefill (mma2)" "$tmp/ta" || \
   { [ $rc_attn -ne 0 ] && ! grep -q "comparison(s) FAILED" "$tmp/ta"; }; then
  export BT_PREFILL_KERNEL=mma; switched="$switched BT_PREFILL_KERNEL=mma"
fi
echo "switched off after the tests:${switched:- nothing}" >> "$log"

# ---- 2. kernel benchmarks ----------------------------------------------
echo "=== bench_kernels" >> "$log"
timeout 100 "$build/gpu/bench_kernels" --gemv --toks 1,2,64 --reps 7 >> "$log" 2>&1
rc_bk=$?
# (with BT_PREFILL_KERNEL unset, --attn adds a fa2 row: pinned to the
# default kernel, mma, when fa2 failed its test)
if [ $fa2_ok -eq 1 ]; then
  timeout 60 "$build/gpu/bench_kernels" --dec --small --attn --reps 7 >> "$log" 2>&1
else
  BT_PREFILL_KERNEL=${BT_PREFILL_KERNEL:-mma} timeout 60 "$build/gpu/bench_kernels" --dec --small --attn --reps 7 >> "$log" 2>&1
fi
if [ -z "${BT_PREFILL_KERNEL:-}" ]; then
  BT_PREFILL_KERNEL=mma2 timeout 30 "$build/gpu/bench_kernels" --attn --reps 5 >> "$log" 2>&1
fi
if [ $fa2_ok -eq 1 ]; then
  BT_PREFILL_KERNEL=fa2w4 timeout 30 "$build/gpu/bench_kernels" --attn --reps 5 >> "$log" 2>&1
fi

# ---- 3. engine rows ------------------------------------------------------
# bc NAME ENV... -- ARGS: one bench_cuda run, its table kept as $tmp/t_NAME
bc() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "=== bench_cuda [$name] ${envs[*]}" >> "$log"
  env "${envs[@]}" timeout 80 "$build/gpu/bench_cuda" --model synth:llama3-8b \
    --steps 20 --table "$tmp/t_$name" "$@" >> "$log" 2>&1
  echo "rc=$?" >> "$log"
}
bc default BT_GEMV_PF=${BT_GEMV_PF:-0} -- --batch 1,64 --ctx 512,2048 --prefill 512,2048
bc pf1 BT_GEMV_PF=1 -- --batch 1 --ctx 512
bc pf2 BT_GEMV_PF=2 -- --batch 1 --ctx 512
bc rpw1 BT_GEMV_RPW=1 -- --batch 1 --ctx 512
bc norm0 BT_GEMV_NORM=0 -- --batch 1 --ctx 512
bc early BT_GEMV_TRIGGER=early -- --batch 1 --ctx 512
bc pdl0 BT_PDL=0 -- --batch 1 --ctx 512
bc fill BT_ATTN_PLAN=fill -- --batch 64 --ctx 512,2048
bc pfnext1 BT_GEMM_PF_NEXT=1 -- --batch 64 --ctx 512,2048
bc early0 BT_ATTN_EARLY=0 -- --batch 1,64 --ctx 2048
bc vec0 BT_RMSNORM_VEC=0 BT_ROPE_VEC=0 -- --batch 1 --ctx 512 --prefill 2048
bc mma2 BT_PREFILL_KERNEL=mma2 -- --batch 1 --ctx 512 --prefill 2048
if [ $fa2_ok -eq 1 ]; then
  # the FA2-class prefill attention (A/B against the default row)
  bc fa2 BT_PREFILL_KERNEL=fa2 -- --batch 1 --ctx 512 --prefill 512,2048,8192
  bc fa2w4 BT_PREFILL_KERNEL=fa2w4 -- --batch 1 --ctx 512 --prefill 2048
fi
bc all_off BT_GEMV_PF=0 BT_GEMV_NORM=0 BT_GEMV_TRIGGER=early BT_GEMV_RPW=1 \
  BT_GEMM_PF_NEXT=0 BT_ATTN_EARLY=0 BT_ATTN_PLAN=fill BT_RMSNORM_VEC=0 BT_ROPE_VEC=0 BT_PREFILL_KERNEL=mma \
  -- --batch 1,64 --ctx 512,2048 --prefill 2048

# ---- table -------------------------------------------------------------
cnt() { grep -c "$1" "$2" 2>/dev/null; }
{
  echo "## gemv2 run $(date -u +%FT%TZ), $(( $(date +%s) - t_start )) s"
  echo "rc: test_gemm $rc_gemm, test_rmsnorm $rc_rms, test_rope_kv $rc_rope, test_attn $rc_attn, bench_kernels $rc_bk; disabled GEMV: ${disable:-none}; switched off:${switched:- nothing}"
  echo
  echo "| test | PASS | FAIL |"
  echo "| --- | ---: | ---: |"
  for v in rows rows8 stream ring bulk mma1 mma2 tc; do
    echo "| gemv $v | $(cnt "^PASS gemv $v " "$log") | $(cnt "^FAIL gemv $v " "$log") |"
  done
  echo "| gemv+rmsnorm (rows) | $(cnt '^PASS gemv+rmsnorm (rows)' "$log") | $(cnt '^FAIL gemv+rmsnorm (rows)' "$log") |"
  echo "| gemv+rmsnorm (others) | $(grep '^PASS gemv+rmsnorm' "$log" | grep -vc '(rows)') | $(grep '^FAIL gemv+rmsnorm' "$log" | grep -vc '(rows)') |"
  echo "| worker_gemm | $(cnt '^PASS gemm' "$log") | $(cnt '^FAIL gemm' "$log") |"
  echo "| rmsnorm | $(cnt '^PASS rmsnorm' "$tmp/tr") | $(cnt '^FAIL rmsnorm' "$tmp/tr") |"
  echo "| rope_kv | $(cnt '^PASS rope' "$tmp/tp") | $(cnt '^FAIL rope' "$tmp/tp") |"
  echo "| attn | $(cnt '^PASS' "$tmp/ta") | $(cnt '^FAIL' "$tmp/ta") |"
  echo "| attn prefill fa2* | $(cnt '^PASS attn prefill (fa2' "$log") | $(cnt '^FAIL attn prefill (fa2' "$log") |"
  echo
  echo "### kernels (us per layer, bandwidth)"
  grep -E '^gemv [a-z_]+ +t=  1' "$log" | sed -E 's/ stream .*cublasLt/ ... cublasLt/'
  grep -E '^(attn |small )' "$log"
  echo
  for n in default pf0 pf2 rpw1 norm0 early pdl0 fill pfnext0 early0 vec0 pre_mma mma2 fa2 fa2w4 all_off; do
    [ -f "$tmp/t_$n" ] || { echo "### bench_cuda [$n]: no table"; continue; }
    echo "### bench_cuda [$n]"
    cat "$tmp/t_$n"
  done
} > "$table"
cat "$table" >> "$log"
rm -rf "$tmp"
echo
cat "$table"
