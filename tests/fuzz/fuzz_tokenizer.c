/*
 * fuzz_tokenizer.c - libFuzzer target for worker/model/tokenizer.c.
 *
 * Each input is used twice:
 *  1. as a llama2.c tokenizer file, loaded with vocab sizes 300 (the
 *     synthetic seed tok300.seed) and 512; when it loads, a fixed text and
 *     the input itself are encoded with it, then decoded and streamed;
 *  2. as text, encoded with the aidreams tokenizer (loaded once), decoded
 *     and streamed.
 * Decoding must give strict UTF-8 and the stream must equal the decode;
 * anything else aborts, so it counts as a crash.
 *
 * Run: build-tok/fuzz/fuzz_tokenizer tests/fuzz/corpus/fuzz_tokenizer
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "model/tokenizer.h"
#include "tokenizer/tok_test_util.h"

static tok_t *g_aidreams;

static void fz_check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", what);
        abort();
    }
}

/* Encodes text, then decodes and streams the ids and compares.  With a
 * real vocabulary (`exact`) valid UTF-8 must also come back unchanged;
 * a fuzzed one may hold look-alike pieces ("<0x41>" elsewhere, no " "). */
static void fz_round(const tok_t *tok, const uint8_t *text, size_t len,
                     bool exact)
{
    size_t cap = 3 * ((size_t)tok_max_piece_len(tok) + 3) + 1;
    char *chunk, *streamed, *dec = NULL;
    tok_stream_t *st = NULL;
    size_t slen = 0, got;
    int *ids = NULL;
    int n = 0;

    if (tok_encode(tok, (const char *)text, len, true, &ids, &n) != BT_OK)
        return;
    fz_check(n >= 1 && ids[0] == tok_bos_id(tok), "BOS missing");
    for (int i = 0; i < n; i++)
        fz_check(ids[i] >= 0 && ids[i] < tok_vocab_size(tok), "id range");
    fz_check(tok_decode(tok, -1, ids, n, &dec) == BT_OK, "decode failed");
    fz_check(tt_utf8_valid(dec, strlen(dec)), "decode not UTF-8");
    /* Valid UTF-8 without NUL comes back unchanged. */
    if (exact && tt_utf8_valid((const char *)text, len))
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
    static const int vocab_sizes[] = {300, 512};
    static const char fixed[] = "The river of probability \xe4\xb8\xad\x80!";

    if (g_aidreams == NULL &&
        tok_load_llama2c(BT_SHARED_DIR "/models/aidreams-tok512.bin", 512,
                         &g_aidreams) != BT_OK)
        abort();

    for (size_t v = 0; v < sizeof(vocab_sizes) / sizeof(vocab_sizes[0]);
         v++) {
        tok_t *tok = NULL;
        if (tok_load_llama2c_mem(data, size, vocab_sizes[v], &tok) != BT_OK)
            continue;
        fz_round(tok, (const uint8_t *)fixed, sizeof(fixed) - 1, false);
        fz_round(tok, data, size < 4096 ? size : 4096, false);
        tok_destroy(&tok);
    }
    fz_round(g_aidreams, data, size, true);
    return 0;
}
