#!/usr/bin/env bash
# `baton eagle train` writes a head that `baton run --spec-head` loads;
# greedy output with speculation equals plain output (text and ids, both
# models, fixed and adaptive trees), accept-length is printed on stderr,
# and bad input exits non-zero with a message.
set -u
B="$BATON_BIN/baton"
M="$BT_SHARED_DIR/models"
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

for model in aidreams260K stories260K; do
  timeout 120 "$B" eagle train --target "$M/$model.bin" \
      --out "$tmp/$model.safetensors" --tokens 2048 --epochs 1 --threads 1 \
      2>"$tmp/train.err" || { fail "train $model"; cat "$tmp/train.err"; }
  grep -q "last_loss:" "$tmp/train.err" || fail "train $model: no summary"
  P="--prompt-ids 1,300,301 --ids --max-tokens 60 --ignore-eos"
  timeout 60 "$B" run --model "$M/$model.bin" $P >"$tmp/plain" 2>/dev/null \
      || fail "plain run $model"
  for spec in "--spec-fixed" "" "--spec-fixed --spec-topk 1 --spec-depth 3 --spec-tokens 3"; do
    timeout 60 "$B" run --model "$M/$model.bin" $P \
        --spec-head "$tmp/$model.safetensors" $spec >"$tmp/spec" \
        2>"$tmp/spec.err" || { fail "spec run $model $spec"; cat "$tmp/spec.err"; }
    cmp -s "$tmp/plain" "$tmp/spec" || fail "$model $spec: output differs"
    grep -q "^accept-length: [0-9.]*$" "$tmp/spec.err" \
        || fail "$model $spec: no accept-length line"
  done
done

# text mode, aidreams with its tokenizer
T="--model $M/aidreams260K.bin --tokenizer $M/aidreams-tok512.bin"
timeout 60 "$B" run $T --prompt "The river" >"$tmp/plain" 2>/dev/null
timeout 60 "$B" run $T --prompt "The river" \
    --spec-head "$tmp/aidreams260K.safetensors" >"$tmp/spec" 2>/dev/null
cmp -s "$tmp/plain" "$tmp/spec" || fail "text output differs"

# bad input
"$B" eagle >/dev/null 2>&1; [ $? -eq 2 ] || fail "eagle without action"
"$B" eagle train --out "$tmp/x" >/dev/null 2>&1; [ $? -eq 2 ] \
    || fail "train without --target"
"$B" eagle frobnicate --target x >/dev/null 2>&1; [ $? -eq 2 ] \
    || fail "unknown action"
"$B" run $T --prompt "a" --spec-head "$tmp/none.safetensors" \
    >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "none.safetensors" "$tmp/err" || fail "missing head"
echo "garbage" >"$tmp/bad.safetensors"
"$B" run $T --prompt "a" --spec-head "$tmp/bad.safetensors" \
    >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "corrupt head -> $rc"
# a stories head does not fit... it does (same dims); a wrong-shape head:
"$B" run --model "synth:tiny" --prompt-ids 1,2 --max-tokens 4 \
    --spec-head "$tmp/aidreams260K.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -qi "tensor\|fit" "$tmp/err" || { fail "wrong-shape head -> $rc"; cat "$tmp/err"; }
"$B" run $T --prompt "a" --spec-head "$tmp/aidreams260K.safetensors" \
    --spec-depth 0 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "depth" "$tmp/err" || fail "bad --spec-depth -> $rc"

[ $fails -eq 0 ] && echo "PASS spec cli" || { echo "$fails failures"; exit 1; }
