/*
 * bt_golden.h - golden.jsonl for tests: the llama2.c reference outputs in
 * ../shared/models (one JSON object a line: model, prompt_ids, steps,
 * greedy_ids).  Header-only (static functions), like bt_test.h, so every
 * test binary (CPU tests in CI, GPU tests on the device) reads it the same
 * way.  Malformed lines fail the test (BT_CHECK).
 */
#ifndef BT_TESTS_BT_GOLDEN_H
#define BT_TESTS_BT_GOLDEN_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"

#define BT_GOLDEN_MAX 64 /* lines read at most */

typedef struct {
    char model[128]; /* e.g. "stories260K.bin" */
    int *prompt;     /* (n_prompt) prompt ids */
    int n_prompt;
    int *want;       /* (n_want) greedy ids llama2.c generated */
    int n_want;
    int steps;       /* run.c's -n: prompt + generated positions */
} bt_golden_t;

/* The folder holding models/: $BT_SHARED_DIR wins over the build-time
 * BT_SHARED_DIR (the device machine gets the models in a carried
 * folder). */
static inline const char *bt_golden_shared_dir(void)
{
    const char *env = getenv("BT_SHARED_DIR");
    return env && *env ? env : BT_SHARED_DIR;
}

static inline int *bt_golden__ints(const cJSON *arr, int *n_p)
{
    int n = cJSON_GetArraySize(arr);
    int *v = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));

    BT_CHECK(v != NULL);
    for (int i = 0; i < n; i++)
        v[i] = cJSON_GetArrayItem(arr, i)->valueint;
    *n_p = n;
    return v;
}

/* Reads every line (at most BT_GOLDEN_MAX) into *g_p; returns the count.
 * Free with bt_golden_free. */
static inline int bt_golden_read(bt_golden_t **g_p)
{
    char path[512], *text, *line, *save = NULL;
    size_t len;
    int n = 0;
    bt_golden_t *g = calloc(BT_GOLDEN_MAX, sizeof(*g));

    BT_CHECK(g != NULL);
    snprintf(path, sizeof(path), "%s/models/golden.jsonl",
             bt_golden_shared_dir());
    BT_ASSERT_OK(bt_read_file(path, 1 << 24, &text, &len));
    for (line = strtok_r(text, "\n", &save); line && n < BT_GOLDEN_MAX;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);

        BT_CHECK(j != NULL);
        snprintf(g[n].model, sizeof(g[n].model), "%s",
                 cJSON_GetObjectItem(j, "model")->valuestring);
        g[n].steps = cJSON_GetObjectItem(j, "steps")->valueint;
        g[n].prompt = bt_golden__ints(cJSON_GetObjectItem(j, "prompt_ids"),
                                      &g[n].n_prompt);
        g[n].want = bt_golden__ints(cJSON_GetObjectItem(j, "greedy_ids"),
                                    &g[n].n_want);
        cJSON_Delete(j);
        n++;
    }
    bt_free(text);
    *g_p = g;
    return n;
}

static inline void bt_golden_free(bt_golden_t *g, int n)
{
    for (int i = 0; i < n; i++) {
        free(g[i].prompt);
        free(g[i].want);
    }
    free(g);
}

/* Index of the largest of v[0..n), the first one on ties. */
static inline int bt_argmax(const float *v, int n)
{
    int best = 0;

    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* The pool block holding a teacher-forced sequence's block i: scattered,
 * never adjacent (n_blocks a power of two, so 37 is invertible). */
static inline int bt_golden_block(int i, int n_blocks)
{
    return (i * 37) % n_blocks;
}

/* Teacher-forced top-1: the argmax of every position of ids (n), the
 * sequence fed in chunks of `chunk` tokens (1 = decode steps), its KV in
 * blocks bt_golden_block(i, n_blocks). */
static inline void bt_golden_teacher_argmax(backend_t *be, int vocab,
                                            const int *ids, int n, int chunk,
                                            int n_blocks, int *out)
{
    int *table = malloc(sizeof(int) * (size_t)n_blocks);
    float *logits = malloc(sizeof(float) * (size_t)vocab * n);

    BT_CHECK(table != NULL && logits != NULL);
    for (int i = 0; i < n_blocks; i++)
        table[i] = bt_golden_block(i, n_blocks);
    for (int s = 0; s < n; s += chunk) {
        int c = BT_MIN(chunk, n - s);
        backend_seq_t seq = { .n_tokens = c, .ctx_len = s, .tokens = ids + s,
                              .block_table = table, .n_logits = c };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

        BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
        for (int i = 0; i < c; i++)
            out[s + i] = bt_argmax(logits + (size_t)i * vocab, vocab);
    }
    free(logits);
    free(table);
}

/* Greedy generation as llama2.c's run.c does it: tokens[0..n) fed as one
 * chunk after the first ctx (their KV already in table), then one token
 * a step until `steps` positions or EOS (id 1).  Writes the generated
 * ids to out and returns how many; first_logits (or NULL) gets the
 * logits of the chunk's last token. */
static inline int bt_golden_greedy(backend_t *be, int vocab,
                                   const int *tokens, int n, int ctx,
                                   int steps, const int *table, int *out,
                                   float *first_logits)
{
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    backend_seq_t seq = { .n_tokens = n - ctx, .ctx_len = ctx,
                          .tokens = tokens + ctx, .block_table = table,
                          .n_logits = 1 };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
    int pos = n - 1, n_out = 0;

    BT_CHECK(logits != NULL);
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    if (first_logits != NULL)
        memcpy(first_logits, logits, sizeof(float) * (size_t)vocab);
    for (;;) {
        int next = bt_argmax(logits, vocab);

        pos++;
        if (next == 1)
            break;
        out[n_out++] = next;
        if (pos >= steps)
            break;
        seq = (backend_seq_t){ .n_tokens = 1, .ctx_len = pos,
                               .tokens = &out[n_out - 1],
                               .block_table = table, .n_logits = 1 };
        BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    }
    free(logits);
    return n_out;
}

/* Block i of a table holding n_blocks in reverse order (any block order
 * must do). */
static inline void bt_golden_reversed(int *table, int n_blocks)
{
    for (int i = 0; i < n_blocks; i++)
        table[i] = n_blocks - 1 - i;
}

#endif /* BT_TESTS_BT_GOLDEN_H */
