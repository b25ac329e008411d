#!/bin/bash
# run_gpu_skinny_ab.sh CARRY - branch fp8-skinny-small's device call (its
# check and its A/B; delete this script when the branch lands).  ON THE
# DEVICE MACHINE from a folder packed here:
#   mkdir -p build-old/gpu && cp <bench_cuda of main> build-old/gpu/
#   cmake --build build-cuda -j2 --target gpu_test_cuda_fp8 gpu_bench_cuda \
#     gpu_test_cuda_model gpu_test_cuda_kv_tier
#   AB_FROM=build-old bash tests/gpu/pack_carry.sh ab \
#     tests/gpu/run_gpu_skinny_ab.sh gpu/test_cuda_fp8 gpu/bench_cuda \
#     gpu/test_cuda_model gpu/test_cuda_kv_tier shared
#   mkdir -p .carry/ab && mv .carry/ab.tar.xz .carry/ab/ && rm .carry/call.sh
#   run(carry=[".carry/ab"], command="tar xJf .carry/ab/ab.tar.xz &&
#       bash tests/gpu/run_gpu_skinny_ab.sh build-ab")   # ~7 min
# bench_cuda fp8 + FP8 KV batch 1,2,4,8,16 @2k, A B B A (A: 2-8 FP8
# tokens on the skinny GEMM; B: main's GEMV), test_cuda_fp8 (the routed
# products against the reference, agree_check of the GEMV at 2-8
# tokens), test_cuda_model, test_cuda_kv_tier; every step within a
# deadline of D seconds (default 440); TEST_FIRST=1 runs test_cuda_fp8
# before the first bench.
c=$1; D=${D:-440}
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared
out=${OUT:-/tmp/ab}; mkdir -p $out
nvidia-smi --query-gpu=name,clocks.max.memory,power.limit --format=csv,noheader
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
bench() { # NAME I
  [ $(( $(el) + 70 )) -gt $D ] && { echo "$1.$2 skipped at $(el) s"; return; }
  BT_GEMM_CACHE=/tmp/ab-$1.cache timeout -k 5 90 $c/gpu/$1 --model synth:llama3-8b --precision fp8 \
    --kv-dtype fp8 --batch 1,2,4,8,16 --ctx 2048 > $out/$1.$2.log 2>&1
  echo "== $1.$2 rc $? at $(el) s"; grep "^| decode" $out/$1.$2.log | tail -6
}
tst() { # NAME LIMIT
  [ $(( $(el) + $2 )) -gt $D ] && { echo "$1 skipped at $(el) s"; return; }
  BT_GEMM_CACHE=/tmp/ab-t.cache timeout -k 5 $2 $c/gpu/$1 > $out/$1.log 2>&1
  echo "== $1 rc $? at $(el) s, PASS $(grep -c '^PASS' $out/$1.log)"
  grep -E "^FAIL|fp8 small|skinny wgmma|gemv \(codes\)|all passed|FAILED" $out/$1.log | head -30
}
[ -n "${TEST_FIRST:-}" ] && tst test_cuda_fp8 170
bench bench_cuda 1
[ -z "${TEST_FIRST:-}" ] && tst test_cuda_fp8 170
bench bench_cuda_b 2; bench bench_cuda_b 3; bench bench_cuda 4
tst test_cuda_model 100; tst test_cuda_kv_tier 40
