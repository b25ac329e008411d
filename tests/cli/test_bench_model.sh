#!/usr/bin/env bash
# `baton bench` on a real model (aidreams260K, 1 prefill + 1 decode,
# baton-http with its tokenizer in front): over ZeroMQ and over HTTP the
# token counts equal what was asked (EOS ignored), every request has a
# TTFT below its E2E and a TPOT, and ITL covers (nearly) every gap: over
# HTTP, each SSE event with text is one token, so the gap count is at
# least 80 % of sum(output - 1) (a token may decode to no text); text
# prompts (--text) are served too.
set -u
B="$BATON_BIN/baton"
M="$BT_SHARED_DIR/models"
[ -f "$M/aidreams260K.bin" ] || { echo "SKIP: no aidreams260K"; exit 0; }
tmp=$(mktemp -d)
. "$(dirname "$0")/../ports.sh" # free_ports
PORT=$(free_ports 3) # +2 http
HPORT=$((PORT + 2))
EP="tcp://127.0.0.1:$PORT"
"$B" up --no-curve --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams-tok512.bin" \
  --prefill 1 --decode 1 --port "$PORT" --log-dir "$tmp" \
  >"$tmp/up.out" 2>&1 &
UP=$!
"$BATON_BIN/baton-http" --router "$EP" --listen "127.0.0.1:$HPORT" \
  2>"$tmp/http.err" &
HTTP=$!
trap 'kill -TERM $HTTP $UP 2>/dev/null; wait $HTTP $UP 2>/dev/null;
      rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

ok=0
for try in $(seq 1 50); do
  timeout 10 "$B" bench --http "http://127.0.0.1:$HPORT" --requests 1 \
    --concurrency 1 --timeout-ms 2000 --no-progress >/dev/null 2>&1 &&
    { ok=1; break; }
  sleep 0.2
done
[ $ok = 1 ] || { cat "$tmp/up.out" "$tmp/http.err"; fail "cluster not up"; }

for tr in "--router $EP" "--http http://127.0.0.1:$HPORT"; do
  timeout 120 "$B" bench $tr --requests 24 --rate 40 --concurrency 8 \
    --prompt-len 8:48 --output-len 16:40 --vocab 512 --warmup 2 \
    --json "$tmp/m.json" --no-progress >"$tmp/out" 2>&1 ||
    { cat "$tmp/out"; fail "bench $tr"; }
  cat "$tmp/out"
  timeout 30 python3 - "$tmp/m.json" <<'PY' || fail "check $tr"
import json, sys
j = json.load(open(sys.argv[1]))
r = j["per_request"]
assert j["completed"] == 24 and j["failed"] == 0, j["errors_by_code"]
assert j["output_tokens"] == j["output_tokens_asked"]
gaps = 0
for x in r:
    assert x["ok"] and x["output_tokens"] == x["max_tokens"], x
    assert 0 < x["ttft_ms"] < x["e2e_ms"] and x["tpot_ms"] > 0, x
    assert 8 <= x["prompt_tokens"] <= 48, x
    gaps += x["output_tokens"] - 1
assert j["tpot_ms"]["n"] == 24 and j["tpot_ms"]["p50"] > 0
assert 0.8 * gaps <= j["itl_ms"]["n"] <= gaps, (j["itl_ms"]["n"], gaps)
# at most 8 in flight: sends wait for a free slot
ends = sorted(x["send_ms"] + x["e2e_ms"] for x in r)
for i, x in enumerate(sorted(r, key=lambda x: x["send_ms"])):
    if i >= 8:
        assert x["send_ms"] >= ends[i - 8] - 0.5, (i, x)
print("%s: tokens, ttft/tpot, itl %d of %d gaps ok"
      % (j["transport"], j["itl_ms"]["n"], gaps))
PY
done
# text prompts (--text), tokenized by the router (baton up passes it the
# workers' --tokenizer): all served
timeout 60 "$B" bench --router "$EP" --text --requests 12 --concurrency 4 \
  --prompt-len 4:16 --output-len 8 --vocab 512 --no-progress \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "bench --text"; }
grep -q "requests:12 ok:12 errors:0" "$tmp/out" ||
  { cat "$tmp/out"; fail "bench --text: not all served"; }
echo "PASS cli/bench_model"
