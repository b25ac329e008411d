#!/usr/bin/env bash
# test_model_cli.sh - `baton model inspect|synth|convert` end to end through
# the real binary: outputs, exit codes (0 ok, 1 runtime error, 2 usage),
# and byte-exact conversions against the shared -hf directories.
# Env: BATON_BIN (dir holding baton), BT_SHARED_DIR.
set -u
BATON="${BATON_BIN:?BATON_BIN not set}/baton"
MODELS="${BT_SHARED_DIR:?BT_SHARED_DIR not set}/models"
if [ ! -x "$BATON" ]; then
    echo "FAIL: $BATON does not exist (it is built by the normal build)"
    exit 1
fi
T=$(mktemp -d /tmp/bt_model_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
export BT_LOG=fatal  # errors are asserted from the CLI's own message
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect RC CMD... : runs CMD, output in $T/out, checks the exit code
expect() {
    local want=$1; shift
    timeout 120 "$@" >"$T/out" 2>&1
    local rc=$?
    [ "$rc" = "$want" ] || { fail "exit $rc (want $want): $*"; cat "$T/out"; }
}
has() { grep -q -- "$1" "$T/out" || { fail "output lacks '$1'"; cat "$T/out"; }; }

# --- help and usage errors
expect 0 "$BATON" model --help;            has "inspect PATH"
expect 0 "$BATON" model inspect --help;    has "usage: baton model inspect"
expect 0 "$BATON" model synth --help;      has "llama3-8b"
expect 0 "$BATON" model convert --help;    has "--to hf|llama2c"
expect 2 "$BATON" model
expect 2 "$BATON" model frobnicate
expect 2 "$BATON" model inspect
expect 2 "$BATON" model inspect a b
expect 2 "$BATON" model synth --shape tiny
expect 2 "$BATON" model synth --shape tiny --config x --out "$T/x"
expect 2 "$BATON" model synth --shape tiny --out "$T/x" --dtype f8
expect 2 "$BATON" model synth --shape tiny --out "$T/x" --seed -3
expect 2 "$BATON" model synth --shape tiny --out
expect 2 "$BATON" model convert --in x
expect 2 "$BATON" model convert --in x --out y --to gguf
expect 2 "$BATON" model convert --in "$MODELS/aidreams260K-hf" --out "$T/x.bin" --to llama2c --dtype bf16

# --- runtime errors name the problem
expect 1 "$BATON" model inspect "$T/missing.bin";  has "missing.bin"
head -c 1000 "$MODELS/aidreams260K.bin" > "$T/cut.bin"
expect 1 "$BATON" model inspect "$T/cut.bin";      has "token_embedding truncated"
expect 1 "$BATON" model synth --shape nope --out "$T/x"; has 'unknown synth shape "nope"'
expect 1 "$BATON" model convert --in synth:tiny-qwen2 --out "$T/q.bin" --to llama2c
has "bias"

# --- inspect
expect 0 "$BATON" model inspect "$MODELS/stories260K.bin"
has "format         llama2c"; has "n_kv_heads                 4"
has "quantization   none"
has "rope_layout                adjacent"; has "params         "
has "model.layers.4.mlp.up_proj.weight"
expect 0 "$BATON" model inspect "$MODELS/aidreams260K-hf"
has "architecture   LlamaForCausalLM"; has "rope_layout                half"
has "eos_ids                    2"
expect 0 "$BATON" model inspect synth:tiny-qwen2:5
has "format         synth"; has "q_proj.bias"; has "qkv_bias                   true"
# what a quantized checkpoint declared: FP8 weights, or the KV scales alone
expect 0 "$BATON" model quantize --fp8 --out "$T/q8" "$MODELS/aidreams260K-hf"
expect 0 "$BATON" model inspect "$T/q8"
has "quantization   compressed-tensors fp8 e4m3: weight scales per channel, dynamic per-token activation scales"
expect 0 "$BATON" model quantize --fp8 --kv-only --calib \
    "$BT_SHARED_DIR/docs/STYLE.md" --calib-tokens 512 --tokenizer \
    "$MODELS/aidreams-tok512.bin" --out "$T/kv8" "$MODELS/aidreams260K-hf"
expect 0 "$BATON" model inspect "$T/kv8"
has "quantization   compressed-tensors: weights as stored, fp8 KV scales"
has "layers.0.self_attn.q_proj.weight  *BF16"
# shapes only: a 70B synth is never generated (140 GB of host memory;
# tests/gpu/serve_floor.py reads 8B shapes this way), so it answers at once
start=$(date +%s)
expect 0 timeout 10 "$BATON" model inspect synth:llama3-70b
has "params         70553706496"; has "n_layers                   80"
[ $(($(date +%s) - start)) -le 5 ] || fail "inspect of synth:llama3-70b took over 5 s"

# --- synth: shapes, dtypes, seeds, --config reproduces --shape
expect 0 "$BATON" model synth --shape tiny --out "$T/tiny"
for f in config.json generation_config.json model.safetensors; do
    [ -s "$T/tiny/$f" ] || fail "synth wrote no $f"
done
expect 0 "$BATON" model inspect "$T/tiny"; has "F32"; has "lm_head.weight"
expect 0 "$BATON" model synth --config "$T/tiny/config.json" --out "$T/tiny2"
cmp -s "$T/tiny/model.safetensors" "$T/tiny2/model.safetensors" ||
    fail "synth --config differs from synth --shape with the same seed"
expect 0 "$BATON" model synth --shape tiny --out "$T/tiny3" --seed 9 --dtype bf16
expect 0 "$BATON" model inspect "$T/tiny3"; has "BF16"
expect 0 "$BATON" model synth --shape=tiny-gqa --out="$T/gqa" --dtype=f16
expect 0 "$BATON" model inspect "$T/gqa"; has "F16"

# --- convert: .bin -> HF is byte-identical to the shared -hf safetensors
for m in aidreams260K stories260K; do
    expect 0 "$BATON" model convert --in "$MODELS/$m.bin" --out "$T/$m-hf"
    cmp -s "$T/$m-hf/model.safetensors" "$MODELS/$m-hf/model.safetensors" ||
        fail "$m: converted safetensors differ from the shared -hf"
    # HF -> .bin: header and weights identical (the legacy RoPE tables at
    # the end are regenerated, within float rounding)
    expect 0 "$BATON" model convert --in "$T/$m-hf" --out "$T/$m.bin"
    [ "$(stat -c %s "$T/$m.bin")" = "$(stat -c %s "$MODELS/$m.bin")" ] ||
        fail "$m: round-trip .bin size differs"
    # shared HF -> .bin -> HF round-trips byte for byte
    expect 0 "$BATON" model convert --in "$MODELS/$m-hf" --out "$T/$m-2.bin" --to llama2c
    expect 0 "$BATON" model convert --in "$T/$m-2.bin" --out "$T/$m-hf2" --to hf
    cmp -s "$T/$m-hf2/model.safetensors" "$MODELS/$m-hf/model.safetensors" ||
        fail "$m: HF -> llama2c -> HF is not byte-exact"
done
# weights region of aidreams (28 + 4 * 230976 bytes) is byte-identical
cmp -s -n 923932 "$T/aidreams260K.bin" "$MODELS/aidreams260K.bin" ||
    fail "aidreams: round-trip .bin weights differ"
# dtype conversion
expect 0 "$BATON" model convert --in "$MODELS/aidreams260K.bin" --out "$T/bf" --dtype bf16
expect 0 "$BATON" model inspect "$T/bf"; has "BF16"

if [ "$fails" -ne 0 ]; then
    echo "FAIL: $fails check(s) failed"
    exit 1
fi
echo "PASS cli/test_model_cli"
