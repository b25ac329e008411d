/*
 * test_grammar_mask.c - token masks on real vocabularies: the Llama 2
 * 32000-piece sentencepiece vocabulary, the aidreams 512-piece one, and a
 * byte-level BPE tokenizer.json built from the Llama 2 pieces (the
 * GPT-2 byte mapping, decoded by tokenizer_json.c).
 *
 * For several grammars and many states along random constrained walks,
 * each mask is checked against brute force (feed every token's bytes; EOS
 * iff accepting), replay of the walk's tokens must equal the incremental
 * state, and a disallowed token must be refused.  Prints the cost of a
 * mask: cold (a state's first mask, the trie walk) and warm (cached).
 */
#include <cJSON.h>
#include <stdint.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "grammar_test_util.h"
#include "hftok/hftok_fixture.h"
#include "model/tokenizer.h"

#define MODELS BT_SHARED_DIR "/models"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static const char *const specs[] = {
    "json_object:",
    "json_schema:{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
    "\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\"},\"pets\":"
    "{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\"]},"
    "\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\","
    "\"age\"]}",
    "regex:(Once upon a time|One day), [a-z ]{1,40}\\.",
    "choice:[\"positive\",\"negative\",\"neutral\"]",
};

/* A byte-level tokenizer.json holding the 256 byte tokens, then every
 * Llama 2 piece (sentencepiece's space as a space), then <|eot|>. */
static tok_t *make_bytelevel(const tok_t *l2, int *eos_p)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *a;
    char piece[256], mapped[1024];
    int id = 256;
    char *text;
    tok_t *tok = NULL;

    hf_add_byte_vocab(vocab);
    cJSON_AddArrayToObject(model, "merges");
    for (int t = 259; t < tok_vocab_size(l2); t++) {
        const char *p = tok_piece(l2, t);
        size_t n = 0;
        for (size_t i = 0; p[i] != '\0' && n + 1 < sizeof(piece); i++) {
            if (strncmp(p + i, SP, 3) == 0) {
                piece[n++] = ' ';
                i += 2;
            } else {
                piece[n++] = p[i];
            }
        }
        piece[n] = '\0';
        if (n < 2)
            continue;
        hf_map_str(piece, mapped);
        if (cJSON_GetObjectItemCaseSensitive(vocab, mapped) == NULL)
            cJSON_AddNumberToObject(vocab, mapped, id++);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "unk_token");
    a = hf_added_tok(id, "<|eot|>", true, false);
    cJSON_AddItemToArray(added, a);
    *eos_p = id;
    cJSON_AddNullToObject(root, "normalizer");
    hf_add_llama3_pre(root);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type",
                            "ByteLevel");
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    BT_ASSERT_OK(tok_load_json_mem(text, strlen(text), NULL, 0, &tok));
    free(text);
    return tok;
}

/* The mask by brute force: every token's bytes fed from st. */
static void brute_mask(grammar_t *g, const tok_t *tok, int vocab,
                       const int *eos, int n_eos, grammar_state_t st,
                       uint64_t *mask)
{
    memset(mask, 0, sizeof(uint64_t) * (size_t)((vocab + 63) / 64));
    for (int t = 0; t < vocab; t++) {
        const char *s;
        size_t n;
        char byte;
        bool is_eos = false, ok;
        grammar_state_t x = st;

        for (int k = 0; k < n_eos; k++)
            is_eos = is_eos || eos[k] == t;
        if (is_eos)
            ok = grammar_is_accepting(g, st);
        else
            ok = !tok_is_special(tok, t) &&
                 tok_id_bytes_mid(tok, t, &s, &n, &byte) && n > 0 &&
                 grammar_advance_bytes(g, &x, s, n);
        if (ok)
            mask[t / 64] |= 1ull << (t % 64);
    }
}

static int pick_allowed(const uint64_t *mask, int vocab)
{
    int n = 0, k;

    for (int t = 0; t < vocab; t++)
        n += (int)(mask[t / 64] >> (t % 64) & 1);
    BT_CHECK(n > 0);
    k = (int)(rnd() % (uint32_t)n);
    for (int t = 0; t < vocab; t++)
        if ((mask[t / 64] >> (t % 64) & 1) && k-- == 0)
            return t;
    return -1;
}

static void check_vocab(const char *name, const tok_t *tok, const int *eos,
                        int n_eos, int walks)
{
    int vocab = tok_vocab_size(tok);
    grammar_vocab_t *gv = NULL;
    size_t words;
    uint64_t *mask, *want;
    int *toks;
    uint64_t t0;

    t0 = bt_time_ns();
    BT_ASSERT_OK(grammar_vocab_create(tok, vocab, eos, n_eos, &gv));
    printf("%s: vocab:%d vocab_build_ms:%.2f\n", name, vocab,
           (double)(bt_time_ns() - t0) * 1e-6);
    words = grammar_mask_words(gv);
    mask = bt_malloc(words * 8, "test");
    want = bt_malloc(words * 8, "test");
    toks = bt_malloc(sizeof(int) * 256, "test");
    for (size_t s = 0; s < BT_ARRAY_SIZE(specs); s++) {
        grammar_t *g = NULL;
        double cold_ns = 0, warm_ns = 0;
        int n_cold = 0, n_warm = 0, finished = 0;
        uint64_t computed, served;

        BT_ASSERT_OK(grammar_create_spec(specs[s], gv, &g));
        for (int w = 0; w < walks; w++) {
            grammar_state_t st = grammar_start(g), replayed;
            int n = 0;

            while (n < 200) {
                uint64_t before, a, b;
                int t;
                bool eos_tok = false;

                grammar_mask_stats(g, &before, &served);
                a = bt_time_ns();
                BT_ASSERT_OK(grammar_mask(g, st, mask));
                b = bt_time_ns();
                grammar_mask_stats(g, &computed, &served);
                if (computed > before) {
                    cold_ns += (double)(b - a);
                    n_cold++;
                    /* every new state: brute force agrees */
                    brute_mask(g, tok, vocab, eos, n_eos, st, want);
                    if (memcmp(mask, want, words * 8) != 0)
                        for (int k = 0; k < vocab; k++)
                            if ((mask[k / 64] ^ want[k / 64]) >> (k % 64) & 1)
                                BT_TEST_FAIL("%s %s: token %d '%s' mask %d "
                                             "brute %d", name, specs[s], k,
                                             tok_piece(tok, k),
                                             (int)(mask[k / 64] >> (k % 64) &
                                                   1),
                                             (int)(want[k / 64] >> (k % 64) &
                                                   1));
                } else {
                    warm_ns += (double)(b - a);
                    n_warm++;
                }
                t = pick_allowed(mask, vocab);
                for (int k = 0; k < n_eos; k++)
                    eos_tok = eos_tok || eos[k] == t;
                if (eos_tok) {
                    BT_CHECK(grammar_is_accepting(g, st));
                    finished++;
                    break;
                }
                BT_ASSERT_OK(grammar_advance_token(g, &st, t));
                toks[n++] = t;
            }
            /* replay gives the incremental state */
            BT_ASSERT_OK(grammar_replay(g, toks, n, &replayed));
            BT_CHECK(grammar_state_eq(replayed, st));
            /* a token outside the mask is refused, state unchanged */
            for (int t = 0; t < vocab; t++) {
                if (!(mask[t / 64] >> (t % 64) & 1)) {
                    grammar_state_t keep = st;
                    BT_ASSERT_EQ(grammar_advance_token(g, &st, t),
                                 BT_ERR_INVALID_ARG);
                    BT_CHECK(grammar_state_eq(keep, st));
                    break;
                }
            }
        }
        printf("%s %.40s: walks:%d finished:%d states:%d "
               "mask_cold_us:%.1f mask_warm_us:%.2f\n",
               name, specs[s], walks, finished, n_cold,
               n_cold ? cold_ns / n_cold * 1e-3 : 0.0,
               n_warm ? warm_ns / n_warm * 1e-3 : 0.0);
        BT_CHECK(finished > 0);
        grammar_destroy(&g);
    }
    bt_free(mask);
    bt_free(want);
    bt_free(toks);
    grammar_vocab_destroy(&gv);
}

int main(void)
{
    tok_t *l2 = NULL, *ai = NULL, *bl = NULL;
    int eos_l2[] = { 2 }, eos_ai[] = { 2 }, eos_bl[1];

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* refusals are asserted */
    BT_ASSERT_OK(tok_load_llama2c(MODELS "/llama2-tokenizer.bin", 32000, &l2));
    BT_ASSERT_OK(tok_load_llama2c(MODELS "/aidreams-tok512.bin", 512, &ai));
    bl = make_bytelevel(l2, &eos_bl[0]);
    check_vocab("aidreams512", ai, eos_ai, 1, 12);
    check_vocab("llama2-32k", l2, eos_l2, 1, 6);
    check_vocab("bytelevel-json", bl, eos_bl, 1, 4);
    tok_destroy(&l2);
    tok_destroy(&ai);
    tok_destroy(&bl);
    BT_ASSERT_EQ(bt_alloc_live_bytes(), 0);
    printf("ok\n");
    return 0;
}
