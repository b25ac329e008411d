#!/bin/bash
# run_gpu_pending.sh CARRY PHASE[,PHASE...] - what the sessions of
# 2026-12-06/07 left for an H200, ON THE DEVICE MACHINE from a folder
# packed here.  2026-12-07 18:13-18:24 an H200 ran fp8 2048/128 and
# 2048/2048 @440, bf16 + FP8 KV 512/512 and 2048/2048 @384, the engine's
# b1 / b64 / prefill 2048 and a 300-row mix (docs/PERFORMANCE.md); since
# then (H100 rows only, 22:19-23:13) the FP8-KV decode attention's step
# with the keys as the MMA's rows and the two-pass SwiGLU quantization.
# Left for an H200: `check`, then every row again with those two, bf16
# 2048/128 @256, the 386-row mix and the disagg sweep.  Delete this
# script once those are in docs/PERFORMANCE.md.
# Pack (repository root):
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode gpu_bench_cuda bt_kernel_trace \
#     gpu_test_cuda_fp8 gpu_test_cuda_kv8 gpu_bench_kernels
#   bash tests/gpu/pack_carry.sh pending \
#     tests/gpu/run_gpu_pending.sh bin/baton bin/baton-router \
#     bin/baton-prefill bin/baton-decode gpu/bench_cuda \
#     gpu/libbt_kernel_trace.so gpu/test_cuda_fp8 gpu/test_cuda_kv8 \
#     gpu/bench_kernels [gpu/bench_kernels_alu1 gpu/bench_kernels_alu2
#     gpu/bench_kernels_l2b256 | gpu/bench_kernels_pf] shared
#   (the bracketed A/B binaries of the alu / l2 / pf phases: bash
#   tests/gpu/pending_variants.sh first; three fit the 64 MiB carry)
#   mkdir -p .carry/pending && mv .carry/pending.tar.xz .carry/pending/
#   rm .carry/call.sh
#   run(carry=[".carry/pending"], command="tar xJf
#       .carry/pending/pending.tar.xz && bash tests/gpu/run_gpu_pending.sh
#       build-pending check,engine,long"), then `serve`, `kv8`, `disagg`
# kv8test (~3-5 min, the host references): test_cuda_kv8 (the
#   keys-as-rows step, groups 1 / 4 / 7 / 8 / 16; H100 2026-12-08 29
#   cases in its first 120 s, all PASS), never run whole on an H200.
# check (~1 min): test_cuda_fp8 --fused (the two-pass SwiGLU
#   quantization byte for byte), never run on an H200 yet; the FP8-KV
#   attention alone at batch 1 / 8 / 16 / 32 @2k and the mix's rows
#   @3072 at 1..32 splits against the planner's (3a71966: at least the
#   keys over the bandwidth; the H100's sweep of 2026-12-08 00:43 fit it).
# engine (each row's H200 figure of 2026-12-07 in brackets): bench_cuda
#   fp8 + FP8 KV batch 1 / 8 / 32 / 64 @2k [b1 2.893, b64 5.988 ms],
#   prefill 2048 / 8192 [30.08 ms], 2048/128's mix (124 rows + 1,990)
#   [36.68] and 2048/2048's at 300 rows @3072 + 300 [27.54; the trace's
#   too] and at the 440-stream run's 386 + 386 [its step 35.93 ms].
# serve (aggregated, closed loop; the phase lines carry the steps by
#   duration): fp8 + FP8 KV 2048/128 @256, 1,024 requests, with and
#   without the TPOT bound [3,224 bound at 512 requests], bf16 2048/128
#   @256 [2,043 on 2026-12-06, TPOT p99 51.0: the budget's margin under
#   load, fad941f, should bring it under 50].
# fp8short: serve's fp8 run with the TPOT bound only [H100 3,155].
# long: fp8 + FP8 KV 2048/2048 @440 streams [10,687] (an H200's FP8 KV,
#   1.81M tokens, holds 441 promises of 4,096 tokens), then @384.
# kv8: bf16 weights over an FP8 KV cache: 512/512 @256 [13,566] and
#   2048/2048 @384 [8,398].
# disagg: 1P+1D (MPS) bf16
#   2048x128 at 16 and 20 req/s with the receive
#   room told by heartbeat (d1873fe; ba74f6f: goodput 12.69 / 10.67 req/s
#   [TTFT p99 727 / 968 ms], 248 grants refused for a full window budget,
#   each asked again 20 ms later).
# On an H100 (the kind lent when no H200 comes) every phase runs at the
# shapes its 80 GB holds: the mixes and the trace at 256 rows, 2048/2048
# at 224 streams, bf16 2048/128 at 176, the disagg pool at 14,000
# blocks; its rows are H100 rows (PERFORMANCE.md says which card).
# Writes pending.md (the rows) under $OUT with each run's serve.md.
set -u
c=${1:-build-pending}
phases=${2:-engine}
out=${OUT:-/tmp/baton-pending}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_SHARED_DIR=$PWD/$c/shared
export BT_GEMM_CACHE=/tmp/baton-pending-gemm.cache
md=$out/pending.md
echo "## pending measurements ($(date -u +%F\ %H:%M) UTC)" > "$md"
nvidia-smi --query-gpu=name,clocks.max.memory,power.limit --format=csv,noheader >> "$md"
h200=0
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
if [ $h200 = 1 ]; then
  # 386: the 440-stream run's step (35.93 ms); bench_cuda of 294cacb
  # (the packed one) holds 300 rows @3072 at most, later builds 512
  mixes=300:3072:1:300:1024,386:3072:1:386:1024
  tmix=300:3072:1:300:1024 long_a=440 long_b=384 bf16_c=256 kv8_c=384
else
  mixes=199:3072:1:199:1024,256:3072:1:256:1024
  tmix=256:3072:1:256:1024 long_a=224 long_b=0 bf16_c=176 kv8_c=224
  export BT_SERVE_KV_BLOCKS=14000 # disagg: the decode pool an H100 holds
fi
# serve NAME SECONDS VAR=VALUE...: one serve_bench.py run, its rows
serve() {
  local name=$1 lim=$2
  shift 2
  [ "$lim" -lt 60 ] && { echo "$name: skipped ($lim s left)" >> "$md"; return; }
  env OUT="$out/$name" BT_SERVE_TIMEOUT="$lim" \
    BT_SERVE_DEADLINE_S=$(( lim - 10 )) BT_SERVE_MODES=agg \
    BT_SERVE_COLD=0 "$@" bash tests/gpu/run_gpu_serve.sh "$c" > /dev/null 2>&1
  local rc=$?
  { echo; echo "### $name: rc $rc, at $(( $(date +%s) - t0 )) s"
    grep "^| agg" "$out/$name/serve.md"
    grep -h "a step (" "$out/$name/serve.md" | cut -c1-700; } >> "$md"
  rm -f "$out/$name/serve_logs.tgz"
}
# dec_row LABEL BINARY B:CTX [VAR=VALUE...]: one FP8-KV decode
# attention row of gpu/BINARY at batch B, context CTX, into pending.md
dec_row() {
  local label=$1 name=$2 bc=$3
  shift 3
  [ -x "$c/gpu/$name" ] || { echo "$label: $name not packed" >> "$md"; return; }
  env "$@" timeout -k 5 60 "$c/gpu/$name" --dec-kv8 --dec-only $bc --reps 20 2>&1 | \
    grep "attn decode" | sed "s/ (.*of 4.5); x32.*//; s/^/$label: /" >> "$md"
}
# dec_ab SUFFIX...: the rows of bench_kernels_SUFFIX ("": the plain
# bench_kernels) in that order, at the mix's rows @3072 and batch 64 @2k
dec_ab() {
  local bc v labels=""
  for v in "$@"; do labels="$labels ${v:-plain}"; done
  for bc in ${tmix%%:*}:3072 64:2048; do
    echo "### --dec-kv8 --dec-only $bc:$labels" >> "$md"
    for v in "$@"; do
      dec_row "${v:-plain}" "bench_kernels${v:+_$v}" $bc
    done
  done
}
for phase in ${phases//,/ }; do
if [ "$phase" = kv8test ]; then # ~3-5 min: the host references
  timeout -k 5 400 "$c/gpu/test_cuda_kv8" > "$out/test_cuda_kv8.txt" 2>&1
  echo "### test_cuda_kv8: rc $?, $(grep -c '^PASS' "$out/test_cuda_kv8.txt") PASS, $(grep -c '^FAIL' "$out/test_cuda_kv8.txt") FAIL" >> "$md"
  grep -h '^FAIL' "$out"/test_cuda_kv8.txt | head -8 >> "$md"
fi
if [ "$phase" = check ]; then
  timeout -k 5 120 "$c/gpu/test_cuda_fp8" --fused > "$out/test_cuda_fp8.txt" 2>&1
  echo "### test_cuda_fp8 --fused: rc $?, $(grep -c '^PASS' "$out/test_cuda_fp8.txt") PASS, $(grep -c '^FAIL' "$out/test_cuda_fp8.txt") FAIL" >> "$md"
  grep -h '^FAIL' "$out"/test_cuda_*.txt | head -8 >> "$md"
  for bc in 1:2048 8:2048 16:2048 32:2048 ${tmix%%:*}:3072; do
    echo "### bench_kernels --dec-kv8 --dec-only $bc --dec-splits" >> "$md"
    timeout -k 5 60 "$c/gpu/bench_kernels" --dec-kv8 --dec-only $bc \
      --dec-splits --reps 20 2>&1 | grep "attn decode" | \
      sed 's/ (.*of 4.5); x32.*//' >> "$md"
  done
fi
if [ "$phase" = pf ]; then # the L2 prefetch of d749c76 on this card
  # (gpu/bench_kernels_pf: lost on an H100, 2026-12-08; an H200 needs
  # ~1.4x the bytes in flight an SM)
  for bc in ${tmix%%:*}:3072 64:2048; do
    echo "### --dec-kv8 --dec-only $bc: BT_ATTN_PREFETCH 0 2 4 0 2 4" >> "$md"
    for pf in 0 2 4 0 2 4; do
      dec_row "pf $pf" bench_kernels_pf $bc BT_ATTN_PREFETCH=$pf
    done
  done
fi
if [ "$phase" = l2 ]; then # the copies' L2 prefetch size, 128 B / 256 B
  # (gpu/bench_kernels_l2b256: tc_cp16_l2 with .L2::256B; an FP8 K or
  # V row is 128 B, its neighbour another head's)
  dec_ab "" l2b256 "" l2b256
fi
if [ "$phase" = alu ]; then # FP8-KV codes to f16: cvt or by bits
  # (gpu/bench_kernels_alu1 / _alu2: the keys-as-rows step converting K,
  # resp. K and V, on the integer pipes (dc34c9a's tc_kv8_f16x2_alu), x
  # 2^-8 taken back in Q's and V's scales.  Lost on an H100 (+0.6 to
  # +5.6%); the H200 may be bound by its conversions.)
  dec_ab "" alu1 alu2 "" alu1 alu2
fi
if [ "$phase" = engine ]; then
  timeout -k 5 280 "$c/gpu/bench_cuda" \
    --model synth:llama3-8b --precision fp8 --kv-dtype fp8 --batch 1,8,32,64 \
    --ctx 2048 --prefill 2048,8192 --mixed 124:2048:1:1990:0,$mixes \
    --steps 20 > "$out/bench.txt" 2>&1
  { echo; echo "### bench_cuda fp8 + FP8 KV: rc $?"
    grep -E "^\| (decode|prefill|mixed)" "$out/bench.txt"; } >> "$md"
  # 2048/2048's step by kernel (the H100's: PERFORMANCE.md "Where an FP8
  # serving step goes"); the carry's gpu/libbt_kernel_trace.so
  timeout -k 5 150 env CUDA_INJECTION64_PATH="$PWD/$c/gpu/libbt_kernel_trace.so" \
    BT_TRACE_OUT=/tmp/tp.csv "$c/gpu/bench_cuda" --model synth:llama3-8b \
    --precision fp8 --kv-dtype fp8 --batch 1 --ctx 2048 --prefill 0 \
    --mixed $tmix --steps 5 > "$out/trace.txt" 2>&1
  { echo; echo "### the ${tmix%%:*}-row mix under the tracer: rc $?"
    grep "^| mixed" "$out/trace.txt"
    python3 tests/gpu/step_timeline.py /tmp/tp.csv embed_kernel 19 | head -24; } >> "$md"
fi
if [ "$phase" = serve ]; then
  serve fp8_short 200 BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_MODES=agg,agg-nobound BT_SERVE_RUNS="2048x128@256:1024"
  serve bf16_short $(left 560) BT_SERVE_MAX_SEQS=$bf16_c \
    BT_SERVE_RUNS="2048x128@$bf16_c:$(( 2 * bf16_c ))"
fi
if [ "$phase" = fp8short ]; then # serve's first half, the bound only
  serve fp8_short 220 BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_RUNS="2048x128@256:1024"
fi
if [ "$phase" = long ]; then
  serve fp8_$long_a 330 BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_MAX_SEQS=$long_a \
    BT_SERVE_RUNS="2048x2048@$long_a:$(( 2 * long_a ))"
  [ $long_b -gt 0 ] && serve fp8_$long_b $(left 580) BT_SERVE_PRECISION=fp8 \
    BT_SERVE_KV_DTYPE=fp8 BT_SERVE_MAX_SEQS=$long_b \
    BT_SERVE_RUNS="2048x2048@$long_b:$(( 2 * long_b ))"
fi
if [ "$phase" = kv8 ]; then # bf16 weights over an FP8 KV cache
  serve kv8_512 $(( $(left 580) < 110 ? $(left 580) : 110 )) \
    BT_SERVE_KV_DTYPE=fp8 BT_SERVE_RUNS="512x512@256:768"
  serve kv8_2048 $(left 580) BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_MAX_SEQS=$kv8_c BT_SERVE_RUNS="2048x2048@$kv8_c:$(( 2 * kv8_c ))"
fi
if [ "$phase" = disagg ]; then
  serve disagg $(left 560) BT_SERVE_MODES=disagg BT_SERVE_RUNS= \
    BT_SERVE_SWEEPS="2048x128@16,20:128"
  grep -E "^\| [0-9]" "$out/disagg/serve.md" >> "$md" # the sweep's rows
fi
done
cat "$md"
