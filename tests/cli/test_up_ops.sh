#!/usr/bin/env bash
# `baton up` as an operator meets it (issue 40), real processes, null model:
#   1. the client port is taken by someone else: `baton up` fails at once
#      (exit 1, the port named) and starts no worker;
#   2. its router exits before listening (a bad router flag): `baton up`
#      fails at once, naming the router's log, and starts no worker;
#   3. --log-dir a/b/c that does not exist is created and holds every
#      log; --http-port starts baton-http and prints its URL (its /health
#      answers 200 with the cluster up); --metrics-port prints every
#      process's /metrics URL; worker names carry this run's pid;
#   4. a --log-dir that cannot be created is refused with a clear error;
#   5. a worker and baton-http started without --router say on stderr
#      which endpoint they wait on;
#   6. model load progress: shown with BATON_LOAD_PROGRESS=1 (a terminal
#      and a big checkpoint turn it on by themselves), absent otherwise.
set -u
B="$BATON_BIN"
tmp=$(mktemp -d)
UP= HOLD= W=
fails=0
cleanup() {
  for p in $UP $HOLD $W; do kill -TERM "$p" 2>/dev/null; done
  for p in $UP $HOLD $W; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

. "$(dirname "$0")/../ports.sh" # free_ports
http_status() { # URL -> status code (000 when no answer)
  python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
PY
}

# 1: the port is taken.
port=$(free_ports 2)
python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(); time.sleep(30)" &
HOLD=$!
for i in $(seq 1 50); do
  [ "$(http_status http://127.0.0.1:$port/)" != 000 ] && break
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" \
    2>/dev/null && break
  sleep 0.1
done
start=$(date +%s%N)
timeout 20 "$B/baton" up --null-model --port "$port" --log-dir "$tmp/l1" \
  >"$tmp/1.out" 2>&1
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$tmp/1.out"
[ $rc = 1 ] || fail "port in use: exit $rc, want 1"
[ $ms -lt 3000 ] || fail "port in use: took $ms ms"
grep -q "port $port on 127.0.0.1 is in use" "$tmp/1.out" ||
  fail "port in use: no clear error"
ls "$tmp/l1" 2>/dev/null | grep -q -e prefill -e decode &&
  fail "port in use: workers were started"
kill $HOLD; wait $HOLD 2>/dev/null; HOLD=

# 2: the router exits at once.
port=$(free_ports 2)
timeout 20 "$B/baton" up --null-model --port "$port" --log-dir "$tmp/l2" \
  --kv-transport bogus >"$tmp/2.out" 2>&1
rc=$?
cat "$tmp/2.out"
[ $rc = 1 ] || fail "router exits: exit $rc, want 1"
grep -q "the router exited (status" "$tmp/2.out" ||
  fail "router exits: not reported"
grep -q "$tmp/l2/router.log" "$tmp/2.out" || fail "router exits: no log named"
ls "$tmp/l2" | grep -q -e prefill -e decode &&
  fail "router exits: workers were started"

# 3: a missing log directory, baton-http, metrics URLs, unique names.
port=$(free_ports 2); hport=$(free_ports 1); mport=$(free_ports 3)
"$B/baton" up --null-model --port "$port" --http-port "$hport" \
  --metrics-port "$mport" --log-dir "$tmp/new/a/b" >"$tmp/3.out" 2>&1 &
UP=$!
for i in $(seq 1 100); do
  grep -q '^kv transports' "$tmp/3.out" && break
  sleep 0.1
done
cat "$tmp/3.out"
grep -q "^http: http://127.0.0.1:$hport/v1" "$tmp/3.out" ||
  fail "no baton-http URL printed"
grep -q "^metrics: router  *http://127.0.0.1:$mport/metrics" "$tmp/3.out" ||
  fail "no router metrics URL"
[ "$(grep -c "^metrics: .*-$UP " "$tmp/3.out")" = 2 ] ||
  fail "worker names do not carry the run's pid $UP"
for i in $(seq 1 50); do
  [ "$(http_status http://127.0.0.1:$hport/health)" = 200 ] && break
  sleep 0.1
done
[ "$(http_status http://127.0.0.1:$hport/health)" = 200 ] ||
  fail "baton-http /health not 200"
for k in 1 2; do
  [ "$(http_status http://127.0.0.1:$((mport + k))/health)" = 200 ] ||
    fail "worker $k /health not 200"
done
# CURVE: baton up made keys; clients with them get in, others do not.
grep -q "^curve: clients connect with --curve-secret-key $tmp/new/a/b/keys/client.key" \
  "$tmp/3.out" || fail "no CURVE client flags printed"
[ "$(stat -c %a "$tmp/new/a/b/keys/router.key")" = 600 ] ||
  fail "router.key not mode 600"
( . "$tmp/new/a/b/keys/client.env"
  timeout 10 "$B/baton" status --router "tcp://127.0.0.1:$port" ) \
  >"$tmp/3s.out" 2>&1 || fail "status with the run's client key failed"
grep -q "^security: curve" "$tmp/3s.out" || fail "status: security not curve"
BT_CLIENT_CONNECT_TIMEOUT_MS=1000 timeout 10 "$B/baton" status \
  --router "tcp://127.0.0.1:$port" >"$tmp/3n.out" 2>&1 &&
  fail "status without keys got an answer"
kill -TERM $UP; wait $UP; rc=$?; UP=
[ $rc = 0 ] || fail "baton up stopped with $rc"
for f in router http prefill-$port-0 decode-$port-0; do
  ls "$tmp/new/a/b/" | grep -q "^$f" || fail "no log $f in the new directory"
done

# 4: a log directory that cannot be made.
touch "$tmp/file"
timeout 10 "$B/baton" up --null-model --port "$(free_ports 2)" \
  --log-dir "$tmp/file/logs" >"$tmp/4.out" 2>&1
rc=$?
cat "$tmp/4.out"
[ $rc = 1 ] || fail "bad log dir: exit $rc"
grep -q "cannot create or write the log directory $tmp/file/logs" \
  "$tmp/4.out" || fail "bad log dir: no clear error"

# 5: no --router: say where it waits.
port=$(free_ports 2)
BATON_ROUTER=tcp://127.0.0.1:$((port + 1)) "$B/baton-decode" --null-model \
  2>"$tmp/5.err" &
W=$!
for i in $(seq 1 30); do
  grep -q "waiting for the router" "$tmp/5.err" && break
  sleep 0.1
done
kill -TERM $W; wait $W 2>/dev/null; W=
grep -q "baton-decode: no --router given: waiting for the router at tcp://127.0.0.1:$((port + 1)) (BATON_ROUTER" \
  "$tmp/5.err" || { cat "$tmp/5.err"; fail "decode: no waiting line"; }
"$B/baton-http" --listen "127.0.0.1:$(free_ports 1)" 2>"$tmp/6.err" &
W=$!
for i in $(seq 1 30); do
  grep -q "waiting for the router" "$tmp/6.err" && break
  sleep 0.1
done
kill -TERM $W; wait $W 2>/dev/null; W=
grep -q "baton-http: no --router given: waiting for the router at tcp://127.0.0.1:5555 (the default" \
  "$tmp/6.err" || { cat "$tmp/6.err"; fail "baton-http: no waiting line"; }

# 6: load progress.
M="$BT_SHARED_DIR/models/aidreams260K.bin"
BATON_LOAD_PROGRESS=1 timeout 30 "$B/baton" run --model "$M" --prompt-ids 1,2 \
  --ids --max-tokens 2 2>"$tmp/7.err" >/dev/null || fail "run with progress"
grep -q "loading aidreams260K.bin: .*(100%)" "$tmp/7.err" ||
  { cat "$tmp/7.err"; fail "no load progress"; }
timeout 30 "$B/baton" run --model "$M" --prompt-ids 1,2 --ids --max-tokens 2 \
  2>"$tmp/8.err" >/dev/null || fail "run without progress"
grep -q "loading aidreams" "$tmp/8.err" && fail "progress off a terminal"

[ $fails = 0 ] && echo "test_up_ops: OK"
exit $fails
