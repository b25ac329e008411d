/*
 * test_hftok.c - hand-made tokenizer.json files, each covering features of
 * worker/model/tokenizer_json.c with ids worked out by hand:
 *  - byte-level BPE (Llama 3 style): the Split regex on letters/digits,
 *    contractions (case-insensitive), whitespace runs, emoji, CJK,
 *    invalid UTF-8; merges in the "a b" form; added tokens inside text
 *    (never split); BOS from the post-processor; ignore_merges;
 *  - sentencepiece-style BPE (Mistral style): Prepend/Replace normalizer,
 *    byte fallback, merges in the pair form, Strip decoder, the older
 *    Metaspace pre-tokenizer with prepend_scheme "first";
 *  - tokenizer_config.json / generation_config.json from a directory;
 *  - round trips and streaming on a mixed-script corpus;
 *  - malformed files refused with a clear message;
 *  - chat templates.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "hftok_fixture.h"
#include "tokenizer/tok_test_util.h"

// ----------------------------------------------------------------------------
// helpers

/* hftok_fixture.h's added token, never normalized. */
static cJSON *added_tok(int id, const char *content, bool special)
{
    return hf_added_tok(id, content, special, false);
}

/* Byte-level tokenizer: ids 0..255 are the bytes, then each merge (byte
 * strings "a|b", written to the file as "A B" in mapped form) adds the
 * token a+b with the next id; added tokens follow.
 * Returns the JSON text (free with free). */
static char *make_bytelevel(const char *const *merges, int n_merges,
                            bool ignore_merges, const char *extra_piece)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *post, *single, *e, *sp;
    char a[64], b[64], ab[1024], ma[256], mb[256], mab[512];
    int id = 256;
    char *text;

    hf_add_byte_vocab(vocab);
    for (int i = 0; i < n_merges; i++) {
        const char *s = strchr(merges[i], '|');
        snprintf(a, sizeof(a), "%.*s", (int)(s - merges[i]), merges[i]);
        snprintf(b, sizeof(b), "%s", s + 1);
        snprintf(ab, sizeof(ab), "%s%s", a, b);
        hf_map_str(a, ma);
        hf_map_str(b, mb);
        hf_map_str(ab, mab);
        if (cJSON_GetObjectItemCaseSensitive(vocab, mab) == NULL)
            cJSON_AddNumberToObject(vocab, mab, id++);
        snprintf(ab, sizeof(ab), "%s %s", ma, mb);
        cJSON_AddItemToArray(ml, cJSON_CreateString(ab));
    }
    if (extra_piece != NULL) { /* in the vocab, no merges lead to it */
        hf_map_str(extra_piece, mab);
        cJSON_AddNumberToObject(vocab, mab, id++);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON_AddItemToArray(added, added_tok(1000, "<|begin_of_text|>", true));
    cJSON_AddItemToArray(added, added_tok(1001, "<|eot_id|>", true));
    cJSON_AddItemToArray(added, added_tok(1002, "<|eot|>", true));
    cJSON_AddNullToObject(root, "normalizer");
    hf_add_llama3_pre(root);
    post = cJSON_AddObjectToObject(root, "post_processor");
    cJSON_AddStringToObject(post, "type", "TemplateProcessing");
    single = cJSON_AddArrayToObject(post, "single");
    e = cJSON_CreateObject();
    sp = cJSON_AddObjectToObject(e, "SpecialToken");
    cJSON_AddStringToObject(sp, "id", "<|begin_of_text|>");
    cJSON_AddItemToArray(single, e);
    e = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "Sequence"), "id",
                            "A");
    cJSON_AddItemToArray(single, e);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type",
                            "ByteLevel");
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static tok_t *load_json(const char *json, const char *config)
{
    tok_t *tok = NULL;
    bt_status_t status = tok_load_json_mem(json, strlen(json), config,
                                           config ? strlen(config) : 0, &tok);
    if (status != BT_OK)
        BT_TEST_FAIL("load: %s", bt_error_last());
    return tok;
}

/* Encodes text (len bytes) and compares with the expected ids. */
static void expect_ids(const tok_t *tok, const char *text, size_t len,
                       bool bos, const int *want, int n_want)
{
    int *ids = NULL;
    int n = 0;
    BT_ASSERT_OK(tok_encode(tok, text, len, bos, &ids, &n));
    if (n != n_want || memcmp(ids, want, sizeof(int) * (size_t)n) != 0) {
        fprintf(stderr, "text \"%s\": got", text);
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (int i = 0; i < n_want; i++)
            fprintf(stderr, " %d", want[i]);
        BT_TEST_FAIL("ids differ");
    }
    bt_free(ids);
}

#define EXPECT(_tok, _text, _bos, ...)                                      \
    do {                                                                    \
        static const int _want[] = {__VA_ARGS__};                           \
        expect_ids(_tok, _text, sizeof(_text) - 1, _bos, _want,             \
                   (int)(sizeof(_want) / sizeof(_want[0])));                \
    } while (0)

/* decode == streaming; returns the decoded text (bt_free). */
static char *decode_both(const tok_t *tok, const int *ids, int n)
{
    size_t cap = 3 * ((size_t)tok_max_piece_len(tok) + 3) + 1, got, sl = 0;
    char *chunk, *streamed, *dec = NULL;
    tok_stream_t *st = NULL;

    if (cap < 64)
        cap = 64;
    chunk = bt_malloc(cap, "test");
    streamed = bt_malloc(((size_t)n + 1) * cap, "test");
    BT_ASSERT_OK(tok_decode(tok, -1, ids, n, &dec));
    BT_CHECK(tt_utf8_valid(dec, strlen(dec)));
    BT_ASSERT_OK(tok_stream_create(tok, -1, &st));
    for (int i = 0; i <= n; i++) {
        if (i < n)
            BT_ASSERT_OK(tok_stream_push(st, ids[i], chunk, cap, &got));
        else
            BT_ASSERT_OK(tok_stream_flush(st, chunk, cap, &got));
        BT_CHECK(tt_utf8_valid(chunk, got)); /* never half a character */
        memcpy(streamed + sl, chunk, got);
        sl += got;
    }
    streamed[sl] = '\0';
    BT_ASSERT_STREQ(streamed, dec);
    tok_stream_destroy(&st);
    bt_free(streamed);
    bt_free(chunk);
    return dec;
}

/* The text of ids streamed with the per-stream special-token switch (a
 * request's skip_special_tokens), bt_malloc'ed. */
static char *stream_skip(const tok_t *tok, const int *ids, int n, bool skip)
{
    char chunk[256], *text = bt_calloc(1, (size_t)n * 256 + 8, "test");
    tok_stream_t *st = NULL;
    size_t got, len = 0;

    BT_ASSERT_OK(tok_stream_create(tok, -1, &st));
    tok_stream_set_skip_special(st, skip);
    for (int i = 0; i <= n; i++) {
        if (i < n)
            BT_ASSERT_OK(tok_stream_push(st, ids[i], chunk, sizeof(chunk),
                                         &got));
        else
            BT_ASSERT_OK(tok_stream_flush(st, chunk, sizeof(chunk), &got));
        memcpy(text + len, chunk, got);
        len += got;
    }
    tok_stream_destroy(&st);
    return text;
}

/* decode(encode(x)) == x on generated mixed text (valid UTF-8 only). */
/* flags: 1 skips texts holding "<s>"/"</s>" ("x<s> y" normalizes " y" to
 * "▁▁y", as Hugging Face's legacy mode does), 2 texts starting with a
 * space (Metaspace makes " x" "▁x", which decodes as "x"). */
static void round_trips(const tok_t *tok, int count, int flags)
{
    char buf[2048];

    for (int it = 0; it < count; it++) {
        size_t n = tt_random_text(buf, sizeof(buf), tt_rand() % 300, false);
        int *ids = NULL;
        int n_ids = 0;
        char *dec;
        if ((flags & 1) && (strstr(buf, "<s>") || strstr(buf, "</s>")))
            continue;
        if ((flags & 2) && buf[0] == ' ')
            continue;
        BT_ASSERT_OK(tok_encode(tok, buf, n, false, &ids, &n_ids));
        dec = decode_both(tok, ids, n_ids);
        if (strcmp(dec, buf) != 0)
            BT_TEST_FAIL("round trip \"%s\" -> \"%s\"", buf, dec);
        bt_free(dec);
        bt_free(ids);
    }
}

// ----------------------------------------------------------------------------
// byte-level

static void test_bytelevel(void)
{
    static const char *const merges[] = {
        " |t",   /* 256 */
        "h|e",   /* 257 */
        " t|he", /* 258 */
        "1|2",   /* 259 */
        "12|3",  /* 260 */
        "a|1",   /* 261: crosses a letter/digit boundary, never used */
        "'|s",   /* 262 */
        " | ",   /* 263: two spaces (written "Ġ Ġ") */
        "\xe4|\xb8",     /* 264 */
        "\xe4\xb8|\xad", /* 265: bytes of 中 */
    };
    char *json = make_bytelevel(merges, 10, false, NULL);
    tok_t *tok = load_json(json, NULL);

    BT_ASSERT_EQ(tok_vocab_size(tok), 1003);
    BT_ASSERT_STREQ(tok_kind_name(tok), "tokenizer.json byte-level BPE");
    BT_CHECK(tok_adds_bos(tok)); /* TemplateProcessing puts it first */
    BT_ASSERT_EQ(tok_bos_id(tok), 1000);
    BT_ASSERT_EQ(tok_token_id(tok, "<|eot_id|>"), 1001);
    BT_CHECK(tok_is_special(tok, 1001));
    BT_CHECK(!tok_is_special(tok, 256));
    BT_ASSERT_STREQ(tok_piece(tok, 256), "\xc4\xa0t"); /* "Ġt" */

    EXPECT(tok, "the", false, 't', 257);
    EXPECT(tok, " the", false, 258);
    EXPECT(tok, "the", true, 1000, 't', 257);
    /* \p{N}{1,3}: "1234" is "123" + "4" */
    EXPECT(tok, "1234", false, 260, '4');
    /* letters and digits are separate pre-tokens: "a1" never merges */
    EXPECT(tok, "a1", false, 'a', '1');
    /* contractions, case-insensitive */
    EXPECT(tok, "it's", false, 'i', 't', 262);
    EXPECT(tok, "IT'S", false, 'I', 'T', '\'', 'S');
    /* \s+(?!\S) leaves the last space to the next word */
    EXPECT(tok, "a   b", false, 'a', 263, ' ', 'b');
    EXPECT(tok, "a\n\n b", false, 'a', '\n', '\n', ' ', 'b');
    /* emoji and CJK as bytes; 中 merges */
    EXPECT(tok, "\xf0\x9f\x98\x80", false, 0xf0, 0x9f, 0x98, 0x80);
    EXPECT(tok, "\xe4\xb8\xad\xe6\x96\x87", false, 265, 0xe6, 0x96, 0x87);
    /* invalid UTF-8 still encodes, byte for byte */
    EXPECT(tok, "\xff\xfe" "a", false, 0xff, 0xfe, 'a');
    /* added tokens inside text, never split, longest first */
    EXPECT(tok, "<|begin_of_text|>the<|eot_id|> the<|eot|>", false, 1000,
           't', 257, 1001, 258, 1002);
    EXPECT(tok, "x<|eot_id", false, 'x', '<', '|', 'e', 'o', 't', '_', 'i',
           'd');
    free(json);
    tok_destroy(&tok);
}

static void test_bytelevel_decode(void)
{
    static const char *const merges[] = {" |t", "h|e", " t|he",
                                         "\xf0|\x9f", "\xf0\x9f|\x98"};
    char *json = make_bytelevel(merges, 5, false, NULL);
    tok_t *tok = load_json(json, NULL);
    /* 😀 split over two tokens (260 is its first three bytes): the
     * stream holds them until 0x80 completes the character */
    static const int ids[] = {1000, 't', 257, 260, 0x80, 1001};
    char *dec;

    dec = decode_both(tok, ids, 6);
    BT_ASSERT_STREQ(dec, "<|begin_of_text|>the\xf0\x9f\x98\x80<|eot_id|>");
    bt_free(dec);
    /* per stream (issue 39): the same as the tokenizer-wide switch */
    dec = stream_skip(tok, ids, 6, true);
    BT_ASSERT_STREQ(dec, "the\xf0\x9f\x98\x80");
    bt_free(dec);
    dec = stream_skip(tok, ids, 6, false);
    BT_ASSERT_STREQ(dec, "<|begin_of_text|>the\xf0\x9f\x98\x80<|eot_id|>");
    bt_free(dec);
    tok_set_skip_special(tok, true);
    dec = decode_both(tok, ids, 6);
    BT_ASSERT_STREQ(dec, "the\xf0\x9f\x98\x80");
    bt_free(dec);
    /* an unfinished character at the end becomes U+FFFD */
    dec = decode_both(tok, ids, 4);
    BT_ASSERT_STREQ(dec, "the\xef\xbf\xbd");
    bt_free(dec);
    tok_set_skip_special(tok, false);
    round_trips(tok, 3000, 0);
    free(json);
    tok_destroy(&tok);
}

static void test_ignore_merges(void)
{
    static const char *const merges[] = {"h|e"};
    char *json = make_bytelevel(merges, 1, true, " hello");
    tok_t *tok = load_json(json, NULL);

    /* " hello" is a vocab entry: taken whole although no merge leads there */
    EXPECT(tok, " hello", false, 257);
    EXPECT(tok, "hello", false, 256, 'l', 'l', 'o'); /* "he" merged */
    free(json);
    tok_destroy(&tok);
    json = make_bytelevel(merges, 1, false, " hello");
    tok = load_json(json, NULL);
    EXPECT(tok, " hello", false, ' ', 256, 'l', 'l', 'o');
    free(json);
    tok_destroy(&tok);
}

// ----------------------------------------------------------------------------
// sentencepiece-style

/* Mistral-style tokenizer.json: <unk> <s> </s>, 256 byte pieces, then the
 * pieces below; `meta` picks the older Metaspace pre-tokenizer form
 * (prepend_scheme "first", split as given) over Prepend + Replace. */
static char *make_sp(bool meta, bool meta_split)
{
    static const char *const pieces[] = {
        SP, "h", "e", "l", "o", "w", "r", "d",          /* 259-266 */
        SP "h", SP "he", "ll", SP "hell", SP "hello",   /* 267-271 */
        SP "w", "or", SP "wor", SP "worl", SP "world",  /* 272-276 */
    };
    static const char *const merges[][2] = {
        {SP, "h"}, {SP "h", "e"}, {"l", "l"}, {SP "he", "ll"},
        {SP "hell", "o"}, {SP, "w"}, {"o", "r"}, {SP "w", "or"},
        {SP "wor", "l"}, {SP "worl", "d"},
    };
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *n, *list, *x, *d;
    char name[8];
    char *text;

    cJSON_AddNumberToObject(vocab, "<unk>", 0);
    cJSON_AddNumberToObject(vocab, "<s>", 1);
    cJSON_AddNumberToObject(vocab, "</s>", 2);
    for (int b = 0; b < 256; b++) {
        snprintf(name, sizeof(name), "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, name, 3 + b);
    }
    for (int i = 0; i < (int)(sizeof(pieces) / sizeof(pieces[0])); i++)
        cJSON_AddNumberToObject(vocab, pieces[i], 259 + i);
    for (int i = 0; i < (int)(sizeof(merges) / sizeof(merges[0])); i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(merges[i][0]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(merges[i][1]));
        cJSON_AddItemToArray(ml, pair);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddItemToArray(added, added_tok(0, "<unk>", true));
    cJSON_AddItemToArray(added, added_tok(1, "<s>", true));
    cJSON_AddItemToArray(added, added_tok(2, "</s>", true));
    if (meta) {
        cJSON_AddNullToObject(root, "normalizer");
        n = cJSON_AddObjectToObject(root, "pre_tokenizer");
        cJSON_AddStringToObject(n, "type", "Metaspace");
        cJSON_AddStringToObject(n, "replacement", SP);
        cJSON_AddStringToObject(n, "prepend_scheme", "first");
        cJSON_AddBoolToObject(n, "split", meta_split);
        d = cJSON_AddObjectToObject(root, "decoder");
        cJSON_AddStringToObject(d, "type", "Sequence");
        list = cJSON_AddArrayToObject(d, "decoders");
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "ByteFallback");
        cJSON_AddItemToArray(list, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Metaspace");
        cJSON_AddStringToObject(x, "replacement", SP);
        cJSON_AddStringToObject(x, "prepend_scheme", "first");
        cJSON_AddBoolToObject(x, "split", meta_split);
        cJSON_AddItemToArray(list, x);
    } else {
        n = cJSON_AddObjectToObject(root, "normalizer");
        cJSON_AddStringToObject(n, "type", "Sequence");
        list = cJSON_AddArrayToObject(n, "normalizers");
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Prepend");
        cJSON_AddStringToObject(x, "prepend", SP);
        cJSON_AddItemToArray(list, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "pattern"),
                                "String", " ");
        cJSON_AddStringToObject(x, "content", SP);
        cJSON_AddItemToArray(list, x);
        cJSON_AddNullToObject(root, "pre_tokenizer");
        d = cJSON_AddObjectToObject(root, "decoder");
        cJSON_AddStringToObject(d, "type", "Sequence");
        list = cJSON_AddArrayToObject(d, "decoders");
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "pattern"),
                                "String", SP);
        cJSON_AddStringToObject(x, "content", " ");
        cJSON_AddItemToArray(list, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "ByteFallback");
        cJSON_AddItemToArray(list, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Fuse");
        cJSON_AddItemToArray(list, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Strip");
        cJSON_AddStringToObject(x, "content", " ");
        cJSON_AddNumberToObject(x, "start", 1);
        cJSON_AddNumberToObject(x, "stop", 0);
        cJSON_AddItemToArray(list, x);
    }
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static const char sp_config[] =
    "{\"add_bos_token\": true, \"add_eos_token\": false, "
    "\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, "
    "\"chat_template\": \"{{ bos_token }}{% for message in messages %}"
    "[INST] {{ message['content'] }} [/INST]{% endfor %}\"}";

static void test_sentencepiece(void)
{
    char *json = make_sp(false, false);
    tok_t *tok = load_json(json, sp_config);
    static const int hw[] = {1, 271, 276};
    char *dec;

    BT_ASSERT_STREQ(tok_kind_name(tok),
                    "tokenizer.json sentencepiece-style BPE");
    BT_CHECK(tok_adds_bos(tok));
    BT_CHECK(!tok_adds_eos(tok));
    BT_ASSERT_EQ(tok_bos_id(tok), 1);
    BT_ASSERT_EQ(tok_eos_id(tok), 2);
    EXPECT(tok, "hello world", true, 1, 271, 276);
    EXPECT(tok, "hello world", false, 271, 276);
    /* é is not a piece: byte fallback to <0xC3> <0xA9> */
    EXPECT(tok, "h\xc3\xa9", false, 267, 3 + 0xC3, 3 + 0xA9);
    /* a leading space stays: "▁▁hello" */
    EXPECT(tok, " hello", false, 259, 271);
    /* added tokens split the text; each segment gets its own "▁" */
    EXPECT(tok, "<s>hello</s>", false, 1, 271, 2);
    /* invalid UTF-8 falls back to bytes too */
    EXPECT(tok, "h\xff", false, 267, 3 + 0xFF);

    dec = decode_both(tok, hw, 3);
    BT_ASSERT_STREQ(dec, "<s> hello world");
    bt_free(dec);
    dec = decode_both(tok, hw + 1, 2);
    BT_ASSERT_STREQ(dec, "hello world");
    bt_free(dec);
    tok_set_skip_special(tok, true);
    dec = decode_both(tok, hw, 3);
    BT_ASSERT_STREQ(dec, "hello world");
    bt_free(dec);
    round_trips(tok, 3000, 1);
    free(json);
    tok_destroy(&tok);

    /* The older Metaspace form: same ids, except that prepend_scheme
     * "first" adds no "▁" after a leading added token, and none before a
     * leading space. */
    for (int split = 0; split < 2; split++) {
        json = make_sp(true, split == 1);
        tok = load_json(json, NULL);
        EXPECT(tok, "hello world", false, 271, 276);
        EXPECT(tok, "h\xc3\xa9", false, 267, 3 + 0xC3, 3 + 0xA9);
        EXPECT(tok, "<s>hello", false, 1, 260, 261, 269, 263);
        /* a leading space already is the "▁": nothing prepended */
        EXPECT(tok, " hello", false, 271);
        dec = decode_both(tok, hw + 1, 2);
        BT_ASSERT_STREQ(dec, "hello world");
        bt_free(dec);
        round_trips(tok, 1000, 3);
        free(json);
        tok_destroy(&tok);
    }
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    BT_CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
}

/* A Hugging Face directory: tokenizer.json + tokenizer_config.json +
 * generation_config.json with a list of EOS ids. */
static void test_directory(void)
{
    char dir[] = "/tmp/bt_hftok_dir_XXXXXX";
    char path[512];
    char *json = make_sp(false, false);
    tok_t *tok = NULL;
    int eos[8];
    int n;

    BT_CHECK(mkdtemp(dir) != NULL);
    write_file(dir, "tokenizer.json", json);
    write_file(dir, "tokenizer_config.json", sp_config);
    write_file(dir, "generation_config.json",
               "{\"bos_token_id\": 1, \"eos_token_id\": [2, 275]}");
    BT_ASSERT_OK(tok_load(dir, 32000, &tok));
    n = tok_eos_ids(tok, eos, 8);
    BT_ASSERT_EQ(n, 2);
    BT_ASSERT_EQ(eos[0], 2);
    BT_ASSERT_EQ(eos[1], 275);
    BT_CHECK(tok_chat_template(tok) != NULL);
    BT_ASSERT_EQ(chat_template_detect(tok_chat_template(tok), NULL),
                 CHAT_TEMPLATE_MISTRAL);
    tok_destroy(&tok);
    /* the tokenizer.json path itself works too */
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    BT_ASSERT_OK(tok_load(path, 0, &tok));
    BT_ASSERT_EQ(tok_eos_ids(tok, eos, 8), 2);
    tok_destroy(&tok);
    /* more ids than the model has */
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    BT_CHECK(tok_load(dir, 100, &tok) == BT_ERR_FORMAT);
    bt_log_set_level(BT_LOG_LEVEL_INFO);
    BT_CHECK(strstr(bt_error_last(), "vocab size is 100") != NULL);
    /* a single EOS as an int */
    write_file(dir, "generation_config.json", "{\"eos_token_id\": 7}");
    BT_ASSERT_OK(tok_load(dir, 0, &tok));
    BT_ASSERT_EQ(tok_eos_ids(tok, eos, 8), 2); /* </s> and 7 */
    BT_ASSERT_EQ(eos[1], 7);
    tok_destroy(&tok);
    /* a llama2.c file through tok_load, its piece count found */
    BT_ASSERT_OK(tok_load(BT_SHARED_DIR "/models/aidreams-tok512.bin", 0,
                          &tok));
    BT_ASSERT_EQ(tok_vocab_size(tok), 512);
    BT_ASSERT_STREQ(tok_kind_name(tok), "llama2.c");
    BT_ASSERT_EQ(tok_eos_ids(tok, eos, 8), 1);
    tok_destroy(&tok);
    remove_file(dir, "tokenizer.json");
    remove_file(dir, "tokenizer_config.json");
    remove_file(dir, "generation_config.json");
    rmdir(dir);
    free(json);
}

// ----------------------------------------------------------------------------
// malformed files

static void test_malformed(void)
{
    static const struct {
        const char *json;
        const char *msg;
    } cases[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\"", "JSON object"},
        {"[1, 2]", "JSON object"},
        {"{}", "no \"model\""},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}",
         "vocab object"},
        {"{\"model\": {\"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
         "integer id"},
        {"{\"model\": {\"vocab\": {\"a\": 1.5}, \"merges\": []}}",
         "integer id"},
        {"{\"model\": {\"vocab\": {\"a\": 1e9}, \"merges\": []}}",
         "integer id"},
        {"{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}",
         "integer id"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}}", "empty"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 5000000}, "
         "\"merges\": []}}", "far beyond"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
         "given to both"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, "
         "\"merges\": [\"a c\"]}}", "not in the vocab"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, "
         "\"merges\": [\"a b\"]}}", "makes a token"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, "
         "\"merges\": [\"ab\"]}}", "neither"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, "
         "\"merges\": [[\"a\"]]}}", "neither"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [5]}}", "neither"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
         "not supported"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], "
         "\"unk_token\": \"<zz>\"}}", "unk_token"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"added_tokens\": [{\"id\": 3}]}", "non-empty content"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"added_tokens\": {\"id\": 3}}", "not an array"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
         "does not compile"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}}", "behavior"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
         "not supported"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"normalizer\": {\"type\": \"Lowercase\"}}", "not supported"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"decoder\": {\"type\": \"WordPiece\"}}", "not supported"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], "
         "\"continuing_subword_prefix\": \"##\"}}", "continuing_subword"},
    };

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* expected errors, asserted */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tok_t *tok = NULL;
        bt_status_t status;
        bt_error_clear();
        status = tok_load_json_mem(cases[i].json, strlen(cases[i].json),
                                   NULL, 0, &tok);
        if (status == BT_OK)
            BT_TEST_FAIL("case %zu loaded: %s", i, cases[i].json);
        BT_CHECK(tok == NULL);
        if (strstr(bt_error_last(), cases[i].msg) == NULL)
            BT_TEST_FAIL("case %zu: message \"%s\" lacks \"%s\"", i,
                         bt_error_last(), cases[i].msg);
    }
    /* a good file cut at every length never loads half-way */
    {
        char *json = make_sp(false, false);
        size_t len = strlen(json);
        for (size_t cut = 0; cut < len; cut += 1 + cut / 7) {
            tok_t *tok = NULL;
            if (tok_load_json_mem(json, cut, NULL, 0, &tok) == BT_OK)
                BT_TEST_FAIL("truncated at %zu loaded", cut);
        }
        /* a bad config is refused too */
        {
            tok_t *tok = NULL;
            BT_CHECK(tok_load_json_mem(json, len, "[", 1, &tok) ==
                     BT_ERR_FORMAT);
        }
        free(json);
    }
    bt_log_set_level(BT_LOG_LEVEL_INFO);
}

// ----------------------------------------------------------------------------
// chat templates

static void expect_chat(chat_template_t t, const chat_msg_t *m, int n,
                        bool gen, const char *want)
{
    char *text = NULL;
    BT_ASSERT_OK(chat_format(t, m, n, gen, "<s>", "</s>", &text));
    if (strcmp(text, want) != 0)
        BT_TEST_FAIL("%s: got\n%s\nwant\n%s", chat_template_name(t), text,
                     want);
    bt_free(text);
}

static void test_chat(void)
{
    static const chat_msg_t conv[] = {
        {"system", "Be brief."},
        {"user", "Hi!"},
        {"assistant", "Hello!"},
        {"user", "Bye"},
    };
    chat_template_t t;

    expect_chat(CHAT_TEMPLATE_LLAMA3, conv, 2, true,
                "<|start_header_id|>system<|end_header_id|>\n\nBe brief."
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!"
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                "\n\n");
    expect_chat(CHAT_TEMPLATE_CHATML, conv + 1, 1, true,
                "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
    expect_chat(CHAT_TEMPLATE_QWEN, conv + 1, 1, false,
                "<|im_start|>system\nYou are Qwen, created by Alibaba "
                "Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nHi!<|im_end|>\n");
    expect_chat(CHAT_TEMPLATE_QWEN, conv, 2, false,
                "<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nHi!<|im_end|>\n");
    expect_chat(CHAT_TEMPLATE_LLAMA2, conv, 4, true,
                "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello! "
                "</s><s>[INST] Bye [/INST]");
    expect_chat(CHAT_TEMPLATE_MISTRAL, conv + 1, 3, true,
                "[INST] Hi! [/INST]Hello!</s>[INST] Bye [/INST]");
    expect_chat(CHAT_TEMPLATE_MISTRAL, conv, 2, true,
                "[INST] Be brief.\n\nHi! [/INST]");
    expect_chat(CHAT_TEMPLATE_PLAIN, conv, 3, true,
                "System: Be brief.\nUser: Hi!\nAssistant: Hello!\n"
                "Assistant:");
    expect_chat(CHAT_TEMPLATE_PLAIN, conv, 0, false, "");

    BT_ASSERT_EQ(chat_template_detect("{{ '<|start_header_id|>' }}", NULL),
                 CHAT_TEMPLATE_LLAMA3);
    BT_ASSERT_EQ(chat_template_detect("<|im_start|>", NULL),
                 CHAT_TEMPLATE_CHATML);
    BT_ASSERT_EQ(chat_template_detect("You are Qwen <|im_start|>", NULL),
                 CHAT_TEMPLATE_QWEN);
    BT_ASSERT_EQ(chat_template_detect("<<SYS>> [INST]", NULL),
                 CHAT_TEMPLATE_LLAMA2);
    BT_ASSERT_EQ(chat_template_detect("[INST]", NULL),
                 CHAT_TEMPLATE_MISTRAL);
    BT_ASSERT_EQ(chat_template_detect(NULL, "qwen2"), CHAT_TEMPLATE_QWEN);
    BT_ASSERT_EQ(chat_template_detect(NULL, "mistral"),
                 CHAT_TEMPLATE_MISTRAL);
    BT_ASSERT_EQ(chat_template_detect("{{ x }}", "llama"),
                 CHAT_TEMPLATE_PLAIN);
    BT_ASSERT_OK(chat_template_from_name("llama3", &t));
    BT_ASSERT_EQ(t, CHAT_TEMPLATE_LLAMA3);
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    BT_CHECK(chat_template_from_name("jinja", &t) == BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(bt_error_last(), "known: plain") != NULL);
    {
        chat_msg_t bad = {"user", NULL};
        char *text = NULL;
        BT_CHECK(chat_format(CHAT_TEMPLATE_PLAIN, &bad, 1, false, NULL, NULL,
                             &text) == BT_ERR_INVALID_ARG);
    }
    bt_log_set_level(BT_LOG_LEVEL_INFO);
}

int main(void)
{
    test_bytelevel();
    BT_TEST_PASS("hftok bytelevel");
    test_bytelevel_decode();
    BT_TEST_PASS("hftok bytelevel decode/stream/round trips");
    test_ignore_merges();
    BT_TEST_PASS("hftok ignore_merges");
    test_sentencepiece();
    BT_TEST_PASS("hftok sentencepiece");
    test_directory();
    BT_TEST_PASS("hftok directory/configs");
    test_malformed();
    BT_TEST_PASS("hftok malformed");
    test_chat();
    BT_TEST_PASS("hftok chat templates");
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    return 0;
}
