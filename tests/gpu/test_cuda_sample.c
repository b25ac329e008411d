/*
 * test_cuda_sample.c - device sampling (backend_forward_sample) on the
 * cuda backend against the full-logits path (backend_forward + the host
 * sampler), on aidreams260K and stories260K, bf16 and f32.
 *
 * 12 sequences with different samplers (greedy, top-p, top-k + top-p,
 * min-p, top-k 1, plain temperature, top-k alone, penalties) step
 * together: a prompt chunk each, then decode steps (graph replays).  The
 * same steps run twice over the same KV blocks: once with logits rows to
 * the host and sampler_sample, once with backend_forward_sample.  Every
 * stream must match token for token (the contract in backend.h allows a
 * draw within float rounding of a boundary to differ: it is reported as
 * a FAIL here too, as it should be vanishingly rare).  Also: a mixed
 * step (prompt rows compacted, no graph), rows without a sampler whose
 * logits are asked for, and the split begin/end calls.  Runs with
 * BT_SAMPLE_DIST=0 (the exact paths; test_sample_dist checks the
 * device whole-row sampler's contract).  Prints the
 * device sampling counters (argmax / top / top_miss / row).
 * Run: build/gpu/test_cuda_sample [steps]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_test.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_switches.h"
#include "sampler.h"

#define N_SEQ 12
#define PROMPT 9

static int g_fail;

static const char *shared_dir(void)
{
    const char *env = getenv("BT_SHARED_DIR");
    return env && *env ? env : BT_SHARED_DIR;
}

static void params_of(int i, sampler_params_t *p)
{
    sampler_params_init(p);
    p->seed = 1000 + (uint64_t)i;
    switch (i) {
    case 0: break;                                          /* greedy */
    case 1: p->temperature = 0.8f; p->top_p = 0.9f; break;
    case 2: p->temperature = 1.0f; p->top_k = 40; p->top_p = 0.95f; break;
    case 3: p->temperature = 1.0f; p->min_p = 0.05f; break;
    case 4: p->temperature = 0.7f; p->top_k = 1; break;
    case 5: p->temperature = 1.0f; break;                   /* row */
    case 6: p->temperature = 0.9f; p->top_k = 20; break;    /* row */
    case 7: p->temperature = 0.8f; p->top_p = 0.9f;
            p->repetition_penalty = 1.3f; break;            /* row */
    case 8: p->presence_penalty = 0.5f; break;              /* greedy row */
    case 9: p->temperature = 1.5f; p->top_p = 0.99f; p->min_p = 0.01f;
            break;
    case 10: p->temperature = 0.5f; p->top_p = 0.5f; break;
    default: p->temperature = 1.2f; p->top_k = 300; p->top_p = 0.97f;
             break;
    }
}

/* Runs all sequences for `steps` decode steps; device = use
 * backend_forward_sample.  out: (N_SEQ, PROMPT + steps + 1) tokens. */
static void run_streams(backend_t *be, int vocab, int steps, bool device,
                        int *out)
{
    const int len = PROMPT + steps + 1, bs = 8;
    const int nb = (len + bs - 1) / bs;
    sampler_t *sm[N_SEQ];
    backend_seq_t seqs[N_SEQ];
    backend_batch_t batch;
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
        for (int s = 0; s < N_SEQ; s++) {
            backend_seq_t *q = &seqs[s];
            memset(q, 0, sizeof(*q));
            q->ctx_len = step == 0 ? 0 : PROMPT + step - 1;
            q->n_tokens = step == 0 ? PROMPT : 1;
            q->tokens = out + s * len + q->ctx_len;
            q->block_table = tables + s * nb;
            q->n_logits = 1;
        }
        memset(&batch, 0, sizeof(batch));
        batch.n_seqs = N_SEQ;
        batch.seqs = seqs;
        if (device) {
            BT_ASSERT_OK(backend_forward_sample(be, &batch, sm, ids, NULL,
                                                NULL));
        } else {
            BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
            for (int s = 0; s < N_SEQ; s++)
                ids[s] = sampler_sample(sm[s], logits + (size_t)s * vocab);
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

/* A mixed step: a prompt chunk with logits, a prompt chunk without,
 * decode tokens with and without samplers; logits of NULL rows. */
static void check_mixed(backend_t *be, int vocab)
{
    int toks[4][12], tables[4][4], ids[3], ref_ids[3];
    backend_seq_t q[4];
    backend_batch_t batch = {0};
    float *ref = malloc(sizeof(float) * 3 * (size_t)vocab);
    float *got = malloc(sizeof(float) * 3 * (size_t)vocab);
    sampler_t *sm[3] = {NULL, NULL, NULL}, *sr[3] = {NULL, NULL, NULL};
    sampler_params_t p;

    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 12; i++)
            toks[s][i] = 1 + (s * 13 + i * 7) % (vocab - 1);
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 4; i++)
            tables[s][i] = 1000 + s * 4 + i;
    sampler_params_init(&p);
    BT_ASSERT_OK(sampler_create(&p, vocab, &sm[0]));
    BT_ASSERT_OK(sampler_create(&p, vocab, &sr[0]));
    p.temperature = 0.9f;
    p.top_p = 0.9f;
    p.seed = 77;
    BT_ASSERT_OK(sampler_create(&p, vocab, &sm[2]));
    BT_ASSERT_OK(sampler_create(&p, vocab, &sr[2]));
    /* pass 1: reference; pass 2: device sampling (same KV writes) */
    for (int pass = 0; pass < 2; pass++) {
        memset(q, 0, sizeof(q));
        q[0] = (backend_seq_t){.n_tokens = 12, .tokens = toks[0],
                               .block_table = tables[0], .n_logits = 1};
        q[1] = (backend_seq_t){.n_tokens = 10, .tokens = toks[1],
                               .block_table = tables[1], .n_logits = 0};
        q[2] = (backend_seq_t){.n_tokens = 1, .tokens = toks[2],
                               .block_table = tables[2], .n_logits = 1};
        q[3] = (backend_seq_t){.n_tokens = 7, .tokens = toks[3],
                               .block_table = tables[3], .n_logits = 1};
        batch.n_seqs = 4;
        batch.seqs = q;
        if (pass == 0) {
            BT_ASSERT_OK(backend_forward(be, &batch, ref, NULL));
            ref_ids[0] = sampler_sample(sr[0], ref);
            ref_ids[1] = sampler_sample(sr[2], ref + vocab);
            ref_ids[2] = -1;
        } else {
            sampler_t *rows[3] = {sm[0], sm[2], NULL};
            memset(got, 0, sizeof(float) * 3 * (size_t)vocab);
            BT_ASSERT_OK(backend_forward_sample_begin(be, &batch, rows, ids,
                                                      got, NULL));
            BT_ASSERT_OK(backend_forward_sample_end(be));
        }
    }
    for (int i = 0; i < 3; i++)
        if (ids[i] != ref_ids[i]) {
            printf("FAIL mixed step row %d: %d != %d\n", i, ids[i],
                   ref_ids[i]);
            g_fail++;
        }
    if (memcmp(got + 2 * (size_t)vocab, ref + 2 * (size_t)vocab,
               sizeof(float) * (size_t)vocab) != 0) {
        printf("FAIL mixed step: logits of the NULL-sampler row differ\n");
        g_fail++;
    }
    for (int i = 0; i < 3; i++) {
        sampler_destroy(&sm[i]);
        sampler_destroy(&sr[i]);
    }
    free(ref);
    free(got);
}

int main(int argc, char **argv)
{
    const char *names[] = {"aidreams260K.bin", "stories260K.bin"};
    int steps = argc > 1 ? atoi(argv[1]) : 150;

    /* Token-for-token against the host sampler: the exact paths only
     * (argmax, candidates, whole rows).  Rows the device samples whole
     * (cuda_sample_dist: plain temperature, top-p nuclei past the
     * candidates) keep the distribution and the seed stream but not the
     * host's float walk; tests/gpu/test_sample_dist checks that
     * contract. */
    setenv("BT_SAMPLE_DIST", "0", 1);
    cuda_switches_reload(); /* the backend reads the table, once */

    for (size_t mi = 0; mi < 2; mi++) {
        for (int prec = 0; prec < 2; prec++) {
            char path[1024];
            model_t *m = NULL;
            backend_t *be = NULL;
            backend_config_t cfg;
            int vocab, len = PROMPT + steps + 1;
            int *a, *b;
            uint64_t st0[4], st1[4];
            int bad_seqs = 0;

            snprintf(path, sizeof(path), "%s/models/%s", shared_dir(),
                     names[mi]);
            BT_ASSERT_OK(model_load(path, &m));
            vocab = model_config(m)->vocab_size;
            if (len > model_config(m)->max_seq_len) {
                steps = model_config(m)->max_seq_len - PROMPT - 1;
                len = PROMPT + steps + 1;
            }
            backend_config_init(&cfg);
            cfg.n_kv_blocks = 1024;
            cfg.block_size = 8;
            cfg.max_batch_tokens = 512;
            cfg.max_seqs = 16;
            cfg.precision = prec ? BACKEND_PRECISION_F32
                                 : BACKEND_PRECISION_BF16;
            BT_ASSERT_OK(backend_create("cuda", m, &cfg, &be));
            a = calloc((size_t)N_SEQ * len, sizeof(int));
            b = calloc((size_t)N_SEQ * len, sizeof(int));
            BT_ASSERT_OK(cuda_backend_sample_stats(be, &st0[0], &st0[1],
                                                   &st0[2], &st0[3]));
            run_streams(be, vocab, steps, false, a);
            run_streams(be, vocab, steps, true, b);
            BT_ASSERT_OK(cuda_backend_sample_stats(be, &st1[0], &st1[1],
                                                   &st1[2], &st1[3]));
            for (int s = 0; s < N_SEQ; s++) {
                int first = -1;
                for (int i = 0; i < len && first < 0; i++)
                    if (a[s * len + i] != b[s * len + i])
                        first = i;
                if (first >= 0) {
                    bad_seqs++;
                    printf("  seq %d (params %d) differs at token %d: "
                           "full %d device %d\n", s, s, first,
                           a[s * len + first], b[s * len + first]);
                }
            }
            printf("%s %s %s: %d sequences x %d steps, device = full "
                   "logits path%s; rows argmax %llu top %llu top_miss %llu "
                   "row %llu\n", bad_seqs ? "FAIL" : "PASS", names[mi],
                   prec ? "f32" : "bf16", N_SEQ, steps + 1,
                   bad_seqs ? " NOT" : "",
                   (unsigned long long)(st1[0] - st0[0]),
                   (unsigned long long)(st1[1] - st0[1]),
                   (unsigned long long)(st1[2] - st0[2]),
                   (unsigned long long)(st1[3] - st0[3]));
            g_fail += bad_seqs;
            if (st1[1] - st0[1] == 0 || st1[0] - st0[0] == 0) {
                printf("FAIL %s: the device paths were not used\n",
                       names[mi]);
                g_fail++;
            }
            check_mixed(be, vocab);
            free(a);
            free(b);
            backend_destroy(&be);
            model_destroy(&m);
        }
    }
    printf("%s test_cuda_sample\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
