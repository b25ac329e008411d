#!/usr/bin/env bash
# test_hf_tokenizers.sh - runs tests/gpu/test_hf_tokenizers.py (baton's
# tokenizer.json ids vs the Hugging Face `tokenizers` library on >= 10,000
# lines, plus single-core encode throughput) where the library is
# installed, e.g. the device machine:
#   /work/shared/tools/devlibs .devlibs build-hftok/bin/baton   (here)
#   tests/gpu/test_hf_tokenizers.sh build-hftok "$OUT"          (there)
# Env BT_HFTOK_ONLY=name,name runs only those variants (e.g. the NFC ones:
# bl_qwen_nfc,bl_nfkc,sp_nfc_seq).
# Args: BUILD_DIR (holding bin/baton, default build), OUT_DIR (default
# $OUT or /tmp/hftok_out).  Exit status 0 when every id matches.
set -u
BUILD=${1:-build}
DEST=${2:-${OUT:-/tmp/hftok_out}}
mkdir -p "$DEST"
if [ -d .devlibs ]; then
    export LD_LIBRARY_PATH=$PWD/.devlibs UCX_MODULE_DIR=$PWD/.devlibs/ucx
fi
python3 "$(dirname "$0")/test_hf_tokenizers.py" "$BUILD/bin/baton" "$DEST" \
    2>&1 | tee "$DEST/hftok_console.txt"
exit "${PIPESTATUS[0]}"
