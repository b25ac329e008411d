#!/bin/bash
# run_gpu_pending.sh CARRY - what the session of 2026-12-06 02:47 left for
# the device (its other measurements are in docs/PERFORMANCE.md), ON THE
# DEVICE MACHINE from a folder packed here, one call of ~7 minutes;
# delete this script once its figures are in docs/PERFORMANCE.md.
# Pack (repository root):
#   git checkout 86dba2d -- worker/cuda/cuda_backend.c
#   cmake --build build-cuda -j2 --target baton-decode
#   cp build-cuda/bin/baton-decode /tmp/baton-decode_old
#   git checkout HEAD -- worker/cuda/cuda_backend.c
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode test_kv_copy gpu_test_cuda_ipc_window \
#     gpu_test_cuda_kv8
#   bash tests/gpu/pack_carry.sh pending tests/gpu/run_gpu_pending.sh \
#     bin/baton bin/baton-router bin/baton-prefill bin/baton-decode \
#     gpu/test_kv_copy gpu/test_cuda_ipc_window gpu/test_cuda_kv8 shared
#   cp /tmp/baton-decode_old build-pending/bin/ &&
#   strip build-pending/bin/baton-decode_old &&
#   tar cf - build-pending | xz -T2 -6 > .carry/pending.tar.xz
#   mkdir -p .carry/pending && mv .carry/pending.tar.xz .carry/pending/
#   rm .carry/call.sh
#   run(carry=[".carry/pending"], command="tar xJf
#       .carry/pending/pending.tar.xz && BT_PENDING_AB=1
#       BT_PENDING_BF16=1 bash tests/gpu/run_gpu_pending.sh build-pending")
# What it runs:
#   - test_kv_copy (cuda_kv_window_to_pool against a host loop),
#     test_cuda_ipc_window (the copy-in through it) and test_cuda_kv8
#     (rope_kv's V store, refactored in deeb4ac): NOT YET RUN ON A GPU,
#     so first; every check must PASS;
#   - 1P+1D (MPS) at 16 and 20 req/s with either decode (BT_PENDING_AB:
#     86dba2d's, whose copy-in is a cudaMemcpyAsync per run of blocks,
#     layer and K|V, then today's one kernel), the decode's stop line
#     saying where its serial host time goes (0.65 ms a step over
#     2026-12-06's sweep; predicted: KvReady, up to 64 cudaMemcpyAsync a
#     block of a fragmented pool) and that the kernel takes it away;
#   - bf16 2048/128 at 256 streams (BT_PENDING_BF16, an H200: issue 36's
#     TPOT p99 <= 50 ms, unmeasured since the between-steps term left the
#     budget's room).
# An 80 GB card gets a 12,000-block decode pool (two 8B workers share
# it). Writes pending.md (the tables) under $OUT with each step's
# serve.md and the worker logs' lines that tell.
set -u
c=${1:-build-pending}
out=${OUT:-/tmp/baton-pending}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
work=/tmp/baton-gpu-serve-work
md=$out/pending.md
echo "## pending measurements ($(date -u +%F\ %H:%M) UTC)" > "$md"
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
# an 80 GB card holds two 8B workers with a 12,000-block decode pool
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits |
      head -1)
[ "${mib:-0}" -lt 100000 ] && export BT_SERVE_KV_BLOCKS=12000
check kvcopy 60 "$c/gpu/test_kv_copy"
check cipc 60 "$c/gpu/test_cuda_ipc_window"
check kv8 150 "$c/gpu/test_cuda_kv8"
# A: the decode whose copy-in is a cudaMemcpyAsync per run (its
# $c/bin/baton-decode_old), B: one kernel (cuda_kv_window_to_pool)
if [ -f "$c/bin/baton-decode_old" ] && [ -n "${BT_PENDING_AB:-}" ]; then
  rm -rf "$c-old"; cp -r "$c" "$c-old"
  mv "$c-old/bin/baton-decode_old" "$c-old/bin/baton-decode"
  c_new=$c; c=$c-old
  serve disagg_memcpy $(left 200) BT_SERVE_MODES=disagg BT_SERVE_COLD=0 \
    BT_SERVE_RUNS= BT_SERVE_SWEEPS="2048x128@16,20:128"
  c=$c_new
fi
serve disagg_kernel $(left 330) BT_SERVE_MODES=disagg BT_SERVE_COLD=0 \
  BT_SERVE_RUNS= BT_SERVE_SWEEPS="2048x128@16,20:128"
[ "${mib:-0}" -ge 100000 ] && [ -n "${BT_PENDING_BF16:-}" ] &&
  serve bf16 $(left 560) BT_SERVE_MODES=agg BT_SERVE_COLD=0 \
    BT_SERVE_RUNS="2048x128@256:512"
cat "$md"
