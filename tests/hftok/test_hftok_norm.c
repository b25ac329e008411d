/*
 * test_hftok_norm.c - the Unicode normalizers of tokenizer.json (NFC, NFD,
 * NFKC, NFKD, alone and inside Sequence with Prepend/Replace) and how
 * added tokens meet them, on hand-made tokenizer.json files:
 *  - byte-level (ids 0..255 are the bytes, one merge for "é"): decomposed
 *    input ("e\u0301", "A\u030a", reordered marks, Hangul jamo) gives the
 *    ids of the precomposed form under NFC, and different ids without a
 *    normalizer; NFKC folds the "ﬁ" ligature, full-width digits, circled
 *    digits and NBSP; NFD/NFKD decompose; nested Sequence;
 *  - sentencepiece-style (Prepend/Replace, byte fallback): Sequence
 *    [NFC, Prepend, Replace], and the order of the steps matters
 *    ([NFKC, Prepend, Replace] vs [Prepend, Replace, NFKC] on NBSP);
 *  - added tokens as the Hugging Face library treats them: normalized:false
 *    ones are matched in the raw text (so a decomposed spelling does not
 *    match), normalized:true ones in the normalized text by their content
 *    put through the normalizer (with Prepend: "▁</s>");
 *  - invalid UTF-8: the segment keeps its raw bytes (no crash), while the
 *    segment after an added token is still normalized;
 *  - decode(encode(x)) == NFC(x) on random mixed text (utf8proc's NFC as
 *    the reference), and the encode throughput with and without NFC.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/tokenizer.h"
#include "hftok_fixture.h"
#include "tokenizer/tok_test_util.h"

#define NFC_JSON "{\"type\":\"NFC\"}"
#define NFD_JSON "{\"type\":\"NFD\"}"
#define NFKC_JSON "{\"type\":\"NFKC\"}"
#define NFKD_JSON "{\"type\":\"NFKD\"}"
#define PREPEND_JSON "{\"type\":\"Prepend\",\"prepend\":\"" SP "\"}"
#define REPLACE_JSON                                                        \
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" SP \
    "\"}"
#define SEQ_JSON(...) "{\"type\":\"Sequence\",\"normalizers\":[" __VA_ARGS__ "]}"

// ----------------------------------------------------------------------------
// helpers

/* Attaches the normalizer given as JSON text (NULL: null). */
static void set_normalizer(cJSON *root, const char *norm_json)
{
    cJSON *n = norm_json != NULL ? cJSON_Parse(norm_json) : cJSON_CreateNull();
    if (n == NULL)
        BT_TEST_FAIL("bad normalizer JSON in the test: %s", norm_json);
    cJSON_AddItemToObject(root, "normalizer", n);
}

/* Byte-level tokenizer: ids 0..255 are the bytes, 256 is "é" (merge
 * C3 A9); added tokens 1000 "<|eot|>" (raw), 1001 "<é>" (normalized),
 * 1002 "<|é|>" (raw), 1003 "<e\u0301x>" (normalized, decomposed content).
 * Returns the JSON text (free with free). */
static char *make_bl(const char *norm_json)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *d;
    char a[4], b[4], ab[16];
    char *text;

    hf_add_byte_vocab(vocab);
    hf_mapped(0xC3, a);
    hf_mapped(0xA9, b);
    snprintf(ab, sizeof(ab), "%s%s", a, b);
    cJSON_AddNumberToObject(vocab, ab, 256);
    snprintf(ab, sizeof(ab), "%s %s", a, b);
    cJSON_AddItemToArray(ml, cJSON_CreateString(ab));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddItemToArray(added, hf_added_tok(1000, "<|eot|>", true, false));
    cJSON_AddItemToArray(added,
                         hf_added_tok(1001, "<\xc3\xa9>", false, true));
    cJSON_AddItemToArray(added,
                         hf_added_tok(1002, "<|\xc3\xa9|>", true, false));
    cJSON_AddItemToArray(added,
                         hf_added_tok(1003, "<e\xcc\x81x>", false, true));
    set_normalizer(root, norm_json);
    hf_add_llama3_pre(root);
    d = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(d, "type", "ByteLevel");
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* Sentencepiece-style tokenizer with byte fallback (<0xXX> = 3 + byte):
 * 259 "▁" 260 "c" 261 "a" 262 "f" 263 "é" 264 "u" 265 "▁c" 266 "▁ca"
 * 267 "▁caf" 268 "▁café" 269 "▁a" 270 "▁au"; added 0 <unk>, 1 <s> (raw),
 * 2 </s> (normalized). */
static char *make_sp(const char *norm_json)
{
    static const char *const pieces[] = {
        SP, "c", "a", "f", "\xc3\xa9", "u", SP "c", SP "ca", SP "caf",
        SP "caf\xc3\xa9", SP "a", SP "au",
    };
    static const char *const merges[] = {
        SP " c", SP "c a", SP "ca f", SP "caf \xc3\xa9", SP " a", SP "a u",
    };
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *d, *list, *x;
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
    for (int i = 0; i < (int)(sizeof(merges) / sizeof(merges[0])); i++)
        cJSON_AddItemToArray(ml, cJSON_CreateString(merges[i]));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddItemToArray(added, hf_added_tok(0, "<unk>", true, false));
    cJSON_AddItemToArray(added, hf_added_tok(1, "<s>", true, false));
    cJSON_AddItemToArray(added, hf_added_tok(2, "</s>", true, true));
    set_normalizer(root, norm_json);
    cJSON_AddNullToObject(root, "pre_tokenizer");
    d = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(d, "type", "Sequence");
    list = cJSON_AddArrayToObject(d, "decoders");
    x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "pattern"), "String",
                            SP);
    cJSON_AddStringToObject(x, "content", " ");
    cJSON_AddItemToArray(list, x);
    x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "type", "ByteFallback");
    cJSON_AddItemToArray(list, x);
    x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "type", "Fuse");
    cJSON_AddItemToArray(list, x);
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static tok_t *load(char *json)
{
    tok_t *tok = NULL;
    bt_status_t status = tok_load_json_mem(json, strlen(json), NULL, 0, &tok);
    if (status != BT_OK)
        BT_TEST_FAIL("load: %s", bt_error_last());
    free(json);
    return tok;
}

static void print_ids(const char *what, const int *ids, int n)
{
    fprintf(stderr, " %s", what);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
}

/* Encodes text and compares with the expected ids. */
static void expect_ids(const tok_t *tok, const char *text, size_t len,
                       const int *want, int n_want, int line)
{
    int *ids = NULL;
    int n = 0;
    BT_ASSERT_OK(tok_encode(tok, text, len, false, &ids, &n));
    if (n != n_want || memcmp(ids, want, sizeof(int) * (size_t)n) != 0) {
        fprintf(stderr, "line %d, text \"%s\":", line, text);
        print_ids("got", ids, n);
        print_ids(", want", want, n_want);
        fprintf(stderr, "\n");
        BT_TEST_FAIL("ids differ");
    }
    bt_free(ids);
}

#define EXPECT(_tok, _text, ...)                                            \
    do {                                                                    \
        static const int _want[] = {__VA_ARGS__};                           \
        expect_ids(_tok, _text, sizeof(_text) - 1, _want,                   \
                   (int)(sizeof(_want) / sizeof(_want[0])), __LINE__);      \
    } while (0)

/* Whether a and b encode to the same ids. */
static bool same_ids(const tok_t *tok, const char *a, const char *b)
{
    int *ia = NULL, *ib = NULL;
    int na = 0, nb = 0;
    bool same;
    BT_ASSERT_OK(tok_encode(tok, a, strlen(a), false, &ia, &na));
    BT_ASSERT_OK(tok_encode(tok, b, strlen(b), false, &ib, &nb));
    same = na == nb && memcmp(ia, ib, sizeof(int) * (size_t)na) == 0;
    bt_free(ia);
    bt_free(ib);
    return same;
}

/* Non-normalized input and its precomposed (NFC) spelling. */
static const char *const nfc_pairs[][2] = {
    {"e\xcc\x81", "\xc3\xa9"},                               /* é */
    {"cafe\xcc\x81 au lait", "caf\xc3\xa9 au lait"},
    {"A\xcc\x8a", "\xc3\x85"},                               /* Å */
    {"\xe2\x84\xab", "\xc3\x85"},                            /* Å sign */
    {"a\xcc\xa3\xcc\x82", "\xe1\xba\xad"},                   /* ậ */
    {"a\xcc\x82\xcc\xa3", "\xe1\xba\xad"},                   /* reordered */
    {"\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab", "\xed\x95\x9c"}, /* 한 jamo */
    {"\xe1\x84\x80\xe1\x85\xa1 \xe1\x84\x82\xe1\x85\xa1",
     "\xea\xb0\x80 \xeb\x82\x98"},                           /* 가 나 */
    {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"},            /* 가+ᆨ = 각 */
    {"\xe3\x81\x8b\xe3\x82\x99", "\xe3\x81\x8c"},            /* か+゙ = が */
    {"Zoe\xcc\x88 in Ko\xcc\x88ln, 123.", "Zo\xc3\xab in K\xc3\xb6ln, 123."},
};

// ----------------------------------------------------------------------------
// byte-level

static void test_nfc_bytelevel(void)
{
    tok_t *nfc = load(make_bl(NFC_JSON));
    tok_t *plain = load(make_bl(NULL));
    tok_t *nested = load(make_bl(SEQ_JSON(SEQ_JSON(NFD_JSON) "," NFC_JSON)));

    for (size_t i = 0; i < sizeof(nfc_pairs) / sizeof(nfc_pairs[0]); i++) {
        const char *raw = nfc_pairs[i][0], *pre = nfc_pairs[i][1];
        if (!same_ids(nfc, raw, pre))
            BT_TEST_FAIL("NFC: \"%s\" and \"%s\" differ", raw, pre);
        if (!same_ids(nested, raw, pre))
            BT_TEST_FAIL("Sequence[Sequence[NFD], NFC]: \"%s\"", raw);
        if (same_ids(plain, raw, pre)) /* the normalizer did the work */
            BT_TEST_FAIL("no normalizer: \"%s\" and \"%s\" agree", raw, pre);
    }
    EXPECT(nfc, "e\xcc\x81", 256);
    EXPECT(plain, "e\xcc\x81", 'e', 0xcc, 0x81);
    EXPECT(nfc, "\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab", 0xed, 0x95, 0x9c);
    /* NFC keeps compatibility characters */
    EXPECT(nfc, "\xef\xac\x81", 0xef, 0xac, 0x81);    /* ﬁ */
    EXPECT(nfc, "\xef\xbc\x91", 0xef, 0xbc, 0x91);    /* full-width 1 */
    EXPECT(nfc, "plain ascii", 'p', 'l', 'a', 'i', 'n', ' ', 'a', 's', 'c',
           'i', 'i');
    {
        int *ids = NULL;
        int n = -1;
        BT_ASSERT_OK(tok_encode(nfc, "", 0, false, &ids, &n));
        BT_ASSERT_EQ(n, 0);
        bt_free(ids);
    }
    tok_destroy(&nested);
    tok_destroy(&plain);
    tok_destroy(&nfc);
    BT_TEST_PASS("nfc_bytelevel");
}

static void test_nfkc_nfd_nfkd(void)
{
    tok_t *nfkc = load(make_bl(NFKC_JSON));
    tok_t *nfd = load(make_bl(NFD_JSON));
    tok_t *nfkd = load(make_bl(NFKD_JSON));

    for (size_t i = 0; i < sizeof(nfc_pairs) / sizeof(nfc_pairs[0]); i++)
        if (!same_ids(nfkc, nfc_pairs[i][0], nfc_pairs[i][1]))
            BT_TEST_FAIL("NFKC: \"%s\"", nfc_pairs[i][0]);
    EXPECT(nfkc, "\xef\xac\x81le", 'f', 'i', 'l', 'e');          /* ﬁle */
    EXPECT(nfkc, "\xef\xbc\x91\xef\xbc\x92\xef\xbc\x93", '1', '2', '3');
    EXPECT(nfkc, "\xe2\x91\xa0", '1');                           /* ① */
    EXPECT(nfkc, "x\xc2\xa0y", 'x', ' ', 'y');                   /* NBSP */
    EXPECT(nfkc, "\xef\xbc\xa1\xef\xbd\x82", 'A', 'b');          /* Ａｂ */
    EXPECT(nfkc, "\xc2\xbd", '1', 0xe2, 0x81, 0x84, '2');        /* ½ */
    EXPECT(nfkc, "e\xcc\x81", 256);
    if (!same_ids(nfkc, "\xef\xac\x81", "fi") ||
        !same_ids(nfkc, "\xef\xbc\x90\xef\xbc\x99", "09"))
        BT_TEST_FAIL("NFKC: ligature or full-width digits");

    EXPECT(nfd, "\xc3\xa9", 'e', 0xcc, 0x81);
    EXPECT(nfd, "\xed\x95\x9c", 0xe1, 0x84, 0x92, 0xe1, 0x85, 0xa1, 0xe1,
           0x86, 0xab);
    EXPECT(nfd, "\xef\xac\x81", 0xef, 0xac, 0x81);               /* kept */
    EXPECT(nfd, "a\xcc\x82\xcc\xa3", 'a', 0xcc, 0xa3, 0xcc, 0x82);
    EXPECT(nfkd, "\xef\xac\x81\xc3\xa9", 'f', 'i', 'e', 0xcc, 0x81);
    tok_destroy(&nfkd);
    tok_destroy(&nfd);
    tok_destroy(&nfkc);
    BT_TEST_PASS("nfkc_nfd_nfkd");
}

/* Added tokens: normalized:false ones are matched in the raw text only,
 * normalized:true ones in the normalized text. */
static void test_added_bytelevel(void)
{
    tok_t *nfc = load(make_bl(NFC_JSON));
    tok_t *plain = load(make_bl(NULL));

    EXPECT(nfc, "a<|eot|>b", 'a', 1000, 'b');
    EXPECT(nfc, "<|\xc3\xa9|>", 1002);
    /* raw token, decomposed spelling: not matched, though NFC makes the
     * text equal to its content (the library does the same) */
    EXPECT(nfc, "<|e\xcc\x81|>", '<', '|', 256, '|', '>');
    /* normalized tokens: matched in either spelling */
    EXPECT(nfc, "x<\xc3\xa9>y", 'x', 1001, 'y');
    EXPECT(nfc, "x<e\xcc\x81>y", 'x', 1001, 'y');
    EXPECT(nfc, "<\xc3\xa9x>", 1003);                 /* content NFC'd */
    EXPECT(nfc, "<e\xcc\x81x>", 1003);
    EXPECT(nfc, "<e\xcc\x81><|eot|><\xc3\xa9x>", 1001, 1000, 1003);
    /* no normalizer: each matches its own bytes only */
    EXPECT(plain, "<e\xcc\x81x>", 1003);
    EXPECT(plain, "<\xc3\xa9x>", '<', 256, 'x', '>');
    tok_destroy(&plain);
    tok_destroy(&nfc);
    BT_TEST_PASS("added_bytelevel");
}

/* Invalid UTF-8 cannot be normalized: that segment keeps its bytes; the
 * next segment (after an added token) is normalized as usual. */
static void test_invalid_utf8(void)
{
    static const char *const bad[] = {
        "\xff", "e\xcc\x81\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xc0\xaf", "e\xcc", "\xe1\x84\x92\xe1\x85",
    };
    tok_t *toks[3] = {load(make_bl(NFC_JSON)), load(make_bl(NFKD_JSON)),
                      load(make_sp(SEQ_JSON(NFC_JSON "," PREPEND_JSON ","
                                            REPLACE_JSON)))};

    EXPECT(toks[0], "\xff" "e\xcc\x81", 0xff, 'e', 0xcc, 0x81);
    EXPECT(toks[0], "\xff" "e\xcc\x81<|eot|>e\xcc\x81", 0xff, 'e', 0xcc,
           0x81, 1000, 256);
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            int *ids = NULL;
            int n = 0;
            char *dec = NULL;
            BT_ASSERT_OK(tok_encode(toks[t], bad[i], strlen(bad[i]), false,
                                    &ids, &n));
            BT_CHECK(n > 0);
            BT_ASSERT_OK(tok_decode(toks[t], -1, ids, n, &dec));
            bt_free(dec);
            bt_free(ids);
        }
    for (int t = 0; t < 3; t++)
        tok_destroy(&toks[t]);
    BT_TEST_PASS("invalid_utf8");
}

// ----------------------------------------------------------------------------
// sentencepiece-style

static void test_sp_sequence(void)
{
    tok_t *seq = load(make_sp(SEQ_JSON(NFC_JSON "," PREPEND_JSON ","
                                       REPLACE_JSON)));
    tok_t *plain = load(make_sp(SEQ_JSON(PREPEND_JSON "," REPLACE_JSON)));
    tok_t *kfirst = load(make_sp(SEQ_JSON(NFKC_JSON "," PREPEND_JSON ","
                                          REPLACE_JSON)));
    tok_t *klast = load(make_sp(SEQ_JSON(PREPEND_JSON "," REPLACE_JSON ","
                                         NFKC_JSON)));

    EXPECT(seq, "caf\xc3\xa9 au", 268, 270);
    EXPECT(seq, "cafe\xcc\x81 au", 268, 270);
    EXPECT(plain, "caf\xc3\xa9 au", 268, 270);
    /* without NFC the decomposed "e" and U+0301 fall back to bytes */
    EXPECT(plain, "cafe\xcc\x81 au", 267, 3 + 'e', 3 + 0xcc, 3 + 0x81, 270);
    /* the steps run in the order given: NBSP becomes a space before or
     * after the spaces were replaced */
    EXPECT(kfirst, "a\xc2\xa0u", 269, 259, 264);
    EXPECT(klast, "a\xc2\xa0u", 269, 3 + ' ', 264);
    EXPECT(plain, "a\xc2\xa0u", 269, 3 + 0xc2, 3 + 0xa0, 264);

    /* added tokens: <s> (normalized:false) is cut from the raw text, and
     * each side is normalized on its own (so both get the Prepend);
     * </s> (normalized:true) is matched as "▁</s>" in the normalized text,
     * as in the library's legacy mode */
    EXPECT(seq, "au<s>au", 270, 1, 270);
    EXPECT(seq, "au </s>", 270, 2);
    EXPECT(seq, "au</s>", 270, 3 + '<', 3 + '/', 3 + 's', 3 + '>');
    EXPECT(seq, "cafe\xcc\x81 </s> au", 268, 2, 270);
    tok_destroy(&klast);
    tok_destroy(&kfirst);
    tok_destroy(&plain);
    tok_destroy(&seq);
    BT_TEST_PASS("sp_sequence");
}

// ----------------------------------------------------------------------------
// round trips and throughput

/* Random text with decomposed letters, jamo and compatibility characters
 * mixed into tt_random_text's words. */
static size_t norm_text(char *buf, size_t cap, size_t target)
{
    static const char *const extra[] = {
        "e\xcc\x81", "A\xcc\x8a", "a\xcc\x82\xcc\xa3", "\xe1\x84\x92\xe1\x85"
        "\xa1\xe1\x86\xab", "\xe3\x81\x8b\xe3\x82\x99", "\xef\xac\x81",
        "\xef\xbc\x91", "\xe2\x84\xab", "\xc2\xa0", " ", "o\xcc\x88",
        "\xea\xb0\x80\xe1\x86\xa8",         /* 가 + ᆨ */
        "\xe4\xb8\xad\xcc\x81",              /* 中 + U+0301 */
        "\xc3\xa9\xcc\xa3",                   /* é + U+0323 */
        "\xcd\xbe\xcd\xb4\xef\xa4\x80",    /* U+037E U+0374 U+F900 */
        "\xe1\x84\x80", "\xe1\x85\xa1",      /* jamo L, V */
        "\xe3\x82\x99", "\xea\xb0\x80",      /* U+3099, 가 */
        "\xcc\x81", "\xe4\xb8\xad",          /* lone mark, 中 */
    };
    size_t n = tt_random_text(buf, cap, target, false);
    while (n + 16 < cap && n < target + 40) {
        const char *e = extra[tt_rand() % (sizeof(extra) / sizeof(extra[0]))];
        size_t l = strlen(e);
        memcpy(buf + n, e, l);
        n += l;
        n += tt_random_text(buf + n, cap - n, tt_rand() % 8, false);
    }
    buf[n] = '\0';
    return n;
}

/* decode(encode(x)) == the form applied to all of x by utf8proc, for each
 * form: checks the cutting of text before inert characters. */
/* The facts tj_norm_inert() in tokenizer_json.c relies on, checked with
 * utf8proc for every code point of its ranges (keep the two in step):
 * combining class 0, unchanged by the form, and never after the first
 * code point of any character's canonical decomposition (so never the
 * second of a composition). */
static void test_inert_ranges(void)
{
    static const struct {
        int32_t lo, hi;
        bool composing_only; /* inert for NFC/NFKC only */
    } ranges[] = {
        {0, 0x7F, false},
        {0x3400, 0x4DBF, false},
        {0x4E00, 0x9FFF, false},
        {0xAC00, 0xD7A3, true},
    };
    static const int forms[] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    uint8_t *second = bt_calloc(0x110000, 1, "test");
    utf8proc_int32_t dec[32];

    for (int32_t c = 0; c < 0x110000; c++) {
        utf8proc_ssize_t n;
        if (!utf8proc_codepoint_valid(c))
            continue;
        n = utf8proc_decompose_char(c, dec, 32, UTF8PROC_DECOMPOSE, NULL);
        for (utf8proc_ssize_t k = 1; k < n && k < 32; k++)
            second[dec[k]] = 1;
    }
    for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++)
        for (int32_t c = ranges[r].lo; c <= ranges[r].hi; c++) {
            utf8proc_uint8_t in[8];
            utf8proc_ssize_t len = utf8proc_encode_char(c, in);
            if (utf8proc_get_property(c)->combining_class != 0 || second[c])
                BT_TEST_FAIL("U+%04X is not inert", (unsigned)c);
            for (int f = 0; f < 4; f++) {
                utf8proc_uint8_t *out = NULL;
                if (ranges[r].composing_only &&
                    !(forms[f] & UTF8PROC_COMPOSE))
                    continue;
                BT_CHECK(utf8proc_map(in, len, &out,
                                      (utf8proc_option_t)forms[f]) == len);
                if (memcmp(out, in, (size_t)len) != 0)
                    BT_TEST_FAIL("U+%04X changes under form %d", (unsigned)c,
                                 f);
                free(out); /* utf8proc allocates with malloc */
            }
        }
    bt_free(second);
    BT_TEST_PASS("inert_ranges");
}

static void test_round_trips(void)
{
    static const char *const forms[] = {NFC_JSON, NFD_JSON, NFKC_JSON,
                                        NFKD_JSON};
    char buf[4096];

    for (int it = 0; it < 4000; it++) {
        int f = it % 4;
        tok_t *bl = load(make_bl(forms[f]));
        size_t n = norm_text(buf, sizeof(buf), tt_rand() % 300);
        const utf8proc_uint8_t *in = (const utf8proc_uint8_t *)buf;
        utf8proc_uint8_t *want = f == 0   ? utf8proc_NFC(in)
                                 : f == 1 ? utf8proc_NFD(in)
                                 : f == 2 ? utf8proc_NFKC(in)
                                          : utf8proc_NFKD(in);
        int *ids = NULL;
        int n_ids = 0;
        char *dec = NULL;
        BT_CHECK(want != NULL);
        BT_ASSERT_OK(tok_encode(bl, buf, n, false, &ids, &n_ids));
        BT_ASSERT_OK(tok_decode(bl, -1, ids, n_ids, &dec));
        if (strcmp(dec, (const char *)want) != 0)
            BT_TEST_FAIL("%s: decode(encode(\"%s\")) = \"%s\", want \"%s\"",
                         forms[f], buf, dec, (const char *)want);
        free(want); /* utf8proc allocates with malloc */
        bt_free(dec);
        bt_free(ids);
        tok_destroy(&bl);
    }
    BT_TEST_PASS("round_trips");
}

/* Encode throughput of 2 MB of mixed text, with and without NFC
 * (informative; printed as key:value). */
static void test_throughput(void)
{
    const size_t size = 2u << 20;
    char *text = bt_malloc(size + 64, "test");
    tok_t *toks[2] = {load(make_bl(NULL)), load(make_bl(NFC_JSON))};
    size_t n = 0;

    while (n + 512 < size)
        n += norm_text(text + n, size + 64 - n, 200);
    for (int t = 0; t < 2; t++) {
        int *ids = NULL;
        int n_ids = 0;
        uint64_t t0 = bt_time_ns();
        BT_ASSERT_OK(tok_encode(toks[t], text, n, false, &ids, &n_ids));
        fprintf(stderr, "encode normalizer:%s bytes:%zu ids:%d MB/s:%.1f\n",
                t ? "NFC" : "none", n, n_ids,
                (double)n / 1e6 / ((double)(bt_time_ns() - t0) / 1e9));
        bt_free(ids);
        tok_destroy(&toks[t]);
    }
    bt_free(text);
    BT_TEST_PASS("throughput");
}

int main(void)
{
    fprintf(stderr, "utf8proc %s, Unicode %s\n", utf8proc_version(),
            utf8proc_unicode_version());
    test_nfc_bytelevel();
    test_nfkc_nfd_nfkd();
    test_added_bytelevel();
    test_invalid_utf8();
    test_sp_sequence();
    test_inert_ranges();
    test_round_trips();
    test_throughput();
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    return 0;
}
