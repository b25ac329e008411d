/*
 * fuzz_tokenizer_json.c - libFuzzer target for worker/model/tokenizer_json.c
 * (the tokenizer.json loader, encoder and decoder).
 *
 * Each input is used twice:
 *  1. as a tokenizer.json (and, split at the first NUL byte, the rest as
 *     tokenizer_config.json); when it loads, a fixed text and the input
 *     itself are encoded, then decoded and streamed;
 *  2. as text, encoded with two fixed tokenizers built once (byte-level
 *     with Llama 3's regex and added tokens; sentencepiece-style with byte
 *     fallback), decoded and streamed.
 * Ids must be in range, decoding must give strict UTF-8, the stream must
 * equal the decode, and with the byte-level tokenizer valid UTF-8 must come
 * back unchanged; anything else aborts, so it counts as a crash.
 *
 * Run: build-x/fuzz/fuzz_tokenizer_json tests/fuzz/corpus/fuzz_tokenizer_json
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "model/tokenizer.h"
#include "tokenizer/tok_test_util.h"

static tok_t *g_bl;
static tok_t *g_sp;

static void fz_check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_tokenizer_json: %s\n", what);
        abort();
    }
}

/* Appends the JSON string of byte-level token for byte b (GPT-2 map). */
static size_t fz_mapped(int b, char *out)
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        bool pr = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) ||
                  (x >= 174 && x <= 255);
        int c = pr ? x : 256 + n++;
        if (x == b)
            cp = c;
    }
    if (cp == '"' || cp == '\\')
        return (size_t)sprintf(out, "\\%c", cp);
    if (cp < 0x80)
        return (size_t)sprintf(out, "%c", cp);
    return (size_t)sprintf(out, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
}

static tok_t *fz_build(bool byte_level)
{
    static const char regex[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
        "\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    char *j = bt_malloc(1 << 16, "fuzz");
    size_t n = 0;
    tok_t *tok = NULL;

    n += (size_t)sprintf(j + n, "{\"model\": {\"type\": \"BPE\", %s"
                                "\"vocab\": {",
                         byte_level ? "" : "\"byte_fallback\": true, ");
    for (int b = 0; b < 256; b++) {
        j[n++] = '"';
        if (byte_level)
            n += fz_mapped(b, j + n);
        else
            n += (size_t)sprintf(j + n, "<0x%02X>", b);
        n += (size_t)sprintf(j + n, "\": %d, ", b);
    }
    if (byte_level)
        n += (size_t)sprintf(j + n, "\"\xc4\xa0t\": 256, \"he\": 257, "
                                    "\"\xc4\xa0the\": 258}, \"merges\": "
                                    "[\"\xc4\xa0 t\", \"h e\", "
                                    "\"\xc4\xa0t he\"]}, "
                                    "\"pre_tokenizer\": {\"type\": "
                                    "\"Sequence\", \"pretokenizers\": "
                                    "[{\"type\": \"Split\", \"pattern\": "
                                    "{\"Regex\": \"%s\"}, \"behavior\": "
                                    "\"Isolated\"}, {\"type\": "
                                    "\"ByteLevel\", \"add_prefix_space\": "
                                    "false, \"use_regex\": false}]}, "
                                    "\"decoder\": {\"type\": "
                                    "\"ByteLevel\"}, ",
                             regex);
    else
        n += (size_t)sprintf(j + n,
                             "\"\xe2\x96\x81\": 256, \"t\": 257, \"h\": 258, "
                             "\"e\": 259, \"\xe2\x96\x81t\": 260, "
                             "\"\xe2\x96\x81th\": 261}, \"merges\": "
                             "[[\"\xe2\x96\x81\", \"t\"], "
                             "[\"\xe2\x96\x81t\", \"h\"]]}, "
                             "\"normalizer\": {\"type\": \"Sequence\", "
                             "\"normalizers\": [{\"type\": \"Prepend\", "
                             "\"prepend\": \"\xe2\x96\x81\"}, {\"type\": "
                             "\"Replace\", \"pattern\": {\"String\": "
                             "\" \"}, \"content\": \"\xe2\x96\x81\"}]}, "
                             "\"decoder\": {\"type\": \"Sequence\", "
                             "\"decoders\": [{\"type\": \"Replace\", "
                             "\"pattern\": {\"String\": \"\xe2\x96\x81\"}, "
                             "\"content\": \" \"}, {\"type\": "
                             "\"ByteFallback\"}, {\"type\": \"Strip\", "
                             "\"content\": \" \", \"start\": 1, "
                             "\"stop\": 0}]}, ");
    n += (size_t)sprintf(j + n,
                         "\"added_tokens\": [{\"id\": 300, \"content\": "
                         "\"<|eot_id|>\", \"special\": true}, {\"id\": 301, "
                         "\"content\": \"<|eot|>\", \"special\": true}]}");
    if (tok_load_json_mem(j, n, NULL, 0, &tok) != BT_OK)
        abort();
    bt_free(j);
    return tok;
}

/* Encodes, then decodes and streams, and compares. */
static void fz_round(const tok_t *tok, const uint8_t *text, size_t len,
                     bool exact)
{
    size_t cap = 3 * ((size_t)tok_max_piece_len(tok) + 3) + 1;
    char *chunk, *streamed, *dec = NULL;
    tok_stream_t *st = NULL;
    size_t slen = 0, got;
    int *ids = NULL;
    int n = 0;

    if (tok_encode(tok, (const char *)text, len, false, &ids, &n) != BT_OK)
        return;
    for (int i = 0; i < n; i++)
        fz_check(ids[i] >= 0 && ids[i] < tok_vocab_size(tok), "id range");
    fz_check(tok_decode(tok, -1, ids, n, &dec) == BT_OK, "decode failed");
    fz_check(tt_utf8_valid(dec, strlen(dec)), "decode not UTF-8");
    if (exact && tt_utf8_valid((const char *)text, len) &&
        memchr(text, 0, len) == NULL)
        fz_check(strlen(dec) == len && memcmp(dec, text, len) == 0,
                 "round trip differs");
    if (cap < 64)
        cap = 64;
    chunk = bt_malloc(cap, "fuzz");
    streamed = bt_malloc((size_t)n * cap + cap, "fuzz");
    fz_check(tok_stream_create(tok, -1, &st) == BT_OK, "stream create");
    for (int i = 0; i <= n; i++) {
        bt_status_t status =
            i < n ? tok_stream_push(st, ids[i], chunk, cap, &got)
                  : tok_stream_flush(st, chunk, cap, &got);
        fz_check(status == BT_OK, "stream push failed");
        fz_check(tt_utf8_valid(chunk, got), "stream chunk not UTF-8");
        memcpy(streamed + slen, chunk, got);
        slen += got;
    }
    fz_check(slen == strlen(dec) && memcmp(streamed, dec, slen) == 0,
             "stream differs from decode");
    tok_stream_destroy(&st);
    bt_free(streamed);
    bt_free(chunk);
    bt_free(dec);
    bt_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char fixed[] =
        "The river's 1234 \xe4\xb8\xad\x80 \xf0\x9f\x98\x80<|eot_id|>  !";
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul != NULL ? (size_t)(nul - data) : size;
    tok_t *tok = NULL;

    if (g_bl == NULL) {
        bt_log_set_level(BT_LOG_LEVEL_FATAL); /* rejected inputs log */
        g_bl = fz_build(true);
        g_sp = fz_build(false);
    }
    if (tok_load_json_mem((const char *)data, json_len,
                          nul != NULL ? (const char *)nul + 1 : NULL,
                          nul != NULL ? size - json_len - 1 : 0,
                          &tok) == BT_OK) {
        fz_round(tok, (const uint8_t *)fixed, sizeof(fixed) - 1, false);
        fz_round(tok, data, size < 4096 ? size : 4096, false);
        tok_set_skip_special(tok, true);
        fz_round(tok, (const uint8_t *)fixed, sizeof(fixed) - 1, false);
        tok_destroy(&tok);
    }
    fz_round(g_bl, data, size, true);
    fz_round(g_sp, data, size, false);
    return 0;
}
