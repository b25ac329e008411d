#!/usr/bin/env bash
# `baton status` (the readiness command of the deploy scripts) and the
# workers' router/host settings, on a small CPU cluster (aidreams260K):
#   1. `baton status --wait-workers 1,1`, started before any worker, exits
#      0 once a prefill and a decode worker registered, and prints them;
#   2. BATON_ROUTER: the prefill worker has only the environment variable;
#      the decode worker has a wrong BATON_ROUTER and the right --router
#      (the flag wins), so both registering proves both;
#   3. host identity: prefill BATON_HOST_ID=host-a, decode --host-id
#      host-b: the router pairs them over "ucx" (other hosts), where the
#      default identity (one machine) gives "ucx-shm"; a second decode
#      worker with --host-id host-a pairs over "ucx-shm"; completions
#      equal `baton run`'s ids;
#   4. a decode worker with --role both counts as prefill-capable
#      (--wait-workers 2,3); --json reports ready, roles and host ids;
#   5. counts not reached: exit 1 within --timeout; no router: exit 1 in
#      time; bad flags (and an empty --host-id): exit 2.
set -u
B="$BATON_BIN"
M="$BT_SHARED_DIR/models/aidreams260K.bin"
tmp=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "--- $f"; tail -n 5 "$f"; done
  exit 1
}
ms() { echo $(( $(date +%s%N) / 1000000 )); }

. "$(dirname "$0")/../ports.sh" # free_ports
PORT=$(free_ports 2)
CLIENT=tcp://127.0.0.1:$PORT
CONTROL=tcp://127.0.0.1:$((PORT + 1))
W=(--model "$M" --threads 1)

# 5a. usage errors and a missing router, before anything runs
timeout 10 "$B/baton" status >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "no --router: exit $rc, want 2"
timeout 10 "$B/baton" status --router "$CLIENT" --wait-workers 1 >/dev/null 2>&1
rc=$?; [ $rc = 2 ] || fail "--wait-workers 1: exit $rc, want 2"
timeout 10 "$B/baton" status --router "$CLIENT" --timeout 0 >/dev/null 2>&1
rc=$?; [ $rc = 2 ] || fail "--timeout 0: exit $rc, want 2"
timeout 10 "$B/baton-decode" --router "$CONTROL" --host-id "" --null-model \
  >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "--host-id '': exit $rc, want 2"
t0=$(ms)
timeout 10 "$B/baton" status --router "$CLIENT" --timeout 1 >/dev/null 2>&1
rc=$?; t=$(( $(ms) - t0 ))
[ $rc = 1 ] && [ $t -lt 3000 ] || fail "no router: exit $rc after $t ms"
echo "ok usage errors exit 2; no router: exit 1 after $t ms (--timeout 1)"

# 1. the wait starts before the cluster
timeout 40 "$B/baton" status --router "$CLIENT" --wait-workers 1,1 \
  --timeout 30 >"$tmp/wait.out" 2>"$tmp/wait.err" &
WAIT=$!
"$B/baton-router" --listen "$CLIENT" --control "$CONTROL" \
  --heartbeat-ms 100 2>"$tmp/router.log" &
PIDS+=($!)
# 2 + 3: router from the environment only / a wrong environment, the flag
BATON_ROUTER=$CONTROL BATON_HOST_ID=host-a \
  "$B/baton-prefill" "${W[@]}" --name pf 2>"$tmp/pf.log" &
PIDS+=($!)
BATON_ROUTER=tcp://127.0.0.1:1 \
  "$B/baton-decode" "${W[@]}" --router "$CONTROL" --host-id host-b \
  --name dc-b 2>"$tmp/dc-b.log" &
PIDS+=($!)
wait $WAIT; rc=$?
cat "$tmp/wait.out"
[ $rc = 0 ] || fail "--wait-workers 1,1: exit $rc ($(cat "$tmp/wait.err"))"
grep -q '^  pf  *prefill .* host-a$' "$tmp/wait.out" &&
  grep -q '^  dc-b  *decode .* host-b$' "$tmp/wait.out" ||
  fail "status table lacks the workers or their host ids"
echo "ok --wait-workers 1,1 waited for the cluster; BATON_ROUTER read," \
  "--router wins over it"
grep -q '^  pf -> dc-b: ucx$' "$tmp/wait.out" ||
  fail "host-a -> host-b should be ucx (other hosts)"

# 3. a decode worker on prefill's "host", 4. an aggregated one
"$B/baton-decode" "${W[@]}" --router "$CONTROL" --host-id host-a \
  --name dc-a 2>"$tmp/dc-a.log" &
PIDS+=($!)
"$B/baton-decode" "${W[@]}" --router "$CONTROL" --role both \
  --name dc-both 2>"$tmp/dc-both.log" &
PIDS+=($!)
BATON_ROUTER=$CLIENT timeout 40 "$B/baton" status --wait-workers 2,3 \
  --timeout 30 >"$tmp/status.out" 2>&1 ||
  fail "--wait-workers 2,3 (BATON_ROUTER): $(cat "$tmp/status.out")"
cat "$tmp/status.out"
grep -q '^  pf -> dc-b: ucx$' "$tmp/status.out" &&
  grep -q '^  pf -> dc-a: ucx-shm$' "$tmp/status.out" ||
  fail "transports: want pf -> dc-b ucx, pf -> dc-a ucx-shm"
grep -q '^  dc-both  *both ' "$tmp/status.out" ||
  fail "dc-both is not listed as role both"
echo "ok --host-id: other ids -> ucx, equal ids -> ucx-shm; --role both" \
  "counts as prefill-capable"

timeout 20 "$B/baton" status --router "$CLIENT" --json >"$tmp/status.json" ||
  fail "--json"
/usr/bin/python3 - "$tmp/status.json" <<'EOF' || fail "--json content"
import json, sys
s = json.load(open(sys.argv[1]))
w = {x["name"]: x for x in s["workers"]}
assert "ready" not in s, "ready without --wait-workers"
assert s["prefill_capable"] == 2 and s["decode_workers"] == 3, s
assert w["pf"]["role"] == "prefill" and w["pf"]["host_id"] == "host-a", w
assert w["dc-b"]["host_id"] == "host-b" and w["dc-b"]["total_kv_blocks"] > 0
assert w["dc-both"]["role"] == "both" and w["dc-both"]["can_prefill"]
t = {(x["prefill"], x["decode"]): x["transport"] for x in s["transports"]}
assert t[("pf", "dc-b")] == "ucx" and t[("pf", "dc-a")] == "ucx-shm", t
EOF
echo "ok --json"

# the cross-host and same-host pairs both serve correct ids
PROMPT="1 403 407 261 378 436 263 350"
want=$(timeout 30 "$B/baton" run --model "$M" --prompt-ids "$PROMPT" --ids \
  --max-tokens 16 --ignore-eos 2>/dev/null)
[ -n "$want" ] || fail "baton run gave nothing"
for i in 1 2 3 4; do
  got=$(timeout 20 "$B/baton" generate --router "$CLIENT" \
    --prompt-ids "$PROMPT" --max-tokens 16 --ignore-eos --ids 2>&1)
  [ "$got" = "$want" ] || fail "generate $i: '$got', baton run '$want'"
done
echo "ok 4 completions equal baton run"

# 5b. counts not reached: exit 1 within the timeout
t0=$(ms)
timeout 20 "$B/baton" status --router "$CLIENT" --wait-workers 3,3 \
  --timeout 2 --json >"$tmp/late.json" 2>"$tmp/late.err"
rc=$?; t=$(( $(ms) - t0 ))
[ $rc = 1 ] || fail "--wait-workers 3,3: exit $rc, want 1"
[ $t -ge 1900 ] && [ $t -lt 4000 ] || fail "--timeout 2 took $t ms"
grep -q '"ready":false' "$tmp/late.json" || fail "no ready:false in --json"
grep -q '2/3 prefill-capable' "$tmp/late.err" ||
  fail "timeout message: $(cat "$tmp/late.err")"
echo "ok --wait-workers 3,3 --timeout 2: exit 1 after $t ms"
echo "PASS cluster/status_cli"
