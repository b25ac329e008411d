/* spec_test_util.h - the test engine, golden.jsonl reading and
 * speculative generation helpers shared by the tests in tests/spec/. */
#ifndef BT_TESTS_SPEC_TEST_UTIL_H
#define BT_TESTS_SPEC_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"
#include "engine.h"
#include "spec/spec.h"

#define GOLDEN_MAX 16

/* A cpu engine over stories260K with 8-token KV blocks and one thread,
 * `n_kv_blocks` in its pool (the unit tests' engine). */
static inline engine_t *spec_test_cpu_engine(int n_kv_blocks)
{
    engine_config_t ecfg;
    engine_t *engine = NULL;

    engine_config_init(&ecfg);
    ecfg.model_path = BT_SHARED_DIR "/models/stories260K.bin";
    ecfg.device = "cpu";
    ecfg.backend.block_size = 8;
    ecfg.backend.n_kv_blocks = n_kv_blocks;
    ecfg.backend.n_threads = 1;
    BT_ASSERT_OK(engine_create(&ecfg, &engine));
    return engine;
}

typedef struct {
    char model[64];   /* "aidreams260K.bin" */
    int prompt[256];  /* prompt ids */
    int n_prompt;
    int want[600];    /* greedy ids */
    int n_want;
    int steps;
} golden_t;

/* Reads every golden line; returns the count. */
static inline int golden_read(golden_t *g, int cap)
{
    char *text, *line, *save = NULL;
    size_t len;
    int n = 0;

    BT_ASSERT_OK(bt_read_file(BT_SHARED_DIR "/models/golden.jsonl", 1 << 24,
                              &text, &len));
    for (line = strtok_r(text, "\n", &save); line != NULL && n < cap;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line), *a;
        golden_t *e = &g[n++];

        BT_CHECK(j != NULL);
        snprintf(e->model, sizeof(e->model), "%s",
                 cJSON_GetObjectItem(j, "model")->valuestring);
        e->steps = cJSON_GetObjectItem(j, "steps")->valueint;
        a = cJSON_GetObjectItem(j, "prompt_ids");
        e->n_prompt = cJSON_GetArraySize(a);
        BT_CHECK(e->n_prompt <= 256);
        for (int i = 0; i < e->n_prompt; i++)
            e->prompt[i] = cJSON_GetArrayItem(a, i)->valueint;
        a = cJSON_GetObjectItem(j, "greedy_ids");
        e->n_want = cJSON_GetArraySize(a);
        BT_CHECK(e->n_want <= 600);
        for (int i = 0; i < e->n_want; i++)
            e->want[i] = cJSON_GetArrayItem(a, i)->valueint;
        cJSON_Delete(j);
    }
    bt_free(text);
    return n;
}

/* llama2.c golden semantics: stop at id 1 or after steps positions. */
static inline int golden_limit(const golden_t *g)
{
    return g->steps - g->n_prompt + 1;
}

/* Greedy speculative generation of one golden line; returns ids count. */
static inline int spec_generate(spec_t *spec, engine_t *engine,
                                const golden_t *g, int *got)
{
    sampler_params_t sp;
    engine_seq_t *seq = NULL;
    spec_seq_t *ss = NULL;
    int n = 0;

    sampler_params_init(&sp);
    BT_ASSERT_OK(engine_seq_create(engine, g->prompt, g->n_prompt, &sp,
                                   &seq));
    BT_ASSERT_OK(spec_seq_create(spec, seq, &ss));
    while (n < golden_limit(g)) {
        int tok;

        BT_ASSERT_OK(spec_seq_next(spec, ss, &tok));
        if (tok == 1)
            break;
        got[n++] = tok;
    }
    spec_seq_destroy(&ss);
    engine_seq_destroy(engine, &seq);
    return n;
}

static inline void golden_check(const golden_t *g, const int *got, int n_got,
                         const char *what)
{
    for (int i = 0; i < g->n_want && i < n_got; i++)
        if (got[i] != g->want[i])
            BT_TEST_FAIL("%s %s: id %d is %d, golden %d", what, g->model, i,
                         got[i], g->want[i]);
    if (n_got != g->n_want)
        BT_TEST_FAIL("%s %s: %d ids, golden %d", what, g->model, n_got,
                     g->n_want);
}

#endif /* BT_TESTS_SPEC_TEST_UTIL_H */
