#!/usr/bin/env bash
# `baton bench-engine --spec-accept-rate`: the speculative benchmark mode
# runs on the cpu backend (synth:tiny), prints a plain row and one row per
# tree size for each batch size, and with forced rate 1 on chain trees
# (top-k 1) the accepted length is exactly tokens + 1; bad values exit 2;
# --spec-warmup sets the unmeasured steps.
set -u
B="$BATON_BIN/baton"
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

timeout 60 "$B" bench-engine --model synth:tiny --device cpu --threads 1 \
    --batch 1,3 --ctx 16 --steps 6 --spec-accept-rate 1 \
    --spec-tokens 2,4 --spec-topk 1 >"$tmp/out" 2>"$tmp/err" \
    || { fail "bench-engine spec mode"; cat "$tmp/err"; }
for b in 1 3; do
  grep -qE "^ +$b +plain " "$tmp/out" || fail "batch $b: no plain row"
  grep -qE "^ +$b +2 +3\.00 " "$tmp/out" || fail "batch $b tree 2: acc.len != 3"
  grep -qE "^ +$b +4 +5\.00 " "$tmp/out" || fail "batch $b tree 4: acc.len != 5"
done
timeout 60 "$B" bench-engine --model synth:tiny --device cpu --threads 1 \
    --batch 2 --ctx 16 --steps 6 --spec-accept-rate 0 --spec-tokens 3 \
    >"$tmp/out0" 2>&1 || fail "rate 0"
grep -qE "^ +2 +3 +1\.00 " "$tmp/out0" || fail "rate 0: acc.len != 1"
"$B" bench-engine --model synth:tiny --spec-accept-rate 1.5 >/dev/null 2>&1
[ $? -eq 2 ] || fail "rate 1.5 accepted"
"$B" bench-engine --model synth:tiny --spec-accept-rate 0.5 \
    --spec-tokens 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "tree size 0 accepted"
"$B" bench-engine --model synth:tiny --spec-accept-rate 0.5 \
    --spec-warmup 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "warm-up 0 accepted"
timeout 60 "$B" bench-engine --model synth:tiny --device cpu --threads 1 \
    --batch 2 --ctx 16 --steps 4 --spec-accept-rate 1 --spec-tokens 2 \
    --spec-topk 1 --spec-warmup 2 >"$tmp/outw" 2>&1 || fail "warm-up 2"
grep -qE "^ +2 +2 +3\.00 " "$tmp/outw" || fail "warm-up 2: acc.len != 3"
[ $fails -eq 0 ] && echo "PASS spec bench" || { cat "$tmp/out"; echo "$fails failures"; exit 1; }
