/*
 * test_sample_dist.c - the CPU half of the whole-distribution device
 * sampler (cuda_sample_dist; no GPU needed):
 *   - which rows go to it (sampler_is_dist), sampler_uniform_peek, and
 *     the fixed-point helpers of worker/cuda/kernels/sample_dist.h;
 *   - its CPU reference (tests/kernels/sample_dist_ref.c, the kernel's
 *     steps on the host's probabilities) against the host sampler under
 *     the contract of worker/cuda/cuda_sample.h: the token's exact
 *     cumulative window holds the sampler's uniform (tol 1e-9 here: same
 *     P, only the fixed-point sums differ), the nucleus has the host's
 *     size, on flat / peaked / tied / masked rows, vocab 512, 32000 and
 *     128256, top_p 0.5 / 0.95 / 0.999 / 1, T 0.3 / 1 / 2, top-k off / 1
 *     / 50 / 300, min-p off / 0.05; NaN and +inf rows are declined.
 * Prints how often the reference's token equals sampler_sample's (not a
 * requirement: the host walks a float running sum).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_test.h"
#include "kernels/sample_dist_ref.c" /* the reference (built with CUDA only
                                      * in tests/gpu otherwise) */
#include "sampler.h"

static int g_fail;
static uint64_t g_rng = 88172645463325252ull;

static double rnd(void)
{
    return sample_dist_ref_uniform(&g_rng);
}

static void make_row(float *row, int vocab, int kind)
{
    sample_dist_ref_row(row, vocab, kind, &g_rng);
}

static void check_helpers(void)
{
    sampler_params_t p;
    sampler_t *s;

    /* classification */
    sampler_params_init(&p);
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(!sampler_is_dist(s)); /* greedy */
    sampler_destroy(&s);
    p.temperature = 1.0f;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(sampler_is_dist(s)); /* plain temperature */
    sampler_destroy(&s);
    p.top_k = 50;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(!sampler_is_dist(s)); /* top-k alone: quickselect order */
    sampler_destroy(&s);
    p.top_p = 0.9f;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(sampler_is_dist(s)); /* top-k + top-p */
    sampler_destroy(&s);
    p.top_k = 1;
    p.top_p = 1.0f;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(sampler_is_dist(s));
    sampler_destroy(&s);
    p.top_k = 0;
    p.min_p = 0.1f;
    p.repetition_penalty = 1.2f;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    BT_CHECK(!sampler_is_dist(s)); /* penalties */
    sampler_destroy(&s);

    /* peek = the next draw; the stream is untouched */
    sampler_params_init(&p);
    p.temperature = 0.7f;
    p.seed = 42;
    BT_ASSERT_OK(sampler_create(&p, 10, &s));
    for (int i = 0; i < 1000; i++) {
        float a = sampler_uniform_peek(s), b = sampler_uniform_peek(s);
        BT_CHECK(a == b && a == sampler_uniform(s));
    }
    sampler_destroy(&s);

    /* sd_target = floor(u * keep) exactly; the run rank */
    for (int i = 0; i < 100000; i++) {
        uint64_t keep = (uint64_t)(rnd() * 0x1p60) + 1;
        uint32_t uu = (uint32_t)(rnd() * 16777216.0);
        float u = (float)uu / 16777216.0f;
        unsigned __int128 x = (unsigned __int128)keep * uu;
        BT_CHECK(sd_target(keep, u) == (uint64_t)(x >> 24));
    }
    BT_CHECK(sd_rank_in_run(10, 10, 5, 4) == 1);
    BT_CHECK(sd_rank_in_run(14, 10, 5, 4) == 1);
    BT_CHECK(sd_rank_in_run(15, 10, 5, 4) == 2);
    BT_CHECK(sd_rank_in_run(1000, 10, 5, 4) == 4);
    BT_CHECK(sd_key(0.5f) > sd_key(0.25f) && sd_key(0.0f) == 0);
    BT_CHECK(sd_fx(1.0f) == (1ull << 60) && sd_fx(0.5f) == (1ull << 59));
}

/* One row x params: the reference against the host sampler. */
static void check_one(const float *row, int vocab, int kind,
                      const sampler_params_t *prm, int *agree, int *total,
                      double *slack_max)
{
    cuda_dist_spec_t sp;
    cuda_dist_out_t o;
    sampler_t *s;
    float *probs, *tmp;
    int host = -1, support = 0, zero_p = 0;
    double slack = 0.0;
    char why[256];

    BT_ASSERT_OK(sampler_create(prm, vocab, &s));
    sample_dist_ref_spec(prm, sampler_uniform_peek(s), 0, &sp);
    sample_dist_ref(row, vocab, &sp, &o);
    if (kind >= 5) {
        if (o.token != CUDA_DIST_NONFINITE) {
            printf("FAIL vocab %d kind %d: non-finite row not declined\n",
                   vocab, kind);
            g_fail++;
        }
        sampler_destroy(&s);
        return;
    }
    if (!sampler_is_dist(s)) {
        if (o.token != CUDA_DIST_ORDER && o.token < 0) {
            printf("FAIL vocab %d kind %d: token %d\n", vocab, kind,
                   o.token);
            g_fail++;
        }
        sampler_destroy(&s);
        return;
    }
    if (!sample_dist_ref_contract(row, vocab, prm, o.token,
                                  (double)o.keep, 1e-9, 0, &host, &slack,
                                  why, sizeof(why))) {
        printf("FAIL vocab %d kind %d T %g top_p %g top_k %d min_p %g: "
               "%s\n", vocab, kind, (double)prm->temperature,
               (double)prm->top_p, prm->top_k, (double)prm->min_p, why);
        g_fail++;
    }
    /* the nucleus size: the host's support (P = 0 members aside) */
    probs = malloc(sizeof(float) * (size_t)vocab);
    tmp = malloc(sizeof(float) * (size_t)vocab);
    memcpy(tmp, row, sizeof(float) * (size_t)vocab);
    sampler_probs(s, tmp, probs);
    for (int i = 0; i < vocab; i++) {
        support += probs[i] > 0.0f;
        zero_p += row[i] == -INFINITY;
    }
    if (o.n != support && !(zero_p > 0 && o.n > support)) {
        printf("FAIL vocab %d kind %d T %g top_p %g top_k %d min_p %g: "
               "%d candidates, host %d\n", vocab, kind,
               (double)prm->temperature, (double)prm->top_p, prm->top_k,
               (double)prm->min_p, o.n, support);
        g_fail++;
    }
    *agree += o.token == host;
    (*total)++;
    *slack_max = slack > *slack_max ? slack : *slack_max;
    free(probs);
    free(tmp);
    sampler_destroy(&s);
}

int main(void)
{
    static const int vocabs[3] = {512, 32000, 128256};
    static const float temps[3] = {0.3f, 1.0f, 2.0f};
    static const float top_ps[4] = {0.5f, 0.95f, 0.999f, 1.0f};
    static const int top_ks[4] = {0, 1, 50, 300};
    int agree = 0, total = 0;
    double slack_max = 0.0;

    check_helpers();
    for (int v = 0; v < 3; v++) {
        int vocab = vocabs[v];
        float *row = malloc(sizeof(float) * (size_t)vocab);
        for (int kind = 0; kind < 7; kind++) {
            make_row(row, vocab, kind);
            for (int ti = 0; ti < 3; ti++)
                for (int pi = 0; pi < 4; pi++)
                    for (int ki = 0; ki < 4; ki++)
                        for (int mi = 0; mi < 2; mi++) {
                            sampler_params_t prm;
                            if (vocab > 100000 && (mi || ki == 2))
                                continue; /* time */
                            if (kind >= 4 && (ti || mi))
                                continue;
                            sampler_params_init(&prm);
                            prm.temperature = temps[ti];
                            prm.top_p = top_ps[pi];
                            prm.top_k = top_ks[ki];
                            prm.min_p = mi ? 0.05f : 0.0f;
                            prm.seed = (uint64_t)(v * 1000 + kind * 100 +
                                                  ti * 30 + pi * 7 + ki * 2 +
                                                  mi);
                            check_one(row, vocab, kind, &prm, &agree, &total,
                                      &slack_max);
                        }
        }
        free(row);
    }
    printf("reference token = sampler_sample token in %d of %d rows; the "
           "host token's window misses u by at most %.3g (its float walk)\n",
           agree, total, slack_max);
    printf("%s test_sample_dist\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
