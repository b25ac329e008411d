#!/usr/bin/env bash
# test_serve_floor.sh - tests/gpu/serve_floor.py, the serving floor that
# serve_bench.py's rows read against (no GPU: it computes from the model's
# shape).  Its prefill floor is bench_cuda.c's, computed there in C and
# printed on the H200 (docs/PERFORMANCE.md: 9.14 / 37.58 / 167.02 ms for
# 512 / 2048 / 8192 tokens of synth:llama3-8b in bf16, 21.87 for 2053 in
# fp8): the two must agree.  Then the floors of the serving table's rows,
# and a bad run refused with exit 2.
# Env: BATON_BIN (dir holding baton), BT_SOURCE_DIR.
set -u
FLOOR="${BT_SOURCE_DIR:?BT_SOURCE_DIR not set}/tests/gpu/serve_floor.py"
T=$(mktemp -d /tmp/bt_serve_floor.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() {  # run RC ARGS...: serve_floor.py ARGS, output in $T/out
    local want=$1; shift
    timeout -k 5 60 python3 "$FLOOR" --bin "${BATON_BIN:?}" "$@" \
        >"$T/out" 2>&1
    local rc=$?
    [ "$rc" = "$want" ] || { fail "exit $rc (want $want): $*"; cat "$T/out"; }
}
has() { grep -qF -- "$1" "$T/out" || { fail "output lacks '$1'"; cat "$T/out"; }; }

run 0 512x512@256 2048x128@256 8192x16 2048x2048@224
has "| 512/512 | 256 | 9.14 |"; has "| 8192/16 | 256 | 167.02 |"
has "| 2048/128 | 256 | 37.58 | 80.5 | 2,677 |"
has "| 512/512 | 256 | 9.14 | 41.4 | 16,912 |"
has "| 2048/2048 | 224 | 37.58 | 108.5 | 7,888 |"
run 0 --precision fp8 --kv-dtype fp8 2053x128 2048x2048@256
has "| 2053/128 | 256 | 21.87 |"; has "| 2048/2048 | 256 | 21.81 | 56.0 | 15,000 |"
# a few rows a step: the weight read, not the FLOPs, sets a row's GEMM
run 0 2048x128@1 2048x128@256
r1=$(grep -F "| 2048/128 | 1 |" "$T/out" | cut -d'|' -f5)
r256=$(grep -F "| 2048/128 | 256 |" "$T/out" | cut -d'|' -f5)
awk -v a="$r1" -v b="$r256" 'BEGIN { exit !(a > 40 * b) }' ||
    fail "a 1-row step's row ($r1 us) should carry the whole weight read (256 rows: $r256)"
run 2 20x;       has "want PROMPTxOUTPUT"
run 2 2048x0@8;  has "want PROMPTxOUTPUT"
run 2 --precision fp4 2048x128

[ "$fails" = 0 ] && echo "PASS test_serve_floor" || echo "FAIL test_serve_floor: $fails"
[ "$fails" = 0 ]
