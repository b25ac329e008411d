/*
 * test_intake.c - the prefill intake baton-prefill and decode --role both
 * share (workerproc/workerproc_intake.h): prompt ids, text through the
 * null model's stand-in tokenizer and through a real tokenizer
 * (aidreams260K), every refusal with its error code (empty, outside the
 * vocabulary, not inside the context, over the reservation, no
 * tokenizer), the resumed tail, the first token's sampler (same stream as
 * a sampler built by hand) and its text.
 */
#include <string.h>

#include "bt_test.h"
#include "engine.h"
#include "workerproc_intake.h"

static Baton__PrefillTask task_ids(int32_t *ids, size_t n)
{
    Baton__PrefillTask m = BATON__PREFILL_TASK__INIT;

    m.n_prompt_ids = n;
    m.prompt_ids = ids;
    return m;
}

static void refused(const workerproc_intake_t *in, Baton__PrefillTask *m,
                    Baton__ErrorCode want, const char *part)
{
    workerproc_prompt_t p;
    Baton__ErrorCode code;
    char err[256];

    BT_CHECK(workerproc_intake_prompt(in, m, &p, &code, err, sizeof(err)) !=
             BT_OK);
    BT_ASSERT_EQ(code, want);
    if (strstr(err, part) == NULL)
        BT_TEST_FAIL("\"%s\" lacks \"%s\"", err, part);
    BT_CHECK(p.tokens == NULL);
}

int main(void)
{
    workerproc_intake_t in = { .engine = NULL, .vocab = 300,
                               .max_context = 8 };
    workerproc_prompt_t p;
    Baton__ErrorCode code;
    char err[256];
    int32_t ids[10] = { 1, 5, 7, 299, 4, 4, 4, 4, 4, 4 };
    Baton__PrefillTask m;

    /* ids, with a resumed tail */
    m = task_ids(ids, 4);
    m.has_n_generated = 1;
    m.n_generated = 1;
    BT_ASSERT_OK(workerproc_intake_prompt(&in, &m, &p, &code, err,
                                          sizeof(err)));
    BT_ASSERT_EQ(p.n_tokens, 4);
    BT_ASSERT_EQ(p.tokens[3], 299);
    BT_ASSERT_EQ(p.n_resumed, 1);
    BT_ASSERT_EQ(workerproc_intake_first_text(NULL, &p, 5, true, err, 8), 0);
    workerproc_prompt_cleanup(&p);
    workerproc_prompt_cleanup(&p); /* idempotent */

    /* the null model's stand-in tokenizer: BOS, then 3 + byte */
    m = (Baton__PrefillTask)BATON__PREFILL_TASK__INIT;
    m.has_prompt_text = 1;
    m.prompt_text.data = (uint8_t *)"ab";
    m.prompt_text.len = 2;
    BT_ASSERT_OK(workerproc_intake_prompt(&in, &m, &p, &code, err,
                                          sizeof(err)));
    BT_ASSERT_EQ(p.n_tokens, 3);
    BT_ASSERT_EQ(p.tokens[0], 1);
    BT_ASSERT_EQ(p.tokens[1], 3 + 'a');
    workerproc_prompt_cleanup(&p);

    /* refusals */
    m = (Baton__PrefillTask)BATON__PREFILL_TASK__INIT;
    refused(&in, &m, BATON__ERROR_CODE__ERROR_INVALID, "empty prompt");
    ids[2] = 300;
    m = task_ids(ids, 3);
    refused(&in, &m, BATON__ERROR_CODE__ERROR_INVALID, "outside the "
            "vocabulary");
    ids[2] = -1;
    refused(&in, &m, BATON__ERROR_CODE__ERROR_INVALID, "prompt id -1 at 2");
    ids[2] = 7;
    m = task_ids(ids, 8);
    refused(&in, &m, BATON__ERROR_CODE__ERROR_TOO_LONG, "context (8)");
    in.reserved_tokens = 4;
    m = task_ids(ids, 5);
    refused(&in, &m, BATON__ERROR_CODE__ERROR_TOO_LONG, "reservation");
    m = task_ids(ids, 4);
    BT_ASSERT_OK(workerproc_intake_prompt(&in, &m, &p, &code, err,
                                          sizeof(err)));
    workerproc_prompt_cleanup(&p);

    /* a real model: its tokenizer, the sampler, the first text */
    {
        engine_config_t ec;
        engine_t *e = NULL;
        sampler_params_t sp;
        sampler_t *a = NULL, *b = NULL;
        float logits[512];
        size_t len;

        engine_config_init(&ec);
        ec.model_path = BT_SHARED_DIR "/models/aidreams260K.bin";
        ec.tokenizer_path = BT_SHARED_DIR "/models/aidreams-tok512.bin";
        ec.backend.n_threads = 1;
        ec.backend.n_kv_blocks = 16;
        BT_ASSERT_OK(engine_create(&ec, &e));
        in = (workerproc_intake_t){ .engine = e, .vocab = 512,
                                    .max_context = 256 };
        m = (Baton__PrefillTask)BATON__PREFILL_TASK__INIT;
        m.has_prompt_text = 1;
        m.prompt_text.data = (uint8_t *)"Once upon a time";
        m.prompt_text.len = strlen("Once upon a time");
        m.add_bos = 1;
        m.has_n_generated = 1;
        m.n_generated = 2;
        BT_ASSERT_OK(workerproc_intake_prompt(&in, &m, &p, &code, err,
                                              sizeof(err)));
        BT_CHECK(p.n_tokens > 2);
        BT_ASSERT_EQ(p.tokens[0], 1);
        /* the same stream as a sampler that observed the prompt and
         * skipped the resumed draws by hand */
        sampler_params_init(&sp);
        sp.temperature = 1.0f;
        sp.seed = 42;
        BT_ASSERT_OK(workerproc_intake_sampler(&sp, 512, &p, &a));
        BT_ASSERT_OK(sampler_create(&sp, 512, &b));
        for (int i = 0; i < p.n_tokens; i++)
            sampler_observe(b, p.tokens[i]);
        sampler_skip(b, 2);
        for (int i = 0; i < 512; i++)
            logits[i] = (float)((i * 37) % 11) * 0.3f;
        BT_ASSERT_EQ(sampler_sample(a, logits), sampler_sample(b, logits));
        sampler_destroy(&a);
        sampler_destroy(&b);
        len = workerproc_intake_first_text(e, &p, p.tokens[1], true, err,
                                           sizeof(err));
        BT_CHECK(len > 0);
        workerproc_prompt_cleanup(&p);
        engine_destroy(&e);
    }
    BT_TEST_PASS("workerproc/intake: ids, text, refusals, sampler, text");
    return 0;
}
