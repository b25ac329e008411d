#!/bin/bash
# run_gpu_pending.sh [CARRY] - the measurements the session of 2026-12-06
# left for the next device call, ON THE DEVICE MACHINE from a folder
# packed here (one call of <= ~9 minutes; delete this script once its
# figures are in docs/PERFORMANCE.md):
#   cmake --build build-cuda -j2 --target baton baton-router \
#     baton-prefill baton-decode gpu_test_cuda_ipc_window
#   bash tests/gpu/pack_carry.sh pending tests/gpu/run_gpu_pending.sh \
#     bin/baton bin/baton-router bin/baton-prefill bin/baton-decode \
#     gpu/test_cuda_ipc_window
#   then run(carry=[".carry"], command="bash .carry/call.sh",
#            timeout_s=600)
#   0. test_cuda_ipc_window on the window-budget fix (a57c908: a grant
#      that finds the windows' budget spent is refused, not sent inline;
#      kv_link__win_slots_arm's new status): every check must PASS.
#   1. issue 36's goodput sweep, 2048/128 at 4-20 req/s, aggregated and
#      1P+1D under MPS (the 1P+1D rows at 16 and 20 req/s of 2026-12-06
#      waited 30-45 s for expired reservations: the bug a57c908 fixed;
#      predicted now: TTFT p99 ~1 s or less, 1,600-1,800 tok/s, and the
#      decode log's kv_grants_waited > 0 instead of "expired"), which
#      answers where the modes cross on one GPU.
#   2. issue 37's serving rows with fast accumulation on the H200: fp8 +
#      FP8 KV 2048/128 @256 (2,809 tok/s with exact accumulation; an
#      H100 gained 9%: predicted ~3,050) and 2048/2048 @384 streams
#      (BT_SERVE_MAX_SEQS=384; 9,101 at 224 streams; the pool holds 1.8M
#      tokens).
# Writes pending.md (the tables) under $OUT with each step's serve.md and
# the decode / prefill logs' lines that tell (grants waited, expired
# reservations, inline refusals).
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

timeout -k 5 60 "$c/gpu/test_cuda_ipc_window" > "$out/cipc.txt" 2>&1
{ echo; echo "### test_cuda_ipc_window: rc $?," \
    "$(grep -c '^PASS' "$out/cipc.txt") PASS," \
    "$(grep -c '^FAIL' "$out/cipc.txt") FAIL"
  grep '^FAIL' "$out/cipc.txt" | head -5; } >> "$md"

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
    echo '```'; } >> "$md"
  rm -f "$out/$name/serve_logs.tgz"
}
serve sweep $(left 330) BT_SERVE_MODES=agg,disagg BT_SERVE_COLD=0 \
  BT_SERVE_RUNS= BT_SERVE_SWEEPS="2048x128@4,8,12,16,20:128"
serve fp8 $(left 570) BT_SERVE_PRECISION=fp8 BT_SERVE_KV_DTYPE=fp8 \
  BT_SERVE_MODES=agg BT_SERVE_COLD=0 BT_SERVE_MAX_SEQS=384 \
  BT_SERVE_RUNS="2048x128@256:512;2048x2048@384:768"
cat "$md"
