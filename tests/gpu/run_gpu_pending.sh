#!/bin/bash
# run_gpu_pending.sh CARRY PART - what the sessions of 2026-12-06 left
# for the device, ON THE DEVICE MACHINE from a folder packed here, in two
# calls of <= ~9 minutes each (delete this script once its figures are
# in docs/PERFORMANCE.md):
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode gpu_test_cuda_ipc_window \
#     gpu_test_cuda_kv8 test_rope_kv gpu_bench_cuda
#   AB_FROM=build-ropeold bash tests/gpu/pack_carry.sh pending \
#     tests/gpu/run_gpu_pending.sh bin/baton bin/baton-router \
#     bin/baton-prefill bin/baton-decode gpu/test_cuda_ipc_window \
#     gpu/test_cuda_kv8 gpu/test_rope_kv gpu/bench_cuda shared
#   (build-ropeold/gpu/bench_cuda: bench_cuda built with the scalar FP8
#   rope_kv, the A/B's other side), then
#   run(carry=[".carry/pending"], command="tar xJf
#       .carry/pending/pending.tar.xz && bash tests/gpu/run_gpu_pending.sh
#       build-pending 1")   and the same with 2.
# PART 1:
#   0. test_cuda_ipc_window (the window budget's refusal, a57c908; the
#      copy-in left in flight, its done said once), test_cuda_kv8 (the
#      vector rope_kv writes the cpu's E4M3 codes, head sizes 64 / 128;
#      the scalar one at 24), test_rope_kv (bf16, unchanged): every check
#      must PASS.
#   1. A/B of the vector rope_kv for FP8 KV, fp8 + FP8 KV, batch 1 @2k
#      and prefill 2048, A B B A (predicted: prefill 31.6 -> ~30.6 ms,
#      batch 1 3.12 -> ~2.96 ms: the scalar kernel's 1.4 ms / 7 us a
#      layer at ~1 TB/s become ~0.3 ms / ~2 us).
#   2. issue 36's goodput sweep, 2048/128 at 4-20 req/s, aggregated and
#      1P+1D under MPS (the 1P+1D rows at 16 and 20 req/s of 2026-12-06
#      waited 30-45 s for expired reservations: the bug a57c908 fixed;
#      predicted now: TTFT p99 ~1 s or less, 1,600-1,800 tok/s,
#      kv_grants_waited > 0 and no "expired"; with the copy-in no longer
#      waiting on the loop, d0's build column ~0.1 ms, not 0.69), which
#      answers where the modes cross on one GPU.
# PART 3 (the same pack, rebuilt with the decode's host-work ledger):
#   1P+1D at 16 and 20 req/s, the decode's stop line saying which
#   message its 0.65 ms a step of serial host time goes to; bf16
#   2048/128 at 256 streams (issue 36's TPOT p99 <= 50 ms, unmeasured
#   since the between-steps term left the budget's room).
# PART 2:
#   3. issue 37's serving rows with fast accumulation on the H200: fp8 +
#      FP8 KV 2048/128 @256 (2,809 tok/s with exact accumulation; an
#      H100 gained 9%: predicted ~3,050) and 2048/2048 @384 streams
#      (BT_SERVE_MAX_SEQS=384; 9,101 at 224 streams; the pool holds 1.8M
#      tokens).
# Writes pending.md (the tables) under $OUT with each step's serve.md and
# the decode / prefill logs' lines that tell (grants waited, expired
# reservations, inline refusals).
set -u
c=${1:-build-pending}
part=${2:-1}
out=${OUT:-/tmp/baton-pending}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
work=/tmp/baton-gpu-serve-work
md=$out/pending.md
echo "## pending measurements, part $part ($(date -u +%F\ %H:%M) UTC)" > "$md"
nvidia-smi --query-gpu=name,clocks.max.memory,power.limit --format=csv,noheader >> "$md"
export BT_SHARED_DIR=$PWD/$c/shared

# check NAME SECONDS CMD...: a test program's PASS / FAIL count
check() {
  local name=$1 lim=$2
  shift 2
  timeout -k 5 "$lim" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  { echo; echo "### $name: rc $rc," \
      "$(grep -c '^PASS' "$out/$name.txt") PASS," \
      "$(grep -c '^FAIL' "$out/$name.txt") FAIL"
    grep '^FAIL' "$out/$name.txt" | head -5; } >> "$md"
}
# ab NAME BIN ARGS...: one bench_cuda run (fp8 + FP8 KV), its rows
ab() {
  local name=$1 bin=$2
  shift 2
  timeout -k 5 120 "$c/gpu/$bin" --model synth:llama3-8b --steps 20 \
    --precision fp8 --kv-dtype fp8 --table "$out/t_$name.md" "$@" \
    > "$out/$name.txt" 2>&1
  local rc=$?
  { echo; echo "### $name ($bin): rc $rc"
    grep -E "^\| (decode|prefill) " "$out/t_$name.md" | cut -d'|' -f2-6; } >> "$md"
}

# serve NAME SECONDS VAR=VALUE...: one serve_bench.py run, its table and
# the worker logs' tell-tale lines into pending.md
serve() {
  local name=$1 lim=$2
  shift 2
  env OUT="$out/$name" BT_SERVE_TIMEOUT="$lim" \
    BT_SERVE_DEADLINE_S=$(( lim - 10 )) "$@" \
    bash tests/gpu/run_gpu_serve.sh "$c" > /dev/null 2>&1
  local rc=$?
  { echo; echo "### $name: rc $rc, at $(( $(date +%s) - t0 )) s"
    cat "$out/$name/serve.md" 2>/dev/null
    echo; echo '```'
    grep -h "kv_grants_waited\|expired\|cannot go inline\|no progress" \
      "$work"/*/*.log 2>/dev/null | cut -c1-200 | tail -6
    grep -h "host work\|host us per step" "$work"/*/*.log 2>/dev/null |
      cut -c1-500 | tail -4
    echo '```'; } >> "$md"
  rm -f "$out/$name/serve_logs.tgz"
}
if [ "$part" = 1 ]; then
  check cipc 60 "$c/gpu/test_cuda_ipc_window"
  check kv8 150 "$c/gpu/test_cuda_kv8"
  check rope 60 "$c/gpu/test_rope_kv"
  for v in A B B A; do
    bin=bench_cuda; [ $v = B ] && bin=bench_cuda_b
    ab "rope_$v$(date +%s)" $bin --batch 1 --ctx 2048 --prefill 2048
  done
  serve sweep $(left 560) BT_SERVE_MODES=agg,disagg BT_SERVE_COLD=0 \
    BT_SERVE_RUNS= BT_SERVE_SWEEPS="2048x128@4,8,12,16,20:128"
elif [ "$part" = 3 ]; then
  serve disagg $(left 250) BT_SERVE_MODES=disagg BT_SERVE_COLD=0 \
    BT_SERVE_RUNS= BT_SERVE_SWEEPS="2048x128@16,20:128"
  serve bf16 $(left 560) BT_SERVE_MODES=agg BT_SERVE_COLD=0 \
    BT_SERVE_RUNS="2048x128@256:512"
else
  serve fp8 $(left 560) BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
    BT_SERVE_MODES=agg BT_SERVE_COLD=0 BT_SERVE_MAX_SEQS=384 \
    BT_SERVE_RUNS="2048x128@256:512;2048x2048@384:768"
fi
cat "$md"
