#!/bin/bash
# run_gpu_test.sh BUILD_DIR - `make gpu-test`: every kernel test and the
# whole-model test, ON THE DEVICE MACHINE, from a build made elsewhere
# (nothing is rebuilt); `--list` prints the tests it runs.  Writes
# gpu_test.log and gpu_test_table.md under $OUT when set (else
# /tmp/baton-gpu-test); prints the table last.
# Models: $BT_SHARED_DIR, else ./.gpushared when carried, else ../shared.
set -u
# the tests, in order (`--list` prints them: make gpu-carry packs these)
tests="test_embed test_rmsnorm test_swiglu test_rope_kv test_sample test_topk
       test_sample_dist test_cuda_sample test_gemm test_attn test_cuda_fp8
       test_cuda_kv8 test_cuda_model test_cuda_kv_tier"
if [ "${1:-}" = --list ]; then echo $tests; exit 0; fi
build=${1:-build-cuda}
out=${OUT:-/tmp/baton-gpu-test}
mkdir -p "$out"
log=$out/gpu_test.log
table=$out/gpu_test_table.md
: > "$log"
# a folder pack_carry.sh packed holds its own models and the libraries
# the device lacks (without them the CUDA backend's tests exit 127)
if [ -z "${BT_SHARED_DIR:-}" ]; then
  if [ -d "$build/shared/models" ]; then export BT_SHARED_DIR=$(cd "$build/shared" && pwd)
  elif [ -d .gpushared/models ]; then export BT_SHARED_DIR=$PWD/.gpushared
  else export BT_SHARED_DIR=$(cd .. && pwd)/shared; fi
fi
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$(cd "$build/lib" && pwd):${LD_LIBRARY_PATH:-}
[ -d .devlibs ] && export LD_LIBRARY_PATH=$PWD/.devlibs:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  >> "$log" 2>&1
fails=0
rows=""
for t in $tests; do
  echo "=== $t" >> "$log"
  start=$(date +%s%N)
  timeout 240 "$build/gpu/$t" >> "$log" 2>&1
  rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000 ))
  checks=$(sed -n "/^=== $t\$/,\$p" "$log" | grep -c '^PASS')
  bad=$(sed -n "/^=== $t\$/,\$p" "$log" | grep -c '^FAIL')
  if [ $rc -eq 0 ]; then res=PASS; else res="FAIL (rc $rc)"; fails=$((fails+1)); fi
  rows="$rows| $t | $res | $checks | $bad | $((secs / 1000)).$(( (secs % 1000) / 100 )) |\n"
done
# the compiled kernels themselves: uniform registers read but never
# written (ptxas 13.0 did that once: sass_check.py says where), over the
# whole backend's kernels as linked into test_cuda_model
echo "=== sass_check" >> "$log"
cob=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
if [ -n "$cob" ]; then
  "$cob" -sass "$build/gpu/test_cuda_model" > "$out/model.sass" 2>>"$log"
  python3 "$(dirname "$0")/sass_check.py" "$out/model.sass" >> "$log" 2>&1
  rc=$?
  rm -f "$out/model.sass"
  if [ $rc -eq 0 ]; then res=PASS; else res="FAIL (rc $rc)"; fails=$((fails+1)); fi
else
  res="not run (no cuobjdump)"
fi
rows="$rows| sass_check | $res | | | |\n"
{
  echo "| test | result | checks passed | checks failed | seconds |"
  echo "| --- | --- | ---: | ---: | ---: |"
  printf "$rows"
} > "$table"
grep -E '^(PASS|FAIL|INFO) (golden|bf16|f32|cpu|synth|fp8 top-1)' "$log" >> "$table"
echo
cat "$table"
[ $fails -eq 0 ]
