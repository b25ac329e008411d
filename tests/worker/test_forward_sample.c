/*
 * test_forward_sample.c - sampling in the backend (issue 4).
 *
 * 1. sampler_sample_top (what the cuda backend samples from: the top K
 *    logits + the normalizer) against sampler_sample on the whole row:
 *    random rows (peaked, flat, coarse ties, vocab below K), every kind
 *    of sampler.  Two samplers with one seed walk in lockstep: where
 *    sampler_sample_top says it can, its token must equal the full
 *    path's; where it cannot, the stream must be untouched (the full
 *    row is then sampled, as the backend does).  The normalizer is
 *    summed here exactly as sampler_sample does, so tokens must match
 *    exactly; counts how often the candidates sufficed.
 * 2. backend_forward_sample on the cpu backend (aidreams260K): streams
 *    of greedy, seeded top-p / top-k / min-p / penalties sequences
 *    stepped together equal backend_forward + sampler_sample token for
 *    token; the split begin/end calls; rows without a sampler get their
 *    logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_test.h"
#include "model/model.h"
#include "sampler.h"

static uint64_t g_rng = 0x1234567ull;

static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / 16777216.0f;
}

typedef struct {
    float v;
    int id;
} cand_t;

static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;

    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* The device's answer, computed on the host: top k by (value desc, id
 * asc) and the sum in id order (as sampler_sample adds it). */
static int top_of(const float *row, int vocab, int K, float temp,
                  int *ids, float *vals, double *sum)
{
    cand_t *c = malloc(sizeof(*c) * (size_t)vocab);
    int k = K < vocab ? K : vocab;
    float mx = row[0];
    double s = 0.0;

    for (int i = 0; i < vocab; i++) {
        c[i].v = row[i];
        c[i].id = i;
        if (row[i] > mx)
            mx = row[i];
    }
    for (int i = 0; i < vocab; i++)
        s += expf((row[i] - mx) * (1.0f / temp));
    qsort(c, (size_t)vocab, sizeof(*c), cand_cmp);
    for (int i = 0; i < k; i++) {
        ids[i] = c[i].id;
        vals[i] = c[i].v;
    }
    *sum = s;
    free(c);
    return k;
}

static void fill_row(float *row, int vocab, int kind)
{
    for (int i = 0; i < vocab; i++) {
        float u = frand();
        switch (kind) {
        case 0: row[i] = 4.0f * u; break;                      /* flat */
        case 1: row[i] = 12.0f * u * u * u; break;             /* peaked */
        case 2: row[i] = (float)(int)(6.0f * u); break;        /* ties */
        default: row[i] = -20.0f + 30.0f * u * u * u * u; break;
        }
    }
}

static void params_of(int i, sampler_params_t *p)
{
    sampler_params_init(p);
    p->seed = 77 + (uint64_t)i;
    switch (i % 12) {
    case 0: break;
    case 1: p->temperature = 0.8f; p->top_p = 0.9f; break;
    case 2: p->temperature = 1.0f; p->top_k = 40; p->top_p = 0.95f; break;
    case 3: p->temperature = 1.0f; p->min_p = 0.05f; break;
    case 4: p->temperature = 0.7f; p->top_k = 1; break;
    case 5: p->temperature = 1.0f; break;
    case 6: p->temperature = 0.9f; p->top_k = 20; break;
    case 7: p->temperature = 0.8f; p->top_p = 0.9f;
            p->repetition_penalty = 1.3f; break;
    case 8: p->temperature = 1.5f; p->top_p = 0.99f; p->min_p = 0.01f;
            break;
    case 9: p->temperature = 0.5f; p->top_p = 0.5f; break;
    case 10: p->temperature = 1.2f; p->top_k = 300; p->top_p = 0.97f;
             break;
    default: p->temperature = 2.0f; p->min_p = 0.3f; p->top_k = 5; break;
    }
}

static void check_top(void)
{
    const int vocabs[] = {100, 256, 257, 1000, 5000};
    const int Ks[] = {16, 64, 256};
    long hits = 0, misses = 0, top_rows = 0;

    for (size_t vi = 0; vi < sizeof(vocabs) / sizeof(vocabs[0]); vi++) {
        int vocab = vocabs[vi];
        float *row = malloc(sizeof(float) * (size_t)vocab);
        float *copy = malloc(sizeof(float) * (size_t)vocab);
        int ids[256];
        float vals[256];
        for (int pi = 0; pi < 12; pi++) {
            for (size_t ki = 0; ki < sizeof(Ks) / sizeof(Ks[0]); ki++) {
                sampler_params_t p;
                sampler_t *a, *b;
                params_of(pi, &p);
                BT_ASSERT_OK(sampler_create(&p, vocab, &a));
                BT_ASSERT_OK(sampler_create(&p, vocab, &b));
                for (int it = 0; it < 200; it++) {
                    int ta, tb = -1, k;
                    double sum;
                    fill_row(row, vocab, it % 4);
                    memcpy(copy, row, sizeof(float) * (size_t)vocab);
                    ta = sampler_sample(a, row);
                    if (sampler_need(b) == SAMPLER_NEED_TOP) {
                        top_rows++;
                        k = top_of(copy, vocab, Ks[ki], p.temperature, ids,
                                   vals, &sum);
                        if (sampler_sample_top(b, ids, vals, k, sum, &tb))
                            hits++;
                        else
                            tb = -1, misses++;
                    } else {
                        BT_CHECK(!sampler_sample_top(b, ids, vals, 1, 1.0,
                                                     &tb) ||
                                 p.temperature == 0.0f);
                        tb = -1;
                    }
                    if (tb < 0)
                        tb = sampler_sample(b, copy);
                    if (ta != tb) {
                        BT_TEST_FAIL("vocab %d params %d K %d row %d: "
                                     "full %d, top %d", vocab, pi, Ks[ki],
                                     it, ta, tb);
                    }
                    sampler_observe(a, ta);
                    sampler_observe(b, tb);
                }
                /* the streams are still in lockstep */
                BT_ASSERT_EQ(sampler_uniform(a), sampler_uniform(b));
                sampler_destroy(&a);
                sampler_destroy(&b);
            }
        }
        free(row);
        free(copy);
    }
    fprintf(stderr, "sampler_sample_top: %ld of %ld candidate rows exact "
            "from the candidates, %ld needed the row\n", hits, top_rows,
            misses);
    BT_CHECK(hits > top_rows / 2);
    BT_CHECK(misses > 0); /* the fallback is exercised */
}

#define N_SEQ 12
#define PROMPT 7

static void run_streams(backend_t *be, int vocab, int steps, int mode,
                        int *out)
{
    const int len = PROMPT + steps + 1, bs = 8, nb = (len + bs - 1) / bs;
    sampler_t *sm[N_SEQ];
    backend_seq_t seqs[N_SEQ];
    int *tables = malloc(sizeof(int) * (size_t)N_SEQ * nb);
    float *logits = malloc(sizeof(float) * (size_t)N_SEQ * vocab);
    int ids[N_SEQ];

    for (int s = 0; s < N_SEQ; s++) {
        sampler_params_t p;
        params_of(s, &p);
        BT_ASSERT_OK(sampler_create(&p, vocab, &sm[s]));
        for (int i = 0; i < nb; i++)
            tables[s * nb + i] = s * nb + i;
        for (int i = 0; i < PROMPT; i++) {
            out[s * len + i] = 1 + (s * 37 + i * 11) % (vocab - 1);
            sampler_observe(sm[s], out[s * len + i]);
        }
    }
    for (int step = 0; step <= steps; step++) {
        backend_batch_t batch = {0};
        for (int s = 0; s < N_SEQ; s++) {
            backend_seq_t *q = &seqs[s];
            memset(q, 0, sizeof(*q));
            q->ctx_len = step == 0 ? 0 : PROMPT + step - 1;
            q->n_tokens = step == 0 ? PROMPT : 1;
            q->tokens = out + s * len + q->ctx_len;
            q->block_table = tables + s * nb;
            q->n_logits = 1;
        }
        batch.n_seqs = N_SEQ;
        batch.seqs = seqs;
        if (mode == 0) {
            BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
            for (int s = 0; s < N_SEQ; s++)
                ids[s] = sampler_sample(sm[s], logits + (size_t)s * vocab);
        } else if (mode == 1) {
            BT_ASSERT_OK(backend_forward_sample(be, &batch, sm, ids, NULL,
                                                NULL));
        } else {
            BT_ASSERT_OK(backend_forward_sample_begin(be, &batch, sm, ids,
                                                      logits, NULL));
            BT_ASSERT_OK(backend_forward_sample_end(be));
        }
        for (int s = 0; s < N_SEQ; s++) {
            out[s * len + PROMPT + step] = ids[s];
            sampler_observe(sm[s], ids[s]);
        }
    }
    for (int s = 0; s < N_SEQ; s++)
        sampler_destroy(&sm[s]);
    free(tables);
    free(logits);
}

static void check_backend(void)
{
    char path[1024];
    model_t *m = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    const int steps = 40, len = PROMPT + steps + 1;
    int vocab, *ref, *got;

    snprintf(path, sizeof(path), "%s/models/aidreams260K.bin",
             getenv("BT_SHARED_DIR") ? getenv("BT_SHARED_DIR")
                                     : BT_SHARED_DIR);
    BT_ASSERT_OK(model_load(path, &m));
    vocab = model_config(m)->vocab_size;
    backend_config_init(&cfg);
    cfg.n_kv_blocks = 256;
    cfg.block_size = 8;
    cfg.max_seqs = 16;
    cfg.n_threads = 2;
    BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
    ref = calloc((size_t)N_SEQ * len, sizeof(int));
    got = calloc((size_t)N_SEQ * len, sizeof(int));
    run_streams(be, vocab, steps, 0, ref);
    for (int mode = 1; mode <= 2; mode++) {
        run_streams(be, vocab, steps, mode, got);
        for (int i = 0; i < N_SEQ * len; i++)
            if (got[i] != ref[i])
                BT_TEST_FAIL("mode %d: seq %d token %d: %d != %d", mode,
                             i / len, i % len, got[i], ref[i]);
    }

    /* rows without a sampler: ids -1 and their logits */
    {
        int toks[5] = {1, 5, 9, 13, 17}, tab[2] = {200, 201}, ids[2];
        backend_seq_t q = {.n_tokens = 5, .tokens = toks,
                           .block_table = tab, .n_logits = 2};
        backend_batch_t batch = {.n_seqs = 1, .seqs = &q};
        float *a = malloc(sizeof(float) * 2 * (size_t)vocab);
        float *b = malloc(sizeof(float) * 2 * (size_t)vocab);
        sampler_params_t p;
        sampler_t *sm[2] = {NULL, NULL}, *sr = NULL;
        sampler_params_init(&p);
        BT_ASSERT_OK(sampler_create(&p, vocab, &sm[1]));
        BT_ASSERT_OK(sampler_create(&p, vocab, &sr));
        BT_ASSERT_OK(backend_forward(be, &batch, a, NULL));
        BT_ASSERT_OK(backend_forward_sample(be, &batch, sm, ids, b, NULL));
        BT_ASSERT_EQ(ids[0], -1);
        BT_ASSERT_EQ(ids[1], sampler_sample(sr, a + vocab));
        BT_CHECK(memcmp(a, b, sizeof(float) * (size_t)vocab) == 0);
        /* a malformed batch: an error from begin, nothing to end */
        toks[0] = vocab + 5;
        BT_CHECK(backend_forward_sample_begin(be, &batch, sm, ids, NULL,
                                              NULL) != BT_OK);
        sampler_destroy(&sm[1]);
        sampler_destroy(&sr);
        free(a);
        free(b);
    }
    free(ref);
    free(got);
    backend_destroy(&be);
    model_destroy(&m);
}

int main(void)
{
    check_top();
    check_backend();
    BT_TEST_PASS("forward_sample");
    return 0;
}
