#!/usr/bin/env bash
# test_hftok_cli.sh - `baton tokenize` / `baton detokenize` end to end:
# ids and pieces, the per-line mode, round trips through both tokenizer
# kinds (llama2.c .bin, tokenizer.json from the fuzz seed corpus), exit
# codes (0 ok, 1 runtime error, 2 usage).
# Env: BATON_BIN, BT_SHARED_DIR, BT_SOURCE_DIR.
set -u
BATON="${BATON_BIN:?BATON_BIN not set}/baton"
MODELS="${BT_SHARED_DIR:?BT_SHARED_DIR not set}/models"
SEEDS="${BT_SOURCE_DIR:?BT_SOURCE_DIR not set}/tests/fuzz/corpus/fuzz_tokenizer_json"
L2="$MODELS/llama2-tokenizer.bin"
BL="$SEEDS/bytelevel.json"
T=$(mktemp -d /tmp/bt_hftok_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
export BT_LOG=fatal
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() {
    local want=$1; shift
    timeout 60 "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    [ "$rc" = "$want" ] || { fail "exit $rc (want $want): $*"; cat "$T/out" "$T/err"; }
}
same() { [ "$(cat "$T/out")" = "$1" ] || { fail "got '$(cat "$T/out")', want '$1'"; }; }

# llama2.c vocabulary: BOS by default, --no-bos, pieces
expect 0 "$BATON" tokenize --tokenizer "$L2" --text "Hello world"
same "1 15043 3186"
expect 0 "$BATON" tokenize --tokenizer "$L2" --text "Hello world" --no-bos
same "15043 3186"
expect 0 "$BATON" tokenize --tokenizer "$L2" --text "Hello" --pieces --no-bos
same "$(printf '15043\t Hello')"
expect 0 "$BATON" detokenize --tokenizer "$L2" --ids "1 15043 3186"
same "Hello world"

# tokenizer.json (byte-level): BOS from its post-processor, added tokens
expect 0 "$BATON" tokenize --tokenizer "$BL" --text "the<|eot_id|>"
same "1000 116 257 1001"
expect 0 "$BATON" detokenize --tokenizer "$BL" --ids "1000,116,257,1001"
same "<|begin_of_text|>the<|eot_id|>"
expect 0 "$BATON" detokenize --tokenizer "$BL" --ids "1000 116 257 1001" --skip-special
same "the"

# --lines: one id list per input line; every line round-trips
printf 'the king\n\nnaïve café 中文 😀\n  spaces  \nlast' > "$T/in.txt"
expect 0 "$BATON" tokenize --tokenizer "$BL" --file "$T/in.txt" --lines --no-bos
cp "$T/out" "$T/ids.txt"
[ "$(wc -l < "$T/ids.txt")" = 5 ] || fail "--lines printed $(wc -l < "$T/ids.txt") lines, want 5"
i=0
while IFS= read -r line; do
    i=$((i + 1))
    ids=$(sed -n "${i}p" "$T/ids.txt")
    if [ -z "$ids" ]; then
        [ -z "$line" ] || fail "line $i: no ids for '$line'"
        continue
    fi
    expect 0 "$BATON" detokenize --tokenizer "$BL" --ids "$ids"
    same "$line"
done < <(cat "$T/in.txt"; echo)

# --time reports throughput
expect 0 "$BATON" tokenize --tokenizer "$L2" --file "$T/in.txt" --time --repeat 3
grep -q "MB/s:" "$T/err" || fail "--time printed no MB/s"

# usage and runtime errors
expect 2 "$BATON" tokenize --text x
expect 2 "$BATON" tokenize --tokenizer "$L2"
expect 2 "$BATON" tokenize --tokenizer "$L2" --text x --file y
expect 2 "$BATON" detokenize --tokenizer "$L2"
expect 2 "$BATON" detokenize --tokenizer "$L2" --ids "1 x"
expect 1 "$BATON" detokenize --tokenizer "$L2" --ids "99999"
expect 1 "$BATON" tokenize --tokenizer "$T/missing.json" --text x
echo '{"model": {"vocab": {"a": 0}, "merges": ["a b"]}}' > "$T/bad.json"
expect 1 "$BATON" tokenize --tokenizer "$T/bad.json" --text x
grep -q "not in the vocab" "$T/err" || fail "bad.json: no clear message"
expect 0 "$BATON" tokenize --help

if [ "$fails" -ne 0 ]; then
    echo "test_hftok_cli: $fails failure(s)"
    exit 1
fi
echo "PASS test_hftok_cli"
