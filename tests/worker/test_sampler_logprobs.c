/*
 * test_sampler_logprobs.c - the sampler's log-probabilities (issue 39):
 * sampler_logprobs_row against a brute-force log_softmax and sort on
 * seeded random rows (ties to the lower id, -inf logits, fewer ids than
 * asked), the sampled token's logprob of the raw row whatever the
 * penalties and temperature, greedy's token as the top-1, a sampler that
 * wants logprobs asking for the whole row, and prompt rows scored at the
 * right positions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bt_log.h"
#include "bt_test.h"
#include "sampler.h"

#define V 300
#define TOL 1e-5

static uint64_t rng = 0x1234567u;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) % 1000000) / 1000000.0f;
}

/* Brute force: logprob of `id` and the rank-j id (value desc, id asc). */
static double brute_lp(const float *x, int n, int id)
{
    double m = -INFINITY, s = 0;

    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    return (double)x[id] - (m + log(s));
}

static int brute_rank(const float *x, int n, int j)
{
    static bool used[V];
    int b = -1;

    if (j == 0)
        memset(used, 0, sizeof(used));
    for (int i = 0; i < n; i++)
        if (!used[i] && (b < 0 || x[i] > x[b]))
            b = i;
    used[b] = true;
    return b;
}

/* Equal within TOL, or both -inf (an impossible token). */
static bool close_lp(double a, double b)
{
    return (isinf(a) && isinf(b) && a < 0 && b < 0) || fabs(a - b) < TOL;
}

static void check_row(const float *x, int n, int tok, int k)
{
    sampler_logprobs_t lp;

    sampler_logprobs_row(x, n, tok, k, &lp);
    BT_ASSERT_EQ(lp.n_top, k < n ? k : n);
    BT_CHECK(close_lp(lp.logprob, brute_lp(x, n, tok)));
    for (int j = 0; j < lp.n_top; j++) {
        int want = brute_rank(x, n, j);
        BT_ASSERT_EQ(lp.top_ids[j], want);
        BT_CHECK(close_lp(lp.top_logprobs[j], brute_lp(x, n, want)));
    }
}

static void test_rows(void)
{
    float x[V];

    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < V; i++)
            x[i] = (frand() - 0.5f) * 20.0f;
        if (r % 5 == 1) /* ties: the lower id first */
            for (int i = 0; i < V; i += 3)
                x[i] = 4.0f;
        if (r % 5 == 2) /* impossible tokens */
            for (int i = 0; i < V; i += 2)
                x[i] = -INFINITY;
        check_row(x, V, (int)(frand() * V) % V, r % (PARAMS_MAX_LOGPROBS + 1));
    }
    /* fewer ids than alternatives asked */
    check_row(x, 7, 3, PARAMS_MAX_LOGPROBS);
}

static void test_sampler(void)
{
    sampler_params_t p;
    sampler_t *s = NULL;
    const sampler_logprobs_t *lp;
    float x[V], copy[V];
    int tok;

    for (int i = 0; i < V; i++)
        x[i] = (frand() - 0.5f) * 8.0f;
    memcpy(copy, x, sizeof(x));

    /* off: nothing, and the device fast paths stay */
    sampler_params_init(&p);
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    sampler_sample(s, x);
    BT_CHECK(sampler_last_logprobs(s) == NULL);
    BT_ASSERT_EQ(sampler_need(s), SAMPLER_NEED_ARGMAX);
    sampler_destroy(&s);

    /* greedy: the token is the top-1, raw logprobs */
    p.logprobs = true;
    p.top_logprobs = 4;
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    BT_ASSERT_EQ(sampler_need(s), SAMPLER_NEED_ROW);
    BT_CHECK(!sampler_is_argmax(s) && !sampler_is_dist(s));
    tok = sampler_sample(s, x);
    BT_CHECK(memcmp(x, copy, sizeof(x)) == 0); /* the row is not touched */
    lp = sampler_last_logprobs(s);
    BT_CHECK(lp != NULL && lp->n_top == 4 && lp->top_ids[0] == tok);
    BT_CHECK(fabs(lp->logprob - brute_lp(x, V, tok)) < TOL);
    sampler_destroy(&s);

    /* temperature and penalties change the draw, not the numbers: they
     * are the raw distribution's */
    p.temperature = 1.3f;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.5f;
    p.seed = 7;
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    sampler_observe(s, 5);
    for (int i = 0; i < 20; i++) {
        int top1;
        tok = sampler_sample(s, x);
        BT_CHECK(memcmp(x, copy, sizeof(x)) == 0);
        lp = sampler_last_logprobs(s);
        BT_CHECK(fabs(lp->logprob - brute_lp(x, V, tok)) < TOL);
        top1 = brute_rank(x, V, 0);
        BT_ASSERT_EQ(lp->top_ids[0], top1);
    }
    {
        int ids[4] = {0, 1, 2, 3};
        float lg[4] = {4, 3, 2, 1};
        int t;
        BT_CHECK(!sampler_sample_top(s, ids, lg, 4, 2.0, &t));
    }
    sampler_destroy(&s);
}

static void test_prompt_rows(void)
{
    sampler_prompt_lp_t *plp = NULL;
    const int toks[6] = {1, 10, 20, 30, 40, 50};
    float rows[3 * V];

    for (int i = 0; i < 3 * V; i++)
        rows[i] = (frand() - 0.5f) * 6.0f;
    BT_ASSERT_OK(sampler_prompt_lp_create(6, 3, &plp));
    /* rows after positions 2, 3, 4: score positions 3, 4, 5 */
    sampler_prompt_lp_rows(plp, rows, V, toks, 2, 3);
    for (int r = 0; r < 3; r++) {
        int p = 3 + r;
        BT_CHECK(fabs(plp->lps[p - 1] - brute_lp(rows + r * V, V, toks[p])) <
                 TOL);
        BT_ASSERT_EQ(plp->top_ids[(p - 1) * 3], brute_rank(rows + r * V, V,
                                                           0));
    }
    /* a row past the prompt's end is ignored */
    sampler_prompt_lp_rows(plp, rows, V, toks, 5, 1);
    sampler_prompt_lp_destroy(&plp);
    BT_CHECK(plp == NULL);
    BT_ASSERT_EQ(sampler_prompt_lp_create(0, 3, &plp), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(sampler_prompt_lp_create(4, 21, &plp), BT_ERR_INVALID_ARG);
}

int main(void)
{
    bt_log_init("test");
    test_rows();
    test_sampler();
    test_prompt_rows();
    BT_TEST_PASS("worker/sampler_logprobs: rows, sampler, prompt rows");
    return 0;
}
