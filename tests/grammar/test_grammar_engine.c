/*
 * test_grammar_engine.c - structured output through the engine with the
 * real aidreams260K model: every step samples under the grammar's mask,
 * the output ends with EOS once complete, and a sequence taken over
 * mid-stream (a decode-worker failover: a new sequence from the prompt
 * plus the tokens so far, the grammar replayed from the original prompt
 * end, the seeded stream skipped ahead) continues with exactly the same
 * tokens as the uninterrupted one, greedy and seeded.  Also: two
 * sequences stepped together with different grammars, the sampler mask
 * on its own, and refusals (tokens that do not fit on replay or commit).
 */
#include <cJSON.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "engine.h"
#include "grammar_test_util.h"

#define MODELS BT_SHARED_DIR "/models"
#define MAX_GEN 200

static const char *const specs[] = {
    "json_schema:{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
    "\"string\",\"maxLength\":16},\"n\":{\"type\":\"integer\"},\"ok\":"
    "{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":"
    "[\"a\",\"bb\"]},\"maxItems\":2}},\"required\":[\"name\",\"n\",\"ok\"]}",
    "choice:[\"of stars\",\"of the sea\",\"nothing\"]",
    "regex:(of|about) [a-z]+( [a-z]+){2,4}\\.",
};

static engine_t *make_engine(void)
{
    engine_config_t cfg;
    engine_t *e = NULL;

    engine_config_init(&cfg);
    cfg.model_path = MODELS "/aidreams260K.bin";
    cfg.tokenizer_path = MODELS "/aidreams-tok512.bin";
    cfg.device = "cpu";
    cfg.backend.n_threads = 1;
    cfg.backend.max_seqs = 4;
    BT_ASSERT_OK(engine_create(&cfg, &e));
    return e;
}

static void params(sampler_params_t *sp, bool seeded)
{
    sampler_params_init(sp);
    if (seeded) {
        sp->temperature = 0.9f;
        sp->top_p = 0.95f;
        sp->seed = 1234;
    }
}

/* Generates until EOS (id 1 for llama2.c models) or MAX_GEN tokens; when
 * kill_at >= 0, the sequence is dropped after kill_at tokens and a new
 * one takes over the way a decode worker does.  Returns the count. */
static int generate(engine_t *e, grammar_t *g, const int *prompt,
                    int n_prompt, bool seeded, int kill_at, int *out)
{
    sampler_params_t sp;
    engine_seq_t *seq = NULL;
    int n = 0, tok;

    params(&sp, seeded);
    BT_ASSERT_OK(engine_seq_create(e, prompt, n_prompt, &sp, &seq));
    BT_ASSERT_OK(engine_seq_set_grammar(e, seq, g, -1));
    while (n < MAX_GEN) {
        if (n == kill_at) {
            int *all = bt_malloc(sizeof(int) * (size_t)(n_prompt + n), "t");
            memcpy(all, prompt, sizeof(int) * (size_t)n_prompt);
            memcpy(all + n_prompt, out, sizeof(int) * (size_t)n);
            engine_seq_destroy(e, &seq);
            BT_ASSERT_OK(engine_seq_create(e, all, n_prompt + n, &sp, &seq));
            sampler_skip(engine_seq_sampler(seq), n);
            BT_ASSERT_OK(engine_seq_set_grammar(e, seq, g, n_prompt));
            bt_free(all);
        }
        BT_ASSERT_OK(engine_step(e, &seq, 1, 0, &tok));
        if (tok < 0)
            continue;
        out[n++] = tok;
        if (tok == 1)
            break;
    }
    engine_seq_destroy(e, &seq);
    return n;
}

static void test_failover(engine_t *e, const grammar_vocab_t *gv,
                          const int *prompt, int n_prompt)
{
    for (size_t s = 0; s < BT_ARRAY_SIZE(specs); s++) {
        for (int seeded = 0; seeded < 2; seeded++) {
            grammar_t *g = NULL, *g2 = NULL;
            int ref[MAX_GEN], got[MAX_GEN], n_ref, n_got;
            char *text = NULL;

            BT_ASSERT_OK(grammar_create_spec(specs[s], gv, &g));
            n_ref = generate(e, g, prompt, n_prompt, seeded, -1, ref);
            BT_CHECK(n_ref > 1 && ref[n_ref - 1] == 1); /* ended by EOS */
            BT_ASSERT_OK(tok_decode(engine_tokenizer(e), prompt[n_prompt - 1],
                                    ref, n_ref - 1, &text));
            printf("%s %.12s: %s\n", seeded ? "seeded" : "greedy", specs[s],
                   text);
            /* the text matches the grammar (bytes through a fresh one) */
            BT_ASSERT_OK(grammar_create_spec(specs[s], NULL, &g2));
            if (!gt_matches(g2, text))
                BT_TEST_FAIL("output '%s' does not match %s", text, specs[s]);
            grammar_destroy(&g2);
            if (s == 0) {
                cJSON *doc = cJSON_Parse(text);
                BT_CHECK(cJSON_IsObject(doc));
                BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(doc, "name")));
                BT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(doc, "n")));
                BT_CHECK(cJSON_IsBool(cJSON_GetObjectItem(doc, "ok")));
                cJSON_Delete(doc);
            }
            bt_free(text);
            /* a takeover at several points gives the same tokens */
            for (int kill = 1; kill < n_ref; kill += 1 + n_ref / 4) {
                n_got = generate(e, g, prompt, n_prompt, seeded, kill, got);
                BT_ASSERT_EQ(n_got, n_ref);
                BT_CHECK(memcmp(got, ref, sizeof(int) * (size_t)n_ref) == 0);
            }
            grammar_destroy(&g);
        }
    }
}

/* Two sequences in one step, each under its own grammar. */
static void test_batch(engine_t *e, const grammar_vocab_t *gv,
                       const int *prompt, int n_prompt)
{
    grammar_t *g[2] = { NULL, NULL };
    engine_seq_t *seqs[2] = { NULL, NULL };
    sampler_params_t sp;
    int ref[2][MAX_GEN], n_ref[2], got[2][MAX_GEN], n_got[2] = { 0, 0 };
    bool done[2] = { false, false };

    params(&sp, false);
    for (int i = 0; i < 2; i++) {
        BT_ASSERT_OK(grammar_create_spec(specs[i + 1], gv, &g[i]));
        n_ref[i] = generate(e, g[i], prompt, n_prompt, false, -1, ref[i]);
        BT_ASSERT_OK(engine_seq_create(e, prompt, n_prompt, &sp, &seqs[i]));
        BT_ASSERT_OK(engine_seq_set_grammar(e, seqs[i], g[i], -1));
    }
    while (!done[0] || !done[1]) {
        engine_seq_t *live[2];
        int idx[2], n = 0, tok[2];
        for (int i = 0; i < 2; i++)
            if (!done[i]) {
                idx[n] = i;
                live[n++] = seqs[i];
            }
        BT_ASSERT_OK(engine_step(e, live, n, 0, tok));
        for (int k = 0; k < n; k++) {
            int i = idx[k];
            if (tok[k] < 0)
                continue;
            got[i][n_got[i]++] = tok[k];
            done[i] = tok[k] == 1 || n_got[i] == MAX_GEN;
        }
    }
    for (int i = 0; i < 2; i++) {
        BT_ASSERT_EQ(n_got[i], n_ref[i]);
        BT_CHECK(memcmp(got[i], ref[i], sizeof(int) * (size_t)n_ref[i]) == 0);
        engine_seq_destroy(e, &seqs[i]);
        grammar_destroy(&g[i]);
    }
}

static void test_refusals(engine_t *e, const grammar_vocab_t *gv,
                          const int *prompt, int n_prompt)
{
    grammar_t *g = NULL;
    engine_seq_t *seq = NULL;
    sampler_params_t sp;
    int *bad;
    int yes[8], n_yes;

    params(&sp, false);
    BT_ASSERT_OK(grammar_create_spec("choice:[\"nothing\"]", gv, &g));
    /* a prompt whose "generated" part does not fit: replay refuses */
    bad = bt_malloc(sizeof(int) * (size_t)(n_prompt + 1), "t");
    memcpy(bad, prompt, sizeof(int) * (size_t)n_prompt);
    bad[n_prompt] = prompt[n_prompt - 1];
    BT_ASSERT_OK(engine_seq_create(e, bad, n_prompt + 1, &sp, &seq));
    BT_ASSERT_EQ(engine_seq_set_grammar(e, seq, g, n_prompt),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(engine_seq_set_grammar(e, seq, g, n_prompt + 5),
                 BT_ERR_INVALID_ARG);
    engine_seq_destroy(e, &seq);
    bt_free(bad);
    /* commit checks the grammar: all or nothing */
    BT_ASSERT_OK(engine_seq_create(e, prompt, n_prompt, &sp, &seq));
    BT_ASSERT_OK(engine_seq_set_grammar(e, seq, g, -1));
    BT_ASSERT_OK(tok_encode(engine_tokenizer(e), "x", 1, false, &bad,
                            &n_yes));
    BT_ASSERT_EQ(engine_seq_commit(e, seq, bad, n_yes, 0),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(engine_seq_len(seq), n_prompt);
    bt_free(bad);
    n_yes = generate(e, g, prompt, n_prompt, false, -1, yes);
    BT_CHECK(n_yes > 1 && n_yes <= 8);
    BT_CHECK(!engine_seq_grammar_final(seq));
    engine_seq_destroy(e, &seq);
    grammar_destroy(&g);
}

/* The sampler's mask alone: only allowed ids come out, greedy or not. */
static void test_sampler_mask(void)
{
    sampler_params_t sp;
    sampler_t *s = NULL;
    float logits[130];
    uint64_t mask[3] = { 0, 0, 0 };

    for (int seeded = 0; seeded < 2; seeded++) {
        params(&sp, seeded);
        BT_ASSERT_OK(sampler_create(&sp, 130, &s));
        mask[1] = 1ull << 3;  /* 67 */
        mask[2] = 1ull << 1;  /* 129 */
        sampler_set_mask(s, mask);
        BT_CHECK(!sampler_is_argmax(s));
        BT_ASSERT_EQ(sampler_need(s), SAMPLER_NEED_ROW);
        for (int r = 0; r < 50; r++) {
            int t;
            for (int i = 0; i < 130; i++)
                logits[i] = (float)((i * 7919 + r * 104729) % 1000) / 100.0f;
            logits[5] = 100.0f; /* the unmasked favourite */
            t = sampler_sample(s, logits);
            BT_CHECK(t == 67 || t == 129);
        }
        sampler_set_mask(s, NULL);
        for (int i = 0; i < 130; i++)
            logits[i] = 0.0f;
        logits[5] = 100.0f;
        BT_ASSERT_EQ(sampler_sample(s, logits), 5);
        sampler_destroy(&s);
    }
}

int main(void)
{
    engine_t *e;
    const grammar_vocab_t *gv;
    int *prompt = NULL, n_prompt = 0;

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* refusals are asserted */
    test_sampler_mask();
    e = make_engine();
    BT_ASSERT_OK(engine_grammar_vocab(e, &gv));
    BT_ASSERT_OK(tok_encode(engine_tokenizer(e), "I dream", 7, true, &prompt,
                            &n_prompt));
    test_failover(e, gv, prompt, n_prompt);
    test_batch(e, gv, prompt, n_prompt);
    test_refusals(e, gv, prompt, n_prompt);
    bt_free(prompt);
    engine_destroy(&e);
    BT_ASSERT_EQ(bt_alloc_live_bytes(), 0);
    printf("ok\n");
    return 0;
}
