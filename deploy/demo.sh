#!/usr/bin/env bash
# demo.sh - `make demo`: a local baton cluster on the aidreams model
# (router + 1 prefill + 1 decode on 127.0.0.1), a few streamed
# completions through `baton generate`, then a clean shutdown.
# Usage: bash deploy/demo.sh BIN_DIR MODELS_DIR
set -euo pipefail
BIN=${1:?usage: demo.sh BIN_DIR MODELS_DIR}
MODELS=${2:?usage: demo.sh BIN_DIR MODELS_DIR}
PORT=${BATON_DEMO_PORT:-$((20000 + RANDOM % 20000))}
LOGS=$(mktemp -d)

"$BIN/baton" up --model "$MODELS/aidreams260K.bin" \
  --tokenizer "$MODELS/aidreams-tok512.bin" --prefill 1 --decode 1 \
  --port "$PORT" --log-dir "$LOGS" &
UP=$!
trap 'kill -TERM $UP 2>/dev/null || true; wait $UP 2>/dev/null || true; rm -rf "$LOGS"' EXIT
sleep 1.5
# baton up made CURVE keys for this cluster; the client's are in
# keys/client.env (docs/SECURITY.md).
. "$LOGS/keys/client.env"

for prompt in "The river" "Echoes of" "In the quiet"; do
  echo "== $prompt"
  printf '%s' "$prompt"
  timeout 30 "$BIN/baton" generate --router "tcp://127.0.0.1:$PORT" \
    --prompt "$prompt" --max-tokens 60 --stats
done

echo "== stopping the cluster"
kill -TERM $UP
wait $UP
trap 'rm -rf "$LOGS"' EXIT
echo "== done"
