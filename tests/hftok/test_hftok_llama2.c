/*
 * test_hftok_llama2.c - the llama2.c-format Llama 2 vocabulary and its
 * tokenizer.json form give identical ids.
 *
 * The test builds the tokenizer.json the way Hugging Face's converter
 * does for a sentencepiece BPE model: the vocabulary with "▁" for spaces,
 * <unk>/<s>/</s> as special added tokens, byte fallback, the normalizer
 * Prepend("▁") + Replace(" ", "▁"), and merges derived from the piece
 * scores.  Sentencepiece merges the adjacent pair whose concatenation has
 * the highest score (leftmost on ties); the `tokenizers` BPE merges the
 * pair of lowest rank.  So every split a + b of a piece P (both parts
 * pieces) becomes a merge, ranked by P's score descending.  Pieces of
 * equal score (the 16 runs of spaces, all -1e9) are ranked longest first:
 * sentencepiece's leftmost rule grows a run of spaces from the left, and
 * "longer first" makes the rank order do the same.  The merges are
 * written in the pair-array form (the hand-made tests use "a b").
 *
 * Then 20,000 mixed texts (ten of them tens of KB long) (valid UTF-8: the JSON form, like the library,
 * takes only valid text) are encoded both ways and must agree; decoding
 * the tokenizer.json ids must give the text back.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/tokenizer.h"
#include "tokenizer/tok_test_util.h"

#define VOCAB 32000

typedef struct {
    int id;       /* the merged piece */
    float score;  /* its score */
    int len;      /* its byte length */
    int split;    /* byte offset of the split */
} merge_t;

static const char *g_pieces[VOCAB];
static int g_lens[VOCAB];
static int *g_hash;
static unsigned g_mask;

static unsigned h_of(const char *s, size_t n)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int lookup(const char *s, size_t n)
{
    for (unsigned slot = h_of(s, n) & g_mask; g_hash[slot] >= 0;
         slot = (slot + 1) & g_mask) {
        int id = g_hash[slot];
        if ((size_t)g_lens[id] == n && memcmp(g_pieces[id], s, n) == 0)
            return id;
    }
    return -1;
}

static int merge_cmp(const void *a, const void *b)
{
    const merge_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    if (x->id != y->id)
        return x->id - y->id;
    return x->split - y->split;
}

/* The piece as a tokenizer.json token string: spaces become "▁". */
static char *sp_string(const char *s, int n)
{
    char *out = malloc((size_t)n * 3 + 1);
    int w = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(out + w, "\xe2\x96\x81", 3);
            w += 3;
        } else {
            out[w++] = s[i];
        }
    }
    out[w] = '\0';
    return out;
}

static char *build_json(const tok_t *l2)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
    cJSON *norms, *n, *dec, *decs, *d;
    static const char *specials[3] = {"<unk>", "<s>", "</s>"};
    merge_t *ms = malloc(sizeof(*ms) * 400000);
    int n_ms = 0;
    char *text;

    g_mask = 65535;
    g_hash = malloc(sizeof(int) * (g_mask + 1));
    memset(g_hash, 0xff, sizeof(int) * (g_mask + 1));
    for (int id = 0; id < VOCAB; id++) {
        unsigned slot;
        g_pieces[id] = tok_piece(l2, id);
        g_lens[id] = (int)strlen(g_pieces[id]);
        for (slot = h_of(g_pieces[id], (size_t)g_lens[id]) & g_mask;
             g_hash[slot] >= 0; slot = (slot + 1) & g_mask)
            ;
        g_hash[slot] = id;
    }
    for (int id = 0; id < VOCAB; id++) {
        char *s = id < 3 ? strdup(specials[id])
                         : sp_string(g_pieces[id], g_lens[id]);
        cJSON_AddNumberToObject(vocab, s, id);
        free(s);
        if (id < 3) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", id);
            cJSON_AddStringToObject(a, "content", specials[id]);
            cJSON_AddBoolToObject(a, "single_word", 0);
            cJSON_AddBoolToObject(a, "lstrip", 0);
            cJSON_AddBoolToObject(a, "rstrip", 0);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddBoolToObject(a, "special", 1);
            cJSON_AddItemToArray(added, a);
        }
        if (id < 259 || !(tok_score(l2, id) > -1e10f))
            continue;
        for (int k = 1; k < g_lens[id]; k++) {
            if (((unsigned char)g_pieces[id][k] & 0xC0) == 0x80)
                continue; /* split only between characters */
            if (lookup(g_pieces[id], (size_t)k) >= 259 &&
                lookup(g_pieces[id] + k, (size_t)(g_lens[id] - k)) >= 259) {
                BT_CHECK(n_ms < 400000);
                ms[n_ms++] = (merge_t){id, tok_score(l2, id), g_lens[id], k};
            }
        }
    }
    qsort(ms, (size_t)n_ms, sizeof(*ms), merge_cmp);
    for (int i = 0; i < n_ms; i++) {
        cJSON *pair = cJSON_CreateArray();
        char *a = sp_string(g_pieces[ms[i].id], ms[i].split);
        char *b = sp_string(g_pieces[ms[i].id] + ms[i].split,
                            g_lens[ms[i].id] - ms[i].split);
        cJSON_AddItemToArray(pair, cJSON_CreateString(a));
        cJSON_AddItemToArray(pair, cJSON_CreateString(b));
        cJSON_AddItemToArray(merges, pair);
        free(a);
        free(b);
    }
    fprintf(stderr, "llama2 tokenizer.json: %d merges\n", n_ms);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);

    cJSON_AddStringToObject(norm, "type", "Sequence");
    norms = cJSON_AddArrayToObject(norm, "normalizers");
    n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "Prepend");
    cJSON_AddStringToObject(n, "prepend", "\xe2\x96\x81");
    cJSON_AddItemToArray(norms, n);
    n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(n, "pattern"), "String",
                            " ");
    cJSON_AddStringToObject(n, "content", "\xe2\x96\x81");
    cJSON_AddItemToArray(norms, n);
    cJSON_AddNullToObject(root, "pre_tokenizer");

    dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "Sequence");
    decs = cJSON_AddArrayToObject(dec, "decoders");
    d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(d, "pattern"), "String",
                            "\xe2\x96\x81");
    cJSON_AddStringToObject(d, "content", " ");
    cJSON_AddItemToArray(decs, d);
    d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", "ByteFallback");
    cJSON_AddItemToArray(decs, d);
    d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", "Fuse");
    cJSON_AddItemToArray(decs, d);
    d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", "Strip");
    cJSON_AddStringToObject(d, "content", " ");
    cJSON_AddNumberToObject(d, "start", 1);
    cJSON_AddNumberToObject(d, "stop", 0);
    cJSON_AddItemToArray(decs, d);

    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    free(ms);
    free(g_hash);
    return text;
}

/* A mixed text with valid UTF-8 only and no special-token strings. */
static size_t gen_text(char *buf, size_t cap, int max_parts)
{
    size_t n = 0;
    int parts = 1 + (int)(tt_rand() % (uint32_t)max_parts);

    for (int p = 0; p < parts; p++) {
        const char *s;
        uint32_t r = tt_rand() % 10;
        if (r < 6)
            s = tt_words[tt_rand() % (sizeof(tt_words) / sizeof(tt_words[0]))];
        else if (r < 9)
            s = tt_multi[tt_rand() % (sizeof(tt_multi) / sizeof(tt_multi[0]))];
        else {
            static char one[2];
            one[0] = (char)(32 + tt_rand() % 95);
            s = one;
        }
        if (strstr(s, "<s>") != NULL || strstr(s, "</s>") != NULL)
            continue;
        if (n + strlen(s) + 1 >= cap)
            break;
        memcpy(buf + n, s, strlen(s));
        n += strlen(s);
    }
    buf[n] = '\0';
    return n;
}

int main(void)
{
    char dir[] = "/tmp/bt_hftok_l2_XXXXXX";
    char path[256];
    static char buf[1 << 17];
    tok_t *l2 = NULL, *hf = NULL;
    char *json;
    FILE *f;
    int mismatches = 0, total_ids = 0;
    double t_l2 = 0, t_hf = 0;

    BT_ASSERT_OK(tok_load_llama2c(BT_SHARED_DIR "/models/llama2-tokenizer.bin",
                                  VOCAB, &l2));
    json = build_json(l2);
    BT_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    f = fopen(path, "w");
    BT_CHECK(f != NULL);
    fputs(json, f);
    fclose(f);
    if (getenv("BT_HFTOK_DUMP") != NULL) { /* keep a copy (benchmarks) */
        FILE *d = fopen(getenv("BT_HFTOK_DUMP"), "w");
        BT_CHECK(d != NULL);
        fputs(json, d);
        fclose(d);
    }
    free(json);
    BT_ASSERT_OK(tok_load(dir, 0, &hf));
    BT_ASSERT_EQ(tok_vocab_size(hf), VOCAB);
    BT_ASSERT_EQ(tok_bos_id(hf), -1); /* no config: no BOS known */

    for (int iter = 0; iter < 20000; iter++) {
        /* the last few are long (tens of KB, merges across the text) */
        size_t n = gen_text(buf, sizeof(buf), iter < 19990 ? 24 : 20000);
        int *a = NULL, *b = NULL;
        int na = 0, nb = 0;
        char *dec = NULL;
        double t0 = bt_time_s();

        BT_ASSERT_OK(tok_encode(l2, buf, n, false, &a, &na));
        t_l2 += bt_time_s() - t0;
        t0 = bt_time_s();
        BT_ASSERT_OK(tok_encode(hf, buf, n, false, &b, &nb));
        t_hf += bt_time_s() - t0;
        total_ids += na;
        if (na != nb || memcmp(a, b, sizeof(int) * (size_t)na) != 0) {
            if (mismatches++ < 5) {
                fprintf(stderr, "MISMATCH on \"%.200s\":\n  llama2c:", buf);
                for (int i = 0; i < na; i++)
                    fprintf(stderr, " %d", a[i]);
                fprintf(stderr, "\n  json:   ");
                for (int i = 0; i < nb; i++)
                    fprintf(stderr, " %d", b[i]);
                fprintf(stderr, "\n");
            }
        }
        BT_ASSERT_OK(tok_decode(hf, -1, b, nb, &dec));
        if (strcmp(dec, buf) != 0)
            BT_TEST_FAIL("round trip: \"%s\" -> \"%s\"", buf, dec);
        bt_free(dec);
        bt_free(a);
        bt_free(b);
    }
    fprintf(stderr, "20000 texts, %d ids, %d mismatches; encode %.1f ms "
                    "(llama2.c) vs %.1f ms (tokenizer.json)\n",
            total_ids, mismatches, t_l2 * 1e3, t_hf * 1e3);
    BT_ASSERT_EQ(mismatches, 0);

    tok_destroy(&hf);
    tok_destroy(&l2);
    unlink(path);
    rmdir(dir);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("hftok_llama2");
    return 0;
}
