#!/usr/bin/env bash
# A real Prometheus scrapes a running cluster (issue 40).  `baton up`
# (null model, 1 prefill + 2 decode, --metrics-port, --http-port) serves
# the router's, every worker's and baton-http's /metrics:
#   1. `promtool check metrics` accepts each endpoint's text (lint clean);
#   2. a real Prometheus (Debian's package; its own temp data dir, a
#      free port, 1 s scrape interval) scrapes them all (`up` == 1);
#   3. PromQL through its HTTP API: sum(baton_router_workers) equals the
#      worker count, every worker exports its KV gauge and its info,
#      tokens the workers generated are counted, and no name is exported
#      by two processes (one owner per metric name);
#   4. every metric name scraped is in docs/OPERATIONS.md, and every
#      query of deploy/grafana/baton.json runs in this Prometheus.
# Skips (exit 0 with a message) only when prometheus/promtool are not
# installed (`make deps` installs Debian's `prometheus`).
set -u
B="$BATON_BIN"
tmp=$(mktemp -d)
UP= PROM=
fails=0
cleanup() {
  [ -n "$PROM" ] && { kill -TERM $PROM 2>/dev/null; wait $PROM 2>/dev/null; }
  [ -n "$UP" ] && { kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null; }
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "SKIP: prometheus/promtool not installed (apt-get install prometheus)"
  exit 0
fi

. "$(dirname "$0")/../ports.sh" # free_ports
# query EXPR -> the first result's value ("none" when empty)
query() {
  python3 - "http://127.0.0.1:$pport/api/v1/query" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
try:
    r = json.load(urllib.request.urlopen(url, timeout=5))
except Exception as e:
    print("error"); sys.exit(0)
res = r.get("data", {}).get("result", [])
print(res[0]["value"][1] if res else "none")
PY
}
# wait_query EXPR WANT SECONDS
wait_query() {
  local got=""
  for i in $(seq 1 $(( $3 * 5 ))); do
    got=$(query "$1")
    [ "$got" = "$2" ] && return 0
    sleep 0.2
  done
  fail "$1 = $got, want $2"
  return 1
}

port=$(free_ports 2); hport=$(free_ports 1); mport=$(free_ports 4)
pport=$(free_ports 1)
"$B/baton" up --no-curve --null-model --prefill 1 --decode 2 --port "$port" \
  --http-port "$hport" --metrics-port "$mport" --log-dir "$tmp/logs" \
  >"$tmp/up.out" 2>&1 &
UP=$!
for i in $(seq 1 150); do
  grep -q '^kv transports' "$tmp/up.out" && break
  sleep 0.1
done
grep -q '^kv transports' "$tmp/up.out" || { cat "$tmp/up.out"; exit 1; }
# some traffic: tokens to count
for i in 1 2 3; do
  timeout 20 "$B/baton" generate --router "tcp://127.0.0.1:$port" \
    --prompt-ids "1 2 3 4 5" --max-tokens 8 >/dev/null 2>&1 ||
    fail "generate $i"
done

# 1: promtool on each endpoint's text.
targets=""
for p in $mport $((mport + 1)) $((mport + 2)) $((mport + 3)) $hport; do
  python3 -c "
import sys, urllib.request
sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$p/metrics',
                                        timeout=5).read().decode())" \
    >"$tmp/m.$p" || fail "scrape $p"
  if ! promtool check metrics <"$tmp/m.$p" >"$tmp/lint.$p" 2>&1; then
    cat "$tmp/lint.$p"; fail "promtool check metrics on port $p"
  fi
  targets="$targets'127.0.0.1:$p',"
done

# 2: a real Prometheus.
cat >"$tmp/prom.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: baton-router
    static_configs: [{targets: ['127.0.0.1:$mport']}]
  - job_name: baton-worker
    static_configs:
      - targets: ['127.0.0.1:$((mport + 1))', '127.0.0.1:$((mport + 2))',
                  '127.0.0.1:$((mport + 3))']
  - job_name: baton-http
    static_configs: [{targets: ['127.0.0.1:$hport']}]
YML
promtool check config "$tmp/prom.yml" >/dev/null || fail "promtool check config"
timeout 120 prometheus --config.file="$tmp/prom.yml" \
  --storage.tsdb.path="$tmp/data" --web.listen-address="127.0.0.1:$pport" \
  >"$tmp/prom.log" 2>&1 &
PROM=$!
wait_query 'count(up == 1)' 5 30 || { tail -20 "$tmp/prom.log"; exit 1; }

# 3: PromQL.
wait_query 'sum(baton_router_workers)' 3 10
wait_query 'count(baton_worker_info)' 3 10
wait_query 'sum(baton_worker_registered)' 3 10
wait_query 'count(baton_worker_kv_blocks)' 2 10   # decode workers' pools
wait_query 'sum(baton_http_router_workers)' 3 10
wait_query 'baton_http_router_up' 1 10
got=$(query 'sum(baton_worker_generated_tokens_total)')
[ "${got%%.*}" != none ] && [ "${got%%.*}" -ge 21 ] 2>/dev/null ||
  fail "generated tokens counted: $got"
got=$(query 'sum(baton_router_requests_total{outcome="length"})')
[ "$got" = 3 ] || fail "router requests: $got"
# one owner per name: no metric name comes from two jobs
got=$(query 'count(count by (__name__) (count by (__name__, job) ({__name__=~"baton_.+"})) > 1)')
[ "$got" = none ] || fail "$got metric names come from more than one job"

# 4: every name scraped is documented; every dashboard query is valid
# PromQL (Prometheus parses and runs each through its API).
for f in "$tmp"/m.*; do
  for name in $(sed -n 's/^# TYPE \([a-z_:]*\) .*/\1/p' "$f"); do
    grep -q "\`$name\`" "$BT_SOURCE_DIR/docs/OPERATIONS.md" ||
      fail "$name is not in docs/OPERATIONS.md"
  done
done
python3 - "http://127.0.0.1:$pport/api/v1/query" \
  "$BT_SOURCE_DIR/deploy/grafana/baton.json" <<'PY' || fail "dashboard"
import json, sys, urllib.parse, urllib.request, urllib.error
dash = json.load(open(sys.argv[2]))
bad = 0
n = 0
for p in dash["panels"]:
    for t in p.get("targets", []):
        n += 1
        url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": t["expr"]})
        try:
            r = json.load(urllib.request.urlopen(url, timeout=5))
        except urllib.error.HTTPError as e:
            r = json.load(e)
        if r.get("status") != "success":
            print("dashboard query fails:", t["expr"], r.get("error"))
            bad += 1
print("dashboard: %d queries, %d failed" % (n, bad))
sys.exit(1 if bad or n < 20 else 0)
PY

kill -TERM $PROM; wait $PROM 2>/dev/null; PROM=
kill -TERM $UP; wait $UP; rc=$?; UP=
[ $rc = 0 ] || fail "baton up exited $rc"
[ $fails = 0 ] && echo "test_prometheus: OK"
exit $fails
