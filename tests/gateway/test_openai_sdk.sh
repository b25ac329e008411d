#!/usr/bin/env bash
# The official OpenAI Node SDK against baton-http (issue 39): installs the
# `openai` npm package (major pinned below) into the build dir, starts a
# local aggregated cluster (router + one aidreams260K decode worker
# running --role both + baton-http with API keys, free ports, CPU) and
# runs openai_sdk.mjs (completions, chat, streams, error classes,
# models.list).
# Skips (exit 77, CTest's skip code here: BT_TEST_SKIP_CODE) only when the
# npm registry cannot be reached; node/npm missing, or an install that
# fails while the registry answers, are failures.
set -u
B="$BATON_BIN"
M="$BT_SHARED_DIR/models"
SDK_MAJOR=4
NPM_DIR="${BT_BUILD_DIR:-$(mktemp -d)}/npm"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
for tool in node npm; do
  command -v $tool >/dev/null ||
    { echo "FAIL: $tool not installed (make deps installs nodejs)"; exit 1; }
done

installed() {
  node -e "const v=require('$NPM_DIR/node_modules/openai/package.json').version;
           process.exit(v.split('.')[0]==='$SDK_MAJOR'?0:1)" 2>/dev/null
}
if ! installed; then
  mkdir -p "$NPM_DIR"
  if ! timeout 180 npm install --prefix "$NPM_DIR" --no-audit --no-fund \
       --loglevel=error "openai@$SDK_MAJOR" >"$tmp/npm.log" 2>&1; then
    if ! timeout 20 npm ping >/dev/null 2>&1; then
      echo "SKIP: the npm registry cannot be reached (no network): openai SDK not installed"
      exit 77
    fi
    echo "FAIL: npm install openai@$SDK_MAJOR failed with the registry reachable:"
    cat "$tmp/npm.log"
    exit 1
  fi
  installed || { echo "FAIL: openai@$SDK_MAJOR not found after npm install"; exit 1; }
fi
echo "openai SDK $(node -p "require('$NPM_DIR/node_modules/openai/package.json').version") in $NPM_DIR"

. "$(dirname "$0")/../ports.sh" # free_ports
port=$(free_ports 2); hport=$(free_ports 1)
key="sdk-test-key-0123456789abcdef"
echo "$key sdk-tenant" > "$tmp/keys"
"$B/baton-router" --listen tcp://127.0.0.1:$port \
  --control tcp://127.0.0.1:$((port+1)) --heartbeat-ms 100 2>"$tmp/router.log" &
pids+=($!)
"$B/baton-decode" --router tcp://127.0.0.1:$((port+1)) \
  --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams-tok512.bin" \
  --threads 1 --name d0 --role both 2>"$tmp/decode.log" &
pids+=($!)
"$B/baton-http" --router tcp://127.0.0.1:$port --listen 127.0.0.1:$hport \
  --tokenizer "$M/aidreams-tok512.bin" --model-name aidreams \
  --api-key-file "$tmp/keys" 2>"$tmp/http.log" &
pids+=($!)
ok=
for i in $(seq 1 100); do
  code=$(python3 -c "import urllib.request,sys
try: print(urllib.request.urlopen('http://127.0.0.1:$hport/health', timeout=2).status)
except Exception as e: print(getattr(e, 'code', 0))")
  [ "$code" = 200 ] && { ok=1; break; }
  sleep 0.2
done
[ -n "$ok" ] || { echo "FAIL: baton-http /health never 200"; cat "$tmp/http.log"; exit 1; }

BATON_URL="http://127.0.0.1:$hport/v1" BATON_KEY="$key" BATON_MODEL=aidreams \
OPENAI_SDK_DIR="$NPM_DIR" timeout 150 node "$(dirname "$0")/openai_sdk.mjs"
rc=$?
if [ $rc -ne 0 ]; then
  echo "--- baton-http log"; tail -20 "$tmp/http.log"
  echo "FAIL: openai_sdk.mjs exit $rc"
  exit 1
fi
# the key never reaches the log
if grep -q "$key" "$tmp/http.log"; then echo "FAIL: the API key was logged"; exit 1; fi
echo "PASS gateway/openai_sdk"
