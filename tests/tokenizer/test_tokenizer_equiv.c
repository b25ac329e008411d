/*
 * test_tokenizer_equiv.c - tok_encode (heap over a linked list) gives the
 * same ids as a straight transcription of llama2.c run.c's quadratic
 * `encode`, kept below, on thousands of random and mixed strings with both
 * the 512-piece aidreams vocabulary and the 32000-piece Llama 2 one.
 *
 * The reference reads the tokenizer file with its own parser, looks pieces
 * up by bsearch over a sorted copy (run.c's str_lookup) and rescans every
 * adjacent pair after each merge.  Texts carry no NUL byte, since run.c's
 * encode stops at the first one.
 *
 * Run: build-tok/tests/tokenizer_test_tokenizer_equiv
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "tok_test_util.h"
#include "model/tokenizer.h"

// ----------------------------------------------------------------------------
// reference: llama2.c run.c encode, transcribed

typedef struct {
    char *str;
    int id;
} ref_index_t;

typedef struct {
    int vocab_size;
    unsigned int max_token_length;
    char **vocab;         /* (vocab_size) NUL-terminated pieces */
    float *vocab_scores;  /* (vocab_size) */
    ref_index_t *sorted;  /* (vocab_size) sorted by piece */
} ref_tok_t;

static int ref_compare_tokens(const void *a, const void *b)
{
    return strcmp(((const ref_index_t *)a)->str,
                  ((const ref_index_t *)b)->str);
}

static void ref_load(const char *path, int vocab_size, ref_tok_t *t)
{
    FILE *f = fopen(path, "rb");
    int len;

    BT_CHECK(f != NULL);
    t->vocab_size = vocab_size;
    t->vocab = malloc((size_t)vocab_size * sizeof(char *));
    t->vocab_scores = malloc((size_t)vocab_size * sizeof(float));
    BT_CHECK(fread(&t->max_token_length, sizeof(int), 1, f) == 1);
    for (int i = 0; i < vocab_size; i++) {
        BT_CHECK(fread(t->vocab_scores + i, sizeof(float), 1, f) == 1);
        BT_CHECK(fread(&len, sizeof(int), 1, f) == 1);
        t->vocab[i] = malloc((size_t)len + 1);
        /* run.c refuses an empty piece here; we load it (fuzz seed). */
        BT_CHECK(len == 0 || fread(t->vocab[i], (size_t)len, 1, f) == 1);
        t->vocab[i][len] = '\0';
    }
    fclose(f);
    t->sorted = malloc((size_t)vocab_size * sizeof(ref_index_t));
    for (int i = 0; i < vocab_size; i++) {
        t->sorted[i].str = t->vocab[i];
        t->sorted[i].id = i;
    }
    qsort(t->sorted, (size_t)vocab_size, sizeof(ref_index_t),
          ref_compare_tokens);
}

static void ref_free(ref_tok_t *t)
{
    for (int i = 0; i < t->vocab_size; i++)
        free(t->vocab[i]);
    free(t->vocab);
    free(t->vocab_scores);
    free(t->sorted);
}

static int ref_str_lookup(char *str, ref_index_t *sorted_vocab, int vocab_size)
{
    ref_index_t tok = {.str = str};
    ref_index_t *res = bsearch(&tok, sorted_vocab, (size_t)vocab_size,
                               sizeof(ref_index_t), ref_compare_tokens);
    int id;

    if (res == NULL)
        return -1;
    /* A piece listed twice (only the fuzz seed has one) makes run.c's pick
     * unspecified; tokenizer.c defines it as the lowest id. */
    id = res->id;
    for (ptrdiff_t k = res - sorted_vocab - 1;
         k >= 0 && !strcmp(sorted_vocab[k].str, str); k--)
        id = BT_MIN(id, sorted_vocab[k].id);
    for (ptrdiff_t k = res - sorted_vocab + 1;
         k < vocab_size && !strcmp(sorted_vocab[k].str, str); k++)
        id = BT_MIN(id, sorted_vocab[k].id);
    return id;
}

/* run.c encode(t, text, bos, eos=0, tokens, n_tokens), line for line. */
static void ref_encode(ref_tok_t *t, const char *text, int bos, int *tokens,
                       int *n_tokens)
{
    char *str_buffer = malloc((t->max_token_length * 2 + 1 + 2) *
                              sizeof(char));
    size_t str_len = 0;

    *n_tokens = 0;
    if (bos)
        tokens[(*n_tokens)++] = 1;
    if (text[0] != '\0') {
        int dummy_prefix = ref_str_lookup(" ", t->sorted, t->vocab_size);
        tokens[(*n_tokens)++] = dummy_prefix;
    }
    for (const char *c = text; *c != '\0'; c++) {
        if ((*c & 0xC0) != 0x80)
            str_len = 0;
        str_buffer[str_len++] = *c;
        str_buffer[str_len] = '\0';
        if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4)
            continue;
        int id = ref_str_lookup(str_buffer, t->sorted, t->vocab_size);
        if (id != -1) {
            tokens[(*n_tokens)++] = id;
        } else {
            for (size_t i = 0; i < str_len; i++)
                tokens[(*n_tokens)++] = (unsigned char)str_buffer[i] + 3;
        }
        str_len = 0;
    }
    while (1) {
        float best_score = -1e10;
        int best_id = -1;
        int best_idx = -1;

        for (int i = 0; i < (*n_tokens - 1); i++) {
            sprintf(str_buffer, "%s%s", t->vocab[tokens[i]],
                    t->vocab[tokens[i + 1]]);
            int id = ref_str_lookup(str_buffer, t->sorted, t->vocab_size);
            if (id != -1 && t->vocab_scores[id] > best_score) {
                best_score = t->vocab_scores[id];
                best_id = id;
                best_idx = i;
            }
        }
        if (best_idx == -1)
            break;
        tokens[best_idx] = best_id;
        for (int i = best_idx + 1; i < (*n_tokens - 1); i++)
            tokens[i] = tokens[i + 1];
        (*n_tokens)--;
    }
    free(str_buffer);
}

// ----------------------------------------------------------------------------
// comparison

static long g_merged_ids; /* ids compared, for the summary line */

static void compare_one(const tok_t *tok, ref_tok_t *ref, const char *text,
                        int bos)
{
    size_t len = strlen(text);
    int *ref_ids = malloc((len + 3) * sizeof(int));
    int n_ref = 0, n = 0;
    int *ids = NULL;

    ref_encode(ref, text, bos, ref_ids, &n_ref);
    BT_ASSERT_OK(tok_encode(tok, text, len, bos != 0, &ids, &n));
    if (n != n_ref || memcmp(ids, ref_ids, (size_t)n * sizeof(int)) != 0) {
        fprintf(stderr, "text (%zu bytes): \"", len);
        for (size_t i = 0; i < len && i < 200; i++)
            fprintf(stderr, (unsigned char)text[i] >= 32 &&
                            (unsigned char)text[i] < 127 ? "%c" : "\\x%02x",
                    (unsigned char)text[i]);
        fprintf(stderr, "\"\n");
        for (int i = 0; i < n || i < n_ref; i++)
            fprintf(stderr, "  [%d] got %d want %d\n", i,
                    i < n ? ids[i] : -9, i < n_ref ? ref_ids[i] : -9);
        BT_TEST_FAIL("tok_encode differs from run.c encode (vocab %d)",
                     tok_vocab_size(tok));
    }
    g_merged_ids += n;
    bt_free(ids);
    free(ref_ids);
}

static void run_vocab(const char *dir, const char *file, int vocab_size,
                      int n_short, int n_long)
{
    char path[1024];
    char buf[4096];
    ref_tok_t ref;
    tok_t *tok = NULL;
    double t0 = bt_time_s();
    static const char *const fixed[] = {
        "", " ", "  ", "a", "The river", "Echoes of", "I sense",
        "0.0000000. 0.0000000", "ininininin", "eseseseses", "\xe4\xb8\xad",
        "\xf0\x9f\x98\x80", "\x80", "\xff\xfe", "\xc3", "a\x80\x80\x80\x80" "b",
        "\xf0\x9f\x98\x80\x80\x80", "Hello, world! \xc3\xa9t\xc3\xa9",
        "                ", "\n\n\n\n", "\t\t x",
    };

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    ref_load(path, vocab_size, &ref);
    BT_ASSERT_OK(tok_load_llama2c(path, vocab_size, &tok));
    g_merged_ids = 0;

    for (size_t i = 0; i < TT_COUNT(fixed); i++) {
        compare_one(tok, &ref, fixed[i], 1);
        compare_one(tok, &ref, fixed[i], 0);
    }
    for (int i = 0; i < n_short; i++) {
        size_t target = tt_rand() % 300;
        tt_random_text(buf, sizeof(buf), target, i % 3 == 0);
        compare_one(tok, &ref, buf, (int)(i & 1));
    }
    for (int i = 0; i < n_long; i++) {
        size_t target = 1500 + tt_rand() % 1000;
        tt_random_text(buf, sizeof(buf), target, i % 2 == 0);
        compare_one(tok, &ref, buf, 1);
    }
    printf("equiv %s: %zu fixed + %d random + %d long texts, %ld ids "
           "identical to run.c encode (%.2f s)\n", file, TT_COUNT(fixed),
           n_short, n_long, g_merged_ids, bt_time_s() - t0);
    tok_destroy(&tok);
    ref_free(&ref);
}

int main(void)
{
    bt_log_init("test");
    run_vocab(BT_SHARED_DIR "/models", "aidreams-tok512.bin", 512, 3000, 6);
    run_vocab(BT_SHARED_DIR "/models", "llama2-tokenizer.bin", 32000, 1500,
              4);
    /* The fuzz seed: an empty piece, a NaN score, a score below -1e10,
     * tied scores, a look-alike "<0x41>" piece. */
    run_vocab(BT_SOURCE_DIR "/tests/fuzz/corpus/fuzz_tokenizer",
              "tok300.seed", 300, 2000, 4);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("tokenizer_equiv");
    return 0;
}
