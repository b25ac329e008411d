#!/usr/bin/env bash
# prefix_bench.sh - the prefix-cache measurement of docs/PERFORMANCE.md
# ("Prefix cache (CPU)"; issue 38), on the CPU with stories260K (context
# 512).  Not a CTest test: it takes minutes and prints a table.
#   usage: tests/cli/prefix_bench.sh BUILD_DIR
# Runs, each on a fresh cluster (router + aggregated --role both workers,
# 1 thread each):
#   rag-off / rag-on     1 worker, every prompt = one 448-token shared
#                        document + 32 own tokens, cache off / on
#   rand-off / rand-on   1 worker, random 480-token prompts (nothing
#                        shared): the cache's overhead
#   chat-rr / chat-kv    4 workers, 7 multi-turn sessions (a 128-token
#                        shared system prompt, +40 tokens a turn),
#                        --policy round-robin / kv-aware (weights 1,1
#                        and overlap=1,load=0.1); hit rate =
#                        hit / looked-up prompt tokens over the 4 workers
#   *-1p1d-off / -on     disaggregated: 1 baton-prefill + 1 baton-decode,
#                        both caches off / on (issue 38 item 2); hit rate
#                        over both pools (each looks every prompt up),
#                        plus the KV blocks handed off
# PREFIX_BENCH_ONLY="rag-1p1d-off rag-1p1d-on": only the runs named.
set -u
BUILD=${1:?usage: prefix_bench.sh BUILD_DIR}
B="$BUILD/bin"
M="${BT_SHARED_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}/models"
MODEL="$M/stories260K.bin"
[ -f "$MODEL" ] || { echo "no $MODEL"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

# cluster N_WORKERS CACHE POLICY: starts it; sets EP and MPORTS
cluster() {
  local n=$1 cache=$2 policy=$3 port=$((20000 + RANDOM % 12000))
  EP="tcp://127.0.0.1:$port"
  MPORTS=""
  "$B/baton-router" --listen "$EP" --control "tcp://127.0.0.1:$((port + 1))" \
    --policy "$policy" ${KV_WEIGHTS:+--kv-weights "$KV_WEIGHTS"} \
    2>"$tmp/router.log" &
  if [ -n "${DISAGG:-}" ]; then # 1 prefill + 1 decode worker
    MPORTS="$((port + 10)) $((port + 11))"
    "$B/baton-prefill" --router "tcp://127.0.0.1:$((port + 1))" \
      --model "$MODEL" --threads 1 --name p0 --prefix-cache "$cache" \
      --metrics-port $((port + 10)) 2>"$tmp/p0.log" &
    "$B/baton-decode" --router "tcp://127.0.0.1:$((port + 1))" \
      --model "$MODEL" --threads 1 --name d0 --role decode \
      --kv-blocks 1024 --prefix-cache "$cache" \
      --metrics-port $((port + 11)) 2>"$tmp/d0.log" &
    n=0
  fi
  for i in $(seq 0 $((n - 1))); do
    local mp=$((port + 10 + i))
    MPORTS="$MPORTS $mp"
    "$B/baton-decode" --router "tcp://127.0.0.1:$((port + 1))" \
      --model "$MODEL" --threads 1 --name "w$i" --role both \
      --kv-blocks 1024 --prefix-cache "$cache" --metrics-port "$mp" \
      2>"$tmp/w$i.log" &
  done
  for try in $(seq 1 100); do
    timeout 10 "$B/baton" bench --router "$EP" --requests 1 --concurrency 1 \
      --vocab 512 --prompt-len 8 --output-len 2 --no-progress \
      >/dev/null 2>&1 && break
    sleep 0.2
  done
}

stop() { kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; }

# sum of a worker metric over MPORTS
msum() {
  local s=0 v
  for p in $MPORTS; do
    v=$(curl -s "http://127.0.0.1:$p/metrics" | awk -v k="$1" '$1 == k { print $2 }')
    s=$((s + ${v:-0}))
  done
  echo $s
}

# run NAME WORKERS CACHE POLICY BENCH_ARGS...
run() {
  local name=$1 n=$2 cache=$3 policy=$4
  shift 4
  case " ${PREFIX_BENCH_ONLY:-$name} " in *" $name "*) ;; *) return ;; esac
  cluster "$n" "$cache" "$policy"
  local h0 l0 s0
  h0=$(msum baton_worker_prefix_hit_tokens_total)
  l0=$(msum baton_worker_prefix_lookup_tokens_total)
  s0=$(msum baton_worker_kv_blocks_sent_total)
  "$B/baton" bench --router "$EP" --vocab 512 --no-progress --seed 7 "$@" \
    --json "$tmp/$name.json" >"$tmp/$name.out" 2>&1 || { cat "$tmp/$name.out"; }
  sleep 0.3 # the last heartbeat's counters
  local h l sent
  h=$(( $(msum baton_worker_prefix_hit_tokens_total) - h0 ))
  l=$(( $(msum baton_worker_prefix_lookup_tokens_total) - l0 ))
  sent=$(( $(msum baton_worker_kv_blocks_sent_total) - s0 ))
  python3 - "$tmp/$name.json" "$name" "$h" "$l" "$sent" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j = j[0] if isinstance(j, list) else j
h, l, sent = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
hr = "%.1f%%" % (100.0 * h / l) if l > 0 else "-"
if sent > 0:
    hr += ", %d KV blocks handed off" % sent
print("| %s | %d | %.1f | %.1f | %.1f | %.1f | %s |" % (
    sys.argv[2], j["completed"], j["ttft_ms"]["p50"], j["ttft_ms"]["p99"],
    j["e2e_ms"]["p50"], j["tok_per_s"], hr))
EOF
  stop
}

echo "| run | ok | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | out tok/s | prefix hit rate |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
RAG="--requests 64 --concurrency 2 --shared-prefix-len 448 --prompt-len 32 --output-len 16"
run rag-off 1 off least-loaded $RAG
run rag-on 1 on least-loaded $RAG
RAND="--requests 64 --concurrency 2 --prompt-len 480 --output-len 16"
run rand-off 1 off least-loaded $RAND
run rand-on 1 on least-loaded $RAND
# 7 sessions over 4 workers: round robin does not keep a session on one
# worker by accident (8 would)
CHAT="--requests 70 --concurrency 4 --sessions 7 --shared-prefix-len 128 --prompt-len 36 --output-len 8"
run chat-rr 4 on round-robin $CHAT
run chat-kv-1-1 4 on kv-aware $CHAT
KV_WEIGHTS="overlap=1,load=0.1" run chat-kv-1-0.1 4 on kv-aware $CHAT
# disaggregated 1P+1D: prefill computes the uncached suffix, the hand-off
# moves the blocks the decode worker lacks
DISAGG=1 run rag-1p1d-off 1 off least-loaded $RAG
DISAGG=1 run rag-1p1d-on 1 on least-loaded $RAG
DISAGG=1 run chat-1p1d-off 1 off least-loaded $CHAT
DISAGG=1 run chat-1p1d-on 1 on least-loaded $CHAT
# the ideal: every request on the worker holding its session's last turn
# (or, for a first turn, the system prompt) - one cache seeing everything
python3 - <<'EOF'
bs, shared, step, sessions, n = 16, 128, 36, 7, 70
hit = look = 0
for i in range(n):
    t = i // sessions
    plen = shared + step * (t + 1)
    prev = shared if t == 0 else shared + step * t
    if i == 0:
        prev = 0
    look += plen
    hit += min(prev, plen - 1) // bs * bs
print("| chat ideal (one cache) | | | | | | %.1f%% |" % (100.0 * hit / look))
EOF
