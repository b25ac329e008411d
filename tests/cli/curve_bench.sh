#!/usr/bin/env bash
# curve_bench.sh - the cost of CURVE (docs/SECURITY.md "The cost of
# CURVE"): router requests/s and TTFT at 64 in flight, null model, one
# prefill and one decode worker on loopback (`baton up`), CURVE on and off
# in alternation, REPS times each.  Not a CTest test (a measurement).
#
#   tests/cli/curve_bench.sh [BIN_DIR]     (N=30000 REPS=4 by default)
# The router runs two ZeroMQ I/O threads with CURVE, one without.
set -u
B=${1:-${BATON_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/bin}}
N=${N:-30000}
REPS=${REPS:-4}
port=$((20000 + RANDOM % 12000))
echo "cores: $(nproc); $N requests per run, 64 in flight, prompt 32, output 8"
for rep in $(seq 1 "$REPS"); do
  for mode in plain curve; do
    d=$(mktemp -d)
    extra=(); [ $mode = plain ] && extra=(--no-curve)
    "$B/baton" up --null-model --prefill 1 --decode 1 --port "$port" \
      --log-dir "$d" "${extra[@]}" >"$d/up.out" 2>&1 &
    up=$!
    for _ in $(seq 1 100); do
      grep -q '^kv transports' "$d/up.out" && break; sleep 0.1
    done
    ( [ $mode = curve ] && . "$d/keys/client.env"
      printf '%-5s %s\n' $mode "$("$B/baton" bench --router "tcp://127.0.0.1:$port" \
        --requests "$N" --concurrency 64 --warmup 500 --prompt-len 32 \
        --output-len 8 --no-progress 2>&1 | grep -E '^(requests|ttft_ms)' |
        sed -E 's/ tok_s.*//; s/requests:[0-9]+ ok:[0-9]+ errors:[0-9]+ //' |
        tr '\n' ' ')" )
    kill -INT $up; wait $up 2>/dev/null
    rm -rf "$d"
  done
done
