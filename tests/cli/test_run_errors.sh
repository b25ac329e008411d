#!/usr/bin/env bash
# Bad input to `baton run`: each case must exit non-zero with a clear
# message on stderr, and never crash (exit codes >= 128 are signals).
set -u
B="$BATON_BIN/baton"
M="$BT_SHARED_DIR/models"
fails=0; n=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# expect EXIT_CLASS PATTERN -- ARGS...: EXIT_CLASS is "usage" (2) or
# "error" (1); PATTERN must appear in stderr.
expect() {
  local want=$1 pattern=$2; shift 3
  n=$((n+1))
  "$B" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  local code=1; [ "$want" = usage ] && code=2
  if [ $rc -ne $code ] || ! grep -qi -- "$pattern" "$tmp/err"; then
    echo "FAIL: baton $* -> exit $rc (want $code), stderr:"; cat "$tmp/err"
    fails=$((fails+1))
  else
    echo "ok: baton $* -> $rc: $(grep -i -m1 -- "$pattern" "$tmp/err")"
  fi
}

A="--model $M/aidreams260K.bin"
T="--tokenizer $M/aidreams-tok512.bin"
expect usage "need --model" -- run --prompt-ids "1 2"
expect usage "exactly one" -- run $A
expect usage "needs a tokenizer" -- run $A --prompt "hi"
expect usage "needs --prompt" -- run $A --prompt-ids 1 --chat
expect error "llama3" -- run $A $T --prompt "hi" --chat-template bogus
expect error "empty prompt" -- run $A $T --prompt ""
expect usage "temperature" -- run $A --prompt-ids 1 --temperature -1
expect usage "top_p" -- run $A --prompt-ids 1 --top-p 0
expect usage "top-k" -- run $A --prompt-ids 1 --top-k x
expect usage "top_k" -- run $A --prompt-ids 1 --top-k -2
expect usage "min_p" -- run $A --prompt-ids 1 --min-p 1.5
expect usage "max-tokens" -- run $A --prompt-ids 1 --max-tokens 0
expect usage "repetition_penalty" -- run $A --prompt-ids 1 --repetition-penalty 0
expect usage "prompt-ids" -- run $A --prompt-ids "1 two 3"
expect usage "device" -- run $A --prompt-ids 1 --device tpu
expect error "vocabulary" -- run $A --prompt-ids "1 9999"
expect error "vocabulary" -- run $A --prompt-ids "1 -5"
long=$(for i in $(seq 1 200); do printf '5 '; done)
expect error "exceeds the model context" -- run $A --prompt-ids "$long"
expect error "stop id" -- run $A --prompt-ids 1 --stop-id 600
expect error "cannot open\|no such\|not found" -- run --model "$tmp/missing.bin" --prompt-ids 1
head -c 1000 "$M/aidreams260K.bin" > "$tmp/trunc.bin"
expect error "truncated\|too small\|file has" -- run --model "$tmp/trunc.bin" --prompt-ids 1
printf 'garbage' > "$tmp/garbage.bin"
expect error "." -- run --model "$tmp/garbage.bin" --prompt-ids 1
head -c 3000 "$M/aidreams-tok512.bin" > "$tmp/tok.bin"
expect error "truncated\|tokenizer" -- run $A --tokenizer "$tmp/tok.bin" --prompt hi
expect usage "unexpected argument" -- run $A --prompt-ids 1 extra
expect usage "off, auto or fixed" -- run $A --prompt-ids 1 --spec bogus
expect usage "1..256" -- run $A --prompt-ids 1 --spec-depth 0
expect error "." -- run $A --prompt-ids 1 --draft "$tmp/missing.safetensors"

# Sanity: a good run works and honours --max-tokens.
out=$("$B" run $A --prompt-ids 1 --max-tokens 5 --ids 2>"$tmp/err")
if [ "$(echo "$out" | wc -w)" -ne 5 ]; then
  echo "FAIL: expected 5 ids, got '$out'"; cat "$tmp/err"; fails=$((fails+1))
fi
# Same seed, same text; sampling works end to end.
s1=$("$B" run $A $T --prompt "The sky" --temperature 0.9 --top-p 0.9 --seed 42 --max-tokens 40)
s2=$("$B" run $A $T --prompt "The sky" --temperature 0.9 --top-p 0.9 --seed 42 --max-tokens 40)
s3=$("$B" run $A $T --prompt "The sky" --temperature 0.9 --top-p 0.9 --seed 43 --max-tokens 40)
[ "$s1" = "$s2" ] || { echo "FAIL: same seed gave different text"; fails=$((fails+1)); }
[ "$s1" != "$s3" ] || { echo "FAIL: different seeds gave the same text"; fails=$((fails+1)); }
# Stop string: output ends before the string.
full=$("$B" run $A $T --prompt "The river" --max-tokens 30)
cut=$("$B" run $A $T --prompt "The river" --max-tokens 30 --stop "tapestry")
case "$full" in *tapestry*) ;; *) echo "FAIL: expected 'tapestry' in: $full"; fails=$((fails+1));; esac
case "$cut" in *tapestry*) echo "FAIL: stop string leaked: $cut"; fails=$((fails+1));; esac
[ "${full#"$cut"}" != "$full" ] || { echo "FAIL: '$cut' is not a prefix of '$full'"; fails=$((fails+1)); }

echo "$((n+4-fails)) passed, $fails failed"
[ $fails -eq 0 ]
