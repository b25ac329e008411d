#!/usr/bin/env bash
# `baton up` and the KV transport choice on one host, CPU backend:
#   --prefill 0 --decode 2: aggregated mode (decode workers --role both),
#       every pair "local", greedy ids equal `baton run`'s;
#   1 prefill + 1 decode, --kv-transport auto: the pair uses "ucx-shm"
#       (same host, host pools);
#   --kv-transport inline: "inline", same ids.
# The transports are read from what `baton up` prints (the router's
# cluster status).
set -u
. "$(dirname "$0")/../ports.sh" # free_ports
B="$BATON_BIN/baton"
M="$BT_SHARED_DIR/models/aidreams260K.bin"
tmp=$(mktemp -d)
UP=
cleanup() {
  [ -n "$UP" ] && { kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null; }
  rm -rf "$tmp"
}
trap cleanup EXIT
PROMPT="1 403 407 261 378 436 263 350"
want=$(timeout 30 "$B" run --model "$M" --prompt-ids "$PROMPT" --ids \
  --max-tokens 24 --ignore-eos 2>/dev/null)
[ -n "$want" ] || { echo "FAIL: baton run gave nothing"; exit 1; }

# up_check NAME EXPECT_TRANSPORT UP_ARGS...
up_check() {
  local name=$1 expect=$2; shift 2
  local port got="" ok=0
  port=$(free_ports 2)
  "$B" up --no-curve --model "$M" --port "$port" --log-dir "$tmp" "$@" \
    >"$tmp/$name.out" 2>&1 &
  UP=$!
  for try in $(seq 1 100); do
    grep -q '^kv transports' "$tmp/$name.out" && break
    sleep 0.1
  done
  cat "$tmp/$name.out"
  if ! grep -q "^kv transports" "$tmp/$name.out"; then
    echo "FAIL $name: no status from baton up"; exit 1
  fi
  if [ "$(grep -c ' -> .*: ' "$tmp/$name.out")" = 0 ] ||
     grep ' -> .*: ' "$tmp/$name.out" | grep -vq ": $expect\$"; then
    echo "FAIL $name: pairs should all use $expect"; exit 1
  fi
  for try in $(seq 1 50); do
    got=$(timeout 10 "$B" generate --router "tcp://127.0.0.1:$port" \
      --prompt-ids "$PROMPT" --max-tokens 24 --ignore-eos --ids \
      2>/dev/null) && [ -n "$got" ] && { ok=1; break; }
    sleep 0.2
  done
  if [ $ok != 1 ] || [ "$got" != "$want" ]; then
    echo "FAIL $name: ids '$got', baton run gave '$want'"; exit 1
  fi
  kill -TERM $UP; wait $UP; UP=
  echo "ok $name: $expect, ids equal baton run"
}

up_check aggregated local --prefill 0 --decode 2
up_check auto ucx-shm --prefill 1 --decode 1
up_check inline inline --prefill 1 --decode 1 --kv-transport inline
echo "PASS cluster/up_transport"
