#!/usr/bin/env bash
# baton-http over TLS (issue 42): --tls-cert/--tls-key with a self-signed
# P-256 certificate made here (openssl), on an aggregated cluster (router
# + one aidreams260K decode worker running --role both):
#   1. HTTPS works: a completion (curl --cacert, the certificate checked
#      against 127.0.0.1) and a stream (SSE events, [DONE]);
#   2. plain HTTP to the TLS port gets no HTTP answer;
#   3. it fails closed: a key file that is not a key, a key that does not
#      match the certificate, a missing file, and a certificate without a
#      key each stop baton-http at start with a message saying so (never
#      plain HTTP instead).
set -u
B="$BATON_BIN"
M="$BT_SHARED_DIR/models"
tmp=$(mktemp -d)
pids=()
fails=0
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
for tool in openssl curl; do
  command -v $tool >/dev/null || { echo "FAIL: $tool not installed (make deps)"; exit 1; }
done
. "$(dirname "$0")/../ports.sh" # free_ports

mkcert() { # DIR: cert.pem + key.pem for 127.0.0.1
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1/key.pem" -out "$1/cert.pem" -days 2 -subj /CN=127.0.0.1 \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" 2>"$1/openssl.log" ||
    { cat "$1/openssl.log"; exit 1; }
}
mkdir -p "$tmp/a" "$tmp/b"
mkcert "$tmp/a"
mkcert "$tmp/b" # another key: does not match a's certificate

port=$(free_ports 2); hport=$(free_ports 1)
"$B/baton-router" --listen tcp://127.0.0.1:$port \
  --control tcp://127.0.0.1:$((port+1)) --heartbeat-ms 100 2>"$tmp/router.log" &
pids+=($!)
"$B/baton-decode" --router tcp://127.0.0.1:$((port+1)) \
  --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams-tok512.bin" \
  --threads 1 --name d0 --role both 2>"$tmp/decode.log" &
pids+=($!)
"$B/baton-http" --router tcp://127.0.0.1:$port --listen 127.0.0.1:$hport \
  --tokenizer "$M/aidreams-tok512.bin" --model-name aidreams \
  --tls-cert "$tmp/a/cert.pem" --tls-key "$tmp/a/key.pem" 2>"$tmp/http.log" &
pids+=($!)

url="https://127.0.0.1:$hport"
ok=
for i in $(seq 1 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
         --cacert "$tmp/a/cert.pem" "$url/health")
  [ "$code" = 200 ] && { ok=1; break; }
  sleep 0.2
done
[ -n "$ok" ] || { fail "HTTPS /health never 200 (last $code)"; cat "$tmp/http.log"; exit 1; }

# 1. a completion and a stream over HTTPS
body=$(curl -s --max-time 20 --cacert "$tmp/a/cert.pem" "$url/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"prompt":"The river","max_tokens":8,"temperature":0}')
python3 - "$body" <<'PY' || fail "HTTPS completion: $body"
import json, sys
j = json.loads(sys.argv[1])
assert j["object"] == "text_completion", j
assert j["choices"][0]["text"], j
assert j["usage"]["completion_tokens"] > 0, j
PY
stream=$(curl -s -N --max-time 20 --cacert "$tmp/a/cert.pem" "$url/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"prompt":"The river","max_tokens":8,"temperature":0,"stream":true}')
events=$(printf '%s\n' "$stream" | grep -c '^data: {')
printf '%s\n' "$stream" | grep -q '^data: \[DONE\]' || fail "HTTPS stream has no [DONE]: $stream"
[ "$events" -ge 2 ] || fail "HTTPS stream: $events events"
# without the CA the certificate is refused (it is really TLS, checked)
curl -s -o /dev/null --max-time 5 "$url/health" && fail "curl accepted an unknown CA"
echo "HTTPS: completion ok, stream of $events events"

# 2. plain HTTP to the TLS port: no HTTP answer
plain=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$hport/health")
[ "$plain" = 000 ] || fail "plain HTTP to the TLS port answered $plain"
# ...and the server still serves HTTPS afterwards
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
       --cacert "$tmp/a/cert.pem" "$url/livez")
[ "$code" = 200 ] || fail "HTTPS /livez after a plain request: $code"

# 3. fails closed: each bad setup exits non-zero at once with a message
refuse() { # WHAT PATTERN ARGS...: baton-http must exit 1, saying PATTERN
  local what=$1 pat=$2; shift 2
  local p; p=$(free_ports 1)
  timeout 10 "$B/baton-http" --router tcp://127.0.0.1:$port \
    --listen 127.0.0.1:$p "$@" >"$tmp/refuse.log" 2>&1
  local rc=$?
  if [ $rc -ne 1 ]; then
    fail "$what: exit $rc, expected 1"; cat "$tmp/refuse.log"
  elif ! grep -q -- "$pat" "$tmp/refuse.log"; then
    fail "$what: no '$pat' in: $(cat "$tmp/refuse.log")"
  elif curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/livez"; then
    fail "$what: something serves on the port"
  else
    echo "refused ($what): $(grep -- "$pat" "$tmp/refuse.log" | head -1)"
  fi
}
echo "not a key" > "$tmp/bad.pem"
refuse "garbage key" "not a PEM file" --tls-cert "$tmp/a/cert.pem" --tls-key "$tmp/bad.pem"
refuse "mismatched key" "rejected" --tls-cert "$tmp/a/cert.pem" --tls-key "$tmp/b/key.pem"
refuse "missing key" "cannot read" --tls-cert "$tmp/a/cert.pem" --tls-key "$tmp/none.pem"
refuse "cert without key" "go together" --tls-cert "$tmp/a/cert.pem"
printf -- '-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n' > "$tmp/corrupt.pem"
refuse "corrupt PEM key" "rejected" --tls-cert "$tmp/a/cert.pem" --tls-key "$tmp/corrupt.pem"
refuse "key as cert" "rejected" --tls-cert "$tmp/a/key.pem" --tls-key "$tmp/a/key.pem"

if [ $fails -ne 0 ]; then
  echo "--- baton-http log"; tail -20 "$tmp/http.log"
  echo "$fails check(s) failed"
  exit 1
fi
echo "PASS gateway/http_tls"
