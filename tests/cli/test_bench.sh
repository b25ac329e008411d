#!/usr/bin/env bash
# `baton bench` against a real null-model cluster (baton up, 1+1) over
# ZeroMQ and through baton-http: the open-loop arrival process (count,
# mean gap, coefficient of variation, measured from the JSON's per-request
# send times; Poisson and gamma --burstiness), the JSON's fields and
# their consistency, length ranges and --lengths-file, a --rates sweep
# with its SVG plot (parsed with xml.etree), failed requests reported by
# code (dead router, dead HTTP port, a 404 from baton-http, requests the
# router refused as overloaded, with a note) within --timeout-ms, streams
# a decode worker gave back counted from Finished.timings
# (--kv-overcommit on a pool of 8 blocks; null over HTTP, which does not
# tell), and usage errors.  Every step is bounded by `timeout`.
set -u
B="$BATON_BIN/baton"
tmp=$(mktemp -d)
. "$(dirname "$0")/../ports.sh" # free_ports
PORT=$(free_ports 8) # +2 http, +4/+5 a second cluster, +5 a dead one,
                     # +6/+7 a third
HPORT=$((PORT + 2))
EP="tcp://127.0.0.1:$PORT"
URL="http://127.0.0.1:$HPORT"
"$B" up --no-curve --null-model --prefill 1 --decode 1 --port "$PORT" \
  --log-dir "$tmp" >"$tmp/up.out" 2>&1 &
UP=$!
"$BATON_BIN/baton-http" --router "$EP" --listen "127.0.0.1:$HPORT" \
  --model-name nullm 2>"$tmp/http.err" &
HTTP=$!
trap 'kill -TERM $HTTP $UP 2>/dev/null; wait $HTTP $UP 2>/dev/null;
      rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; exit 1; }
# check NAME ARGS...: runs the python script on stdin with ARGS; a failed
# assertion fails the test
check() {
  local name=$1; shift
  timeout 30 python3 - "$@" || fail "check $name"
}

ok=0
for try in $(seq 1 50); do
  timeout 10 "$B" bench --router "$EP" --requests 1 --concurrency 1 \
    --timeout-ms 2000 --no-progress >/dev/null 2>&1 &&
  timeout 10 "$B" bench --http "$URL" --requests 1 --concurrency 1 \
    --timeout-ms 2000 --no-progress >/dev/null 2>&1 && { ok=1; break; }
  sleep 0.2
done
[ $ok = 1 ] || { cat "$tmp/up.out" "$tmp/http.err"; fail "cluster not up"; }

# --- the open-loop arrival process --------------------------------------
for tr in "--router $EP" "--http $URL"; do
  timeout 60 "$B" bench $tr --requests 100 --rate 50 --prompt-len 8 \
    --output-len 4 --json "$tmp/rate.json" --no-progress >"$tmp/out" 2>&1 ||
    { cat "$tmp/out"; fail "rate 50 ($tr)"; }
  cat "$tmp/out"
  check arrivals "$tmp/rate.json" 20 0.75 1.25 <<'EOF'
import json, sys, statistics as st
j = json.load(open(sys.argv[1]))
mean_want, lo, hi = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
r = j["per_request"]
assert len(r) == j["requests"] == 100, len(r)
t = sorted(x["send_ms"] for x in r)
gaps = [b - a for a, b in zip(t, t[1:])]
m = st.mean(gaps); cv = st.pstdev(gaps) / m
print("mean gap %.2f ms (want %g), cv %.2f" % (m, mean_want, cv))
assert abs(m - mean_want) <= 0.2 * mean_want, m
assert lo <= cv <= hi, cv
# sends follow the drawn schedule (the loop keeps up at 50/s; a loaded
# CI machine may deschedule it now and then)
late = sorted(x["send_ms"] - x["sched_ms"] for x in r)
assert late[50] < 2 and late[-1] < 250, late[-5:]
if j["transport"] == "zmq":
    assert j["preemptions"] == 0 and j["retries"] == 0, j["preemptions"]
else:
    assert j["preemptions"] is None and j["retries"] is None, j["retries"]
EOF
done
# gamma: burstiness 0.25 -> cv ~ 2, burstiness 4 -> cv ~ 0.5
timeout 60 "$B" bench --router "$EP" --requests 100 --rate 100 \
  --burstiness 0.25 --prompt-len 8 --output-len 2 --json "$tmp/g1.json" \
  --no-progress >/dev/null || fail "burstiness 0.25"
check bursty "$tmp/g1.json" 10 1.4 4 <<'EOF'
import json, sys, statistics as st
j = json.load(open(sys.argv[1]))
t = sorted(x["sched_ms"] for x in j["per_request"])
gaps = [b - a for a, b in zip(t, t[1:])]
m = st.mean(gaps); cv = st.pstdev(gaps) / m
print("burstiness %g: mean gap %.2f ms, cv %.2f" % (j["burstiness"], m, cv))
assert abs(m - float(sys.argv[2])) <= 0.35 * float(sys.argv[2]), m
assert float(sys.argv[3]) <= cv <= float(sys.argv[4]), cv
EOF
timeout 60 "$B" bench --router "$EP" --requests 100 --rate 100 \
  --burstiness 4 --prompt-len 8 --output-len 2 --json "$tmp/g2.json" \
  --no-progress >/dev/null || fail "burstiness 4"
check steady "$tmp/g2.json" 10 0.3 0.7 <<'EOF'
import json, sys, statistics as st
j = json.load(open(sys.argv[1]))
t = sorted(x["sched_ms"] for x in j["per_request"])
gaps = [b - a for a, b in zip(t, t[1:])]
m = st.mean(gaps); cv = st.pstdev(gaps) / m
print("burstiness %g: mean gap %.2f ms, cv %.2f" % (j["burstiness"], m, cv))
assert abs(m - float(sys.argv[2])) <= 0.2 * float(sys.argv[2]), m
assert float(sys.argv[3]) <= cv <= float(sys.argv[4]), cv
EOF

# --- JSON fields and consistency, length ranges (both transports) -------
for tr in "--router $EP" "--http $URL"; do
  timeout 60 "$B" bench $tr --requests 120 --concurrency 8 \
    --prompt-len 5:40 --output-len 2:9 --warmup 4 --slo-ttft 1000 \
    --slo-tpot 1000 --json "$tmp/c.json" --no-progress >"$tmp/out" 2>&1 ||
    { cat "$tmp/out"; fail "closed loop ($tr)"; }
  grep -q '^requests:120 ok:120 errors:0 ' "$tmp/out" ||
    { cat "$tmp/out"; fail "text report ($tr)"; }
  check fields "$tmp/c.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
need = ["schema", "transport", "target", "rate", "rate_label", "burstiness",
        "concurrency", "requests", "warmup", "completed", "failed", "ok",
        "errors", "duration_s", "req_per_s", "tok_per_s", "tok_per_s_mid",
        "input_tok_per_s", "total_tok_per_s", "goodput_req_per_s", "good",
        "slo_ttft_ms", "slo_tpot_ms", "prompt_tokens", "output_tokens",
        "output_tokens_asked", "ignore_eos", "lengths", "prompt_len",
        "output_len", "prompt_len_min", "prompt_len_max", "output_len_min",
        "output_len_max", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
        "errors_by_code", "first_errors", "per_request"]
miss = [k for k in need if k not in j]
assert not miss, miss
assert j["schema"] == "baton-bench-2" and j["rate_label"] == "closed"
assert j["requests"] == 120 and j["warmup"] == 4 and j["concurrency"] == 8
assert j["completed"] + j["failed"] == j["requests"], j
assert j["failed"] == 0 and j["errors_by_code"] == {}
assert j["good"] == j["completed"]
assert j["output_tokens"] == j["output_tokens_asked"], j
r = j["per_request"]
assert len(r) == 120 and [x["i"] for x in r] == list(range(120))
assert sum(x["output_tokens"] for x in r) == j["output_tokens"]
assert sum(x["prompt_tokens"] for x in r) == j["prompt_tokens"]
for x in r:
    assert x["ok"] and x["output_tokens"] == x["max_tokens"], x
    assert 5 <= x["prompt_tokens"] <= 40 and 2 <= x["max_tokens"] <= 9, x
    assert 0 <= x["ttft_ms"] <= x["e2e_ms"], x
    if "prompt_tokens_usage" in x:
        assert x["prompt_tokens_usage"] == x["prompt_tokens"], x
p = [x["prompt_tokens"] for x in r]; o = [x["max_tokens"] for x in r]
assert min(p) <= 9 and max(p) >= 36 and min(o) == 2 and max(o) == 9, (p, o)
assert len(set(p)) > 20
for k in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"):
    d = j[k]
    assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (k, d)
assert j["ttft_ms"]["n"] == j["e2e_ms"]["n"] == 120
assert abs(j["req_per_s"] - 120 / j["duration_s"]) < 0.01 * j["req_per_s"]
assert abs(j["tok_per_s"] * j["duration_s"] - j["output_tokens"]) < \
    0.005 * j["output_tokens"]
print("%s: fields and consistency ok" % j["transport"])
EOF
done

# --- --lengths-file: pairs in order, cycling ---------------------------
printf '# prompt output\n12 3\n\n30 7\n  7 1  \n' >"$tmp/len.txt"
timeout 60 "$B" bench --http "$URL" --requests 7 --concurrency 3 \
  --lengths-file "$tmp/len.txt" --json "$tmp/lf.json" --no-progress \
  >/dev/null || fail "lengths file"
check lengths_file "$tmp/lf.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
got = [(x["prompt_tokens"], x["max_tokens"], x["output_tokens"])
       for x in j["per_request"]]
want = [(12, 3, 3), (30, 7, 7), (7, 1, 1)] * 3
assert got == want[:7], got
assert j["lengths"] == "file" and j["prompt_len_max"] == 30
EOF
printf '12 3\n12 x\n' >"$tmp/bad.txt"
timeout 10 "$B" bench --router "$EP" --concurrency 1 \
  --lengths-file "$tmp/bad.txt" >/dev/null 2>"$tmp/err" && fail "bad file"
grep -q 'bad.txt:2' "$tmp/err" || { cat "$tmp/err"; fail "bad file msg"; }

# --- a sweep with its plot ----------------------------------------------
timeout 120 "$B" bench --router "$EP" --requests 40 --rates 40,200,inf \
  --prompt-len 16 --output-len 8 --json "$tmp/sweep.json" \
  --plot "$tmp/sweep.svg" --no-progress >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "sweep"; }
[ "$(grep -c '^rate:' "$tmp/out")" = 3 ] || fail "3 reports"
check sweep "$tmp/sweep.json" "$tmp/sweep.svg" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
j = json.load(open(sys.argv[1]))
assert isinstance(j, list) and len(j) == 3
assert [x["rate_label"] for x in j] == ["40", "200", "inf"], j
assert j[0]["rate"] == 40 and j[2]["rate"] is None
for x in j:
    assert x["completed"] == 40 and x["output_tokens"] == 320
# every run's prompts are its own (a prefix cache would serve repeats)
fnv = [set(r["prompt_fnv"] for r in x["per_request"]) for x in j]
assert all(len(f) == 40 for f in fnv), [len(f) for f in fnv]
assert not (fnv[0] & fnv[1]) and not (fnv[1] & fnv[2]) and \
    not (fnv[0] & fnv[2]), "a rate re-sent another rate's prompts"
# inf: all sent at once
assert max(r["send_ms"] for r in j[2]["per_request"]) < 50
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[2]).getroot()
assert root.tag == ns + "svg", root.tag
lines = root.findall(ns + "polyline")
assert len(lines) == 3, len(lines)
pts = root.findall(ns + "circle")
assert len(pts) >= 6, len(pts)
for p in pts:
    assert float(p.get("cx")) > 0 and float(p.get("cy")) > 0
texts = "".join(t.text or "" for t in root.iter(ns + "text"))
for s in ("TPOT p50", "TPOT p99", "TTFT p99", "output tokens/s"):
    assert s in texts, s
print("sweep + svg ok")
EOF

# --- one seed, the same prompts in every invocation ---------------------
for k in 1 2; do
  timeout 60 "$B" bench --router "$EP" --requests 12 --concurrency 4 \
    --prompt-len 8:24 --output-len 2 --seed 3 --json "$tmp/seed$k.json" \
    --no-progress >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "seed $k"; }
done
check seed "$tmp/seed1.json" "$tmp/seed2.json" <<'EOF'
import json, sys
a, b = (json.load(open(f))["per_request"] for f in sys.argv[1:3])
fa = [r["prompt_fnv"] for r in a]
assert fa == [r["prompt_fnv"] for r in b], "a seed's prompts changed"
assert len(set(fa)) == 12, fa
print("seed ok")
EOF

# --- failures: reported by code, bounded, exit 1 ------------------------
DEAD=$((PORT + 5))
t0=$(date +%s)
timeout 30 "$B" bench --router "tcp://127.0.0.1:$DEAD" --requests 5 \
  --concurrency 5 --timeout-ms 500 --json "$tmp/dead.json" --no-progress \
  >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] || { cat "$tmp/out"; fail "dead router: rc $rc"; }
[ $(( $(date +%s) - t0 )) -le 5 ] || fail "dead router: not bounded"
grep -q 'failed:5 by code: timeout=5' "$tmp/out" ||
  { cat "$tmp/out"; fail "dead router report"; }
timeout 30 "$B" bench --http "http://127.0.0.1:$DEAD" --requests 4 \
  --rate 100 --timeout-ms 2000 --json "$tmp/deadh.json" --no-progress \
  >"$tmp/out" 2>&1
[ $? = 1 ] || { cat "$tmp/out"; fail "dead http: rc"; }
grep -q 'failed:4 by code: http_connect=4' "$tmp/out" ||
  { cat "$tmp/out"; fail "dead http report"; }
timeout 30 "$B" bench --http "$URL" --model other --requests 3 \
  --concurrency 2 --json "$tmp/404.json" --no-progress >"$tmp/out" 2>&1
[ $? = 1 ] || { cat "$tmp/out"; fail "404: rc"; }
check errors "$tmp/404.json" "$tmp/deadh.json" "$tmp/dead.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["completed"] == 0 and j["failed"] == 3, j
assert j["errors_by_code"] == {"http_404:model_not_found": 3}, j
assert "does not exist" in j["first_errors"][0]["message"], j
assert all(x["error"] == "http_404:model_not_found" and not x["ok"]
           for x in j["per_request"])
for f in sys.argv[2:]:
    k = json.load(open(f))
    assert k["completed"] + k["failed"] == k["requests"] == k["failed"], k
    assert len(k["first_errors"]) >= 1
print("errors ok")
EOF
timeout 30 "$B" bench --http "$URL" --model nullm --requests 3 \
  --concurrency 2 --no-progress >/dev/null || fail "--model nullm"

# own_cluster PORT NAME ROUTER_ARGS DECODE_ARGS...: a router on PORT and
# PORT + 1 with ROUTER_ARGS (one word list), one null-model decode worker
# with DECODE_ARGS; both stopped at exit; returns once a short request
# passes (4 + 4 tokens: o's pool holds 8 blocks of 4)
OWN=""
own_cluster() {
  local port=$1 name=$2 rargs=$3
  shift 3
  # shellcheck disable=SC2086 # rargs: a word list
  "$BATON_BIN/baton-router" $rargs --listen "tcp://127.0.0.1:$port" \
    --control "tcp://127.0.0.1:$((port + 1))" >"$tmp/${name}router.log" 2>&1 &
  OWN="$OWN $!"
  "$BATON_BIN/baton-decode" --router "tcp://127.0.0.1:$((port + 1))" \
    --null-model --role both "$@" >"$tmp/${name}decode.log" 2>&1 &
  OWN="$OWN $!"
  trap 'kill -TERM $HTTP $UP $OWN 2>/dev/null;
        wait $HTTP $UP $OWN 2>/dev/null; rm -rf "$tmp"' EXIT
  for try in $(seq 1 50); do
    timeout 10 "$B" bench --router "tcp://127.0.0.1:$port" --requests 1 \
      --concurrency 1 --prompt-len 4 --output-len 4 --timeout-ms 2000 \
      --no-progress >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  cat "$tmp/${name}router.log" "$tmp/${name}decode.log"
  fail "cluster $name not up"
}

# --- streams given back (Finished.timings), a cluster of its own ---------
OPORT=$((PORT + 4))
own_cluster "$OPORT" o "--max-queue-wait-ms 0" --kv-blocks 8 --block-size 4 \
  --kv-overcommit --step-delay-ms 5
# 8 streams of 8 + 24 tokens (8 blocks of 4 each) on 8 blocks
timeout 60 "$B" bench --router "tcp://127.0.0.1:$OPORT" --requests 8 \
  --concurrency 8 --prompt-len 8 --output-len 24 --json "$tmp/over.json" \
  --no-progress >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "overcommit"; }
grep -q "^given_back:" "$tmp/out" || { cat "$tmp/out"; fail "no given_back"; }
check given_back "$tmp/over.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
r = j["per_request"]
assert j["completed"] == 8 and j["output_tokens"] == 8 * 24, j["completed"]
assert j["preemptions"] >= 1, j["preemptions"]
assert j["preemptions"] == sum(x["preemptions"] for x in r), r
assert j["preempted_requests"] == sum(x["preemptions"] > 0 for x in r)
assert j["retries"] == 0
print("given back %d times, %d requests" % (j["preemptions"],
                                            j["preempted_requests"]))
EOF

# --- refused as overloaded: reported with a note, a cluster of its own --
QPORT=$((PORT + 6))
own_cluster "$QPORT" q "--max-inflight 1" --step-delay-ms 20
# four at once past --max-inflight 1, the first ~32 steps of 20 ms (the
# others arrive well inside them): three refused
timeout 30 "$B" bench --router "tcp://127.0.0.1:$QPORT" --requests 4 \
  --concurrency 4 --output-len 32 --no-progress >"$tmp/out" 2>&1
[ $? = 1 ] || { cat "$tmp/out"; fail "overloaded: rc"; }
grep -q 'failed:3 by code: overloaded=3' "$tmp/out" &&
  grep -q 'note: the router refused or shed these as overloaded' "$tmp/out" ||
  { cat "$tmp/out"; fail "overloaded report"; }

# --- usage ---------------------------------------------------------------
"$B" bench --help >"$tmp/help" || fail "--help rc"
for o in --rates --burstiness --lengths-file --http --warmup --timeout-ms \
         --plot --json --slo-ttft; do
  grep -q -- "$o" "$tmp/help" || fail "--help lacks $o"
done
"$B" bench --requests 3 >/dev/null 2>&1; [ $? = 2 ] || fail "no target"
BATON_ROUTER= "$B" bench --router "$EP" --http "$URL" --concurrency 1 \
  >/dev/null 2>&1; [ $? = 2 ] || fail "two targets"
"$B" bench --router "$EP" --rate 0 >/dev/null 2>&1; [ $? = 2 ] ||
  fail "rate 0"
"$B" bench --router "$EP" --concurrency 1 --prompt-len 9:3 >/dev/null 2>&1
[ $? = 2 ] || fail "bad range"
"$B" bench --http "https://x:1" --concurrency 1 >/dev/null 2>&1
[ $? = 2 ] || fail "https"
echo "PASS cli/bench"
