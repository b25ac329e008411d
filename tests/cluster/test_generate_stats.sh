#!/usr/bin/env bash
# `baton generate --stats` through a pipe (stdout fully buffered): the
# completion's line must end before the stats line, which goes to stderr
# (it used to be glued to the text).  A null-model 1+1 cluster.
set -u
B="$BATON_BIN/baton"
tmp=$(mktemp -d)
. "$(dirname "$0")/../ports.sh" # free_ports
PORT=$(free_ports 2)
"$B" up --no-curve --null-model --prefill 1 --decode 1 --port "$PORT" \
  --log-dir "$tmp" >"$tmp/up.out" 2>&1 &
UP=$!
trap 'kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null; rm -rf "$tmp"' EXIT

ok=0
for try in $(seq 1 50); do
  timeout 10 "$B" generate --router "tcp://127.0.0.1:$PORT" \
    --prompt-ids "5 6 7" --max-tokens 4 --ids --stats >"$tmp/out" 2>&1 &&
    { ok=1; break; }
  sleep 0.2
done
if [ $ok != 1 ]; then
  echo "FAIL: no answer from the cluster"; cat "$tmp/out"; exit 1
fi
cat "$tmp/out"
if ! grep -q '^prompt_tokens:3 generated:4 ' "$tmp/out"; then
  echo "FAIL: the stats line does not start a line"; exit 1
fi
if [ "$(grep -c '^[0-9]\+\( [0-9]\+\)\{3\}$' "$tmp/out")" != 1 ]; then
  echo "FAIL: the 4 ids are not on a line of their own"; exit 1
fi
echo "PASS cluster/generate_stats"
