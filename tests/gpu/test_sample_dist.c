/*
 * test_sample_dist.c - cuda_sample_dist (whole-distribution sampling on
 * the device, worker/cuda/kernels/sample_dist.h) on the GPU.
 *
 * 1. Kernel vs reference: rows of vocab 512 / 32000 / 128256 (flat,
 *    peaked, coarse ties, -inf masked, all equal, NaN, +inf), chosen in
 *    reverse from a strided buffer, T 0.3 / 1 / 2 x top_p 0.5 / 0.95 /
 *    0.999 / 1 x top-k off / 1 / 300 x min-p off / 0.05, the output and
 *    the scratch poisoned first.  Per row:
 *      - non-finite rows are declined (CUDA_DIST_NONFINITE);
 *      - the device's P are the host's within 4 ulp (device expf);
 *      - sample_dist_ref_pick on the device's own P and sum gives the
 *        device's token, candidate count and mass bit for bit (the
 *        selection / draw logic is exact);
 *      - the contract (cuda_sample.h) against the host sampler: u lies in
 *        the token's exact cumulative window, tol 2e-6.
 *    Vocab 32000 and 128256 again with each cluster size forced
 *    (BT_SAMPLE_DIST_CLUSTER 16 / 8 / 4 / 2: the launch itself picks one
 *    block a row for 504 rows).
 * 2. End to end through cuda_sampling_enqueue / _finish (the path the
 *    backend uses): greedy, top-p, top-p 0.999, plain temperature,
 *    min-p, top-k 1, top-k alone and penalty rows on flat and peaked
 *    rows: greedy = host, every other token within the contract, each
 *    sampler's stream advanced by exactly one draw, flat top-p 0.999
 *    rows sampled by cuda_sample_dist (no row copied but for top-k alone
 *    and penalties).
 * 3. --bench: device time of cuda_sample_dist for 1 / 8 / 64 flat rows of
 *    128,256 (cudaEvents, 20 calls each; rows stay in L2 as after a
 *    forward), top_p 0.999 and plain temperature.
 * Prints PASS/FAIL lines; exits nonzero on any failure.
 * Run: build-cuda/gpu/test_sample_dist [--bench]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_sample.h"
#include "cuda/cuda_switches.h"
#include "cuda/kernels/sample.h"
#include "kernels/sample_dist_ref.c"
#include "sampler.h"

#define CK(_x)                                                              \
    do {                                                                    \
        cudaError_t _e = (_x);                                              \
        if (_e != cudaSuccess) {                                            \
            printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #_x,          \
                   cudaGetErrorString(_e));                                 \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static int g_fail;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void make_row(float *row, int vocab, int kind)
{
    sample_dist_ref_row(row, vocab, kind, &g_rng);
}

static int ulp_diff(float a, float b)
{
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return abs(x - y);
}

// ---------------------------------------------------------------------
// 1. kernel vs reference

static void check_kernel(int vocab)
{
    static const float temps[3] = {0.3f, 1.0f, 2.0f};
    static const float top_ps[4] = {0.5f, 0.95f, 0.999f, 1.0f};
    static const int top_ks[3] = {0, 1, 300};
    const int kinds = 7, n_par = 3 * 4 * 3 * 2;
    const size_t ld = (size_t)vocab + 3;
    int n = 0, cap = kinds * n_par, bad = 0, agree = 0, checked = 0;
    int worst_ulp = 0;
    float *h = malloc(sizeof(float) * 2 * (size_t)kinds * ld);
    cuda_dist_spec_t *spec = malloc(sizeof(*spec) * (size_t)cap);
    sampler_params_t *prm = malloc(sizeof(*prm) * (size_t)cap);
    int *kind_of = malloc(sizeof(int) * (size_t)cap);
    cuda_dist_out_t *out = malloc(sizeof(*out) * (size_t)cap);
    float *p = malloc(sizeof(float) * (size_t)cap * vocab);
    float *pr = malloc(sizeof(float) * (size_t)vocab);
    float *d_lg, *d_p;
    cuda_dist_spec_t *d_spec;
    cuda_dist_out_t *d_out;

    /* kind k's row sits at buffer row 2 * (kinds - 1 - k) + 1 */
    for (int k = 0; k < kinds; k++)
        make_row(h + (size_t)(2 * (kinds - 1 - k) + 1) * ld, vocab, k);
    for (int k = 0; k < kinds; k++)
        for (int ti = 0; ti < 3; ti++)
            for (int pi = 0; pi < 4; pi++)
                for (int ki = 0; ki < 3; ki++)
                    for (int mi = 0; mi < 2; mi++) {
                        sampler_t *s;
                        sampler_params_t *q = &prm[n];
                        sampler_params_init(q);
                        q->temperature = temps[ti];
                        q->top_p = top_ps[pi];
                        q->top_k = top_ks[ki];
                        q->min_p = mi ? 0.05f : 0.0f;
                        q->seed = 7000 + (uint64_t)n;
                        if (sampler_create(q, vocab, &s) != BT_OK) {
                            printf("FAIL sampler_create\n");
                            exit(1);
                        }
                        sample_dist_ref_spec(q, sampler_uniform_peek(s),
                                             2 * (kinds - 1 - k) + 1,
                                             &spec[n]);
                        sampler_destroy(&s);
                        kind_of[n++] = k;
                    }
    CK(cudaMalloc((void **)&d_lg, sizeof(float) * 2 * (size_t)kinds * ld));
    CK(cudaMalloc((void **)&d_p, sizeof(float) * (size_t)n * vocab));
    CK(cudaMalloc((void **)&d_spec, sizeof(*spec) * (size_t)n));
    CK(cudaMalloc((void **)&d_out, sizeof(*out) * (size_t)n));
    CK(cudaMemcpy(d_lg, h, sizeof(float) * 2 * (size_t)kinds * ld,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_spec, spec, sizeof(*spec) * (size_t)n,
                  cudaMemcpyHostToDevice));
    CK(cudaMemset(d_out, 0x7F, sizeof(*out) * (size_t)n)); /* poison */
    CK(cudaMemset(d_p, 0xFF, sizeof(float) * (size_t)n * vocab));
    if (cuda_sample_dist(d_lg, ld, vocab, d_spec, n, d_p, d_out, NULL) !=
        BT_OK) {
        printf("FAIL cuda_sample_dist launch\n");
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out, d_out, sizeof(*out) * (size_t)n,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(p, d_p, sizeof(float) * (size_t)n * vocab,
                  cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        const float *row = h + (size_t)spec[i].row * ld;
        const float *dp = p + (size_t)i * vocab;
        cuda_dist_out_t ref;
        double sum;
        int host, kind = kind_of[i];
        char why[256];

        if (i < 5 && vocab == 512)
            printf("  row %d kind %d: token %d n %d keep %.9f sum %.6f\n",
                   i, kind, out[i].token, out[i].n,
                   (double)out[i].keep / SD_FX_ONE, out[i].sum);
        if (kind >= 5) {
            if (out[i].token != CUDA_DIST_NONFINITE) {
                if (bad++ < 10)
                    printf("  FAIL row %d kind %d: token %d, not declined\n",
                           i, kind, out[i].token);
            }
            continue;
        }
        if (!sample_dist_ref_probs(row, vocab, spec[i].inv_t, pr, &sum)) {
            printf("FAIL reference declined row %d\n", i);
            g_fail++;
            continue;
        }
        for (int j = 0; j < vocab; j++) {
            int d = ulp_diff(pr[j], dp[j]);
            worst_ulp = d > worst_ulp ? d : worst_ulp;
        }
        sample_dist_ref_pick(dp, vocab, out[i].sum, &spec[i], &ref);
        if (ref.token != out[i].token || ref.n != out[i].n ||
            ref.keep != out[i].keep) {
            if (bad++ < 10)
                printf("  FAIL row %d kind %d (T %g top_p %g top_k %d min_p "
                       "%g): device token %d n %d keep %llu, reference on "
                       "its P: %d %d %llu\n", i, kind,
                       (double)prm[i].temperature, (double)prm[i].top_p,
                       prm[i].top_k, (double)prm[i].min_p, out[i].token,
                       out[i].n, (unsigned long long)out[i].keep, ref.token,
                       ref.n, (unsigned long long)ref.keep);
            continue;
        }
        /* top-k > 1 alone: declined (CUDA_DIST_ORDER: the host's
         * quickselect order) when top_k < |F|; when top_k >= |F| it is a
         * no-op on the host too (sampler.c: top_k < n), the row is
         * drawn in id order and meets the contract like any other.  The
         * device already equals the reference (sd_mode) here. */
        if (out[i].token == CUDA_DIST_ORDER)
            continue;
        /* ulp slack 8: device and host P each within 4 ulp (checked
         * below), so near-ties up to 8 ulp apart may swap */
        if (!sample_dist_ref_contract(row, vocab, &prm[i], out[i].token,
                                      (double)out[i].keep, 2e-6, 8, &host,
                                      NULL, why, sizeof(why))) {
            if (bad++ < 10)
                printf("  FAIL row %d kind %d (T %g top_p %g top_k %d min_p "
                       "%g): %s\n", i, kind, (double)prm[i].temperature,
                       (double)prm[i].top_p, prm[i].top_k,
                       (double)prm[i].min_p, why);
            continue;
        }
        agree += host == out[i].token;
        checked++;
    }
    if (worst_ulp > 4) {
        printf("  FAIL device P differ from the host's by %d ulp\n",
               worst_ulp);
        bad++;
    }
    const char *cl = getenv("BT_SAMPLE_DIST_CLUSTER");
    printf("%s kernel vocab %d (cluster %s): %d rows, device = reference on "
           "its P, contract vs host sampler; P within %d ulp; token = "
           "host's in %d of %d\n", bad ? "FAIL" : "PASS", vocab,
           cl ? cl : "by rows", n, worst_ulp, agree, checked);
    g_fail += bad;
    cudaFree(d_lg);
    cudaFree(d_p);
    cudaFree(d_spec);
    cudaFree(d_out);
    free(h);
    free(spec);
    free(prm);
    free(kind_of);
    free(out);
    free(p);
    free(pr);
}

// ---------------------------------------------------------------------
// 2. end to end through cuda_sampling

static void params_of(int i, sampler_params_t *p)
{
    sampler_params_init(p);
    p->seed = 500 + (uint64_t)i;
    switch (i % 8) {
    case 0: break;                                           /* greedy */
    case 1: p->temperature = 0.8f; p->top_p = 0.9f; break;
    case 2: p->temperature = 1.0f; p->top_p = 0.999f; break;
    case 3: p->temperature = 1.0f; break;                    /* plain */
    case 4: p->temperature = 1.0f; p->min_p = 0.05f; break;
    case 5: p->temperature = 0.7f; p->top_k = 1; break;
    case 6: p->temperature = 0.9f; p->top_k = 20; break;     /* row */
    default: p->temperature = 0.8f; p->top_p = 0.9f;
             p->repetition_penalty = 1.3f; break;            /* row */
    }
}

/* Row r's sampler and its twin (the host replay): fresh streams, seen
 * tokens for the penalty rows. */
static void make_pair(int r, int vocab, sampler_t **sm, sampler_t **tw)
{
    sampler_params_t p;

    params_of(r, &p);
    if (sampler_create(&p, vocab, sm) != BT_OK ||
        sampler_create(&p, vocab, tw) != BT_OK) {
        printf("FAIL sampler_create\n");
        exit(1);
    }
    if (p.repetition_penalty != 1.0f) /* seen tokens: penalties apply */
        for (int t = 0; t < 10; t++) {
            sampler_observe(*sm, t * 7);
            sampler_observe(*tw, t * 7);
        }
}

/* st -= st0: one step's counters. */
static void stats_since(cuda_sampling_stats_t *st,
                        const cuda_sampling_stats_t *st0)
{
    st->argmax -= st0->argmax;
    st->top -= st0->top;
    st->top_miss -= st0->top_miss;
    st->row -= st0->row;
    st->dist -= st0->dist;
    st->dist_declined -= st0->dist_declined;
}

/* One end-to-end step's tokens: the exact paths equal to the twin's
 * host sampling, the whole-row rows within the contract, and every
 * sampler's stream in step with its twin's.  Returns the failures. */
static int check_e2e_rows(const float *h, int vocab, int n, sampler_t **sm,
                          sampler_t **tw, const int *ids, float *tmp)
{
    int bad = 0;

    for (int r = 0; r < n; r++) {
        const sampler_params_t *p = sampler_params(sm[r]);
        int host;
        char why[256];

        memcpy(tmp, h + (size_t)r * vocab, sizeof(float) * (size_t)vocab);
        if (p->temperature == 0.0f || !sampler_is_dist(tw[r])) {
            host = sampler_sample(tw[r], tmp); /* exact paths */
            if (host != ids[r] && bad++ < 10)
                printf("  FAIL e2e row %d (params %d): %d, host %d\n", r,
                       r % 8, ids[r], host);
        } else {
            if (!sample_dist_ref_contract(h + (size_t)r * vocab, vocab, p,
                                          ids[r], -1.0, 2e-6, 8, &host, NULL,
                                          why, sizeof(why)) &&
                bad++ < 10)
                printf("  FAIL e2e row %d (params %d): %s\n", r, r % 8, why);
            (void)sampler_uniform(tw[r]); /* the one draw */
        }
        /* one draw each (none for greedy) */
        if (sampler_uniform(sm[r]) != sampler_uniform(tw[r]) && bad++ < 10)
            printf("  FAIL e2e row %d: random stream out of step\n", r);
    }
    return bad;
}

static void check_end_to_end(int vocab)
{
    const int n = 32;
    float *h = malloc(sizeof(float) * (size_t)n * vocab);
    float *tmp = malloc(sizeof(float) * (size_t)vocab);
    sampler_t *sm[32], *tw[32];
    int dev_row[32], ids[32], bad = 0;
    float *d_lg;
    cuda_sampling_t *cs = NULL;
    cuda_sampling_stats_t st;
    cudaStream_t stream;

    CK(cudaStreamCreate(&stream));
    for (int r = 0; r < n; r++) {
        make_row(h + (size_t)r * vocab, vocab, (r / 8) % 2 ? 1 : 0);
        make_pair(r, vocab, &sm[r], &tw[r]);
        dev_row[r] = n - 1 - r;
    }
    CK(cudaMalloc((void **)&d_lg, sizeof(float) * (size_t)n * vocab));
    for (int r = 0; r < n; r++)
        CK(cudaMemcpy(d_lg + (size_t)dev_row[r] * vocab,
                      h + (size_t)r * vocab, sizeof(float) * (size_t)vocab,
                      cudaMemcpyHostToDevice));
    if (cuda_sampling_create(vocab, 64, &cs) != BT_OK) {
        printf("FAIL cuda_sampling_create\n");
        exit(1);
    }
    /* two steps over the same rows: the rows that missed their
     * candidates in the first go straight to the whole row in the
     * second (sampler_wide), so the second has fewer misses */
    unsigned long long miss0 = 0;
    int wide0 = 0;
    for (int step = 0; step < 2; step++) {
        cuda_sampling_stats_t st0;
        int n_wide = 0;
        cuda_sampling_stats(cs, &st0);
        if (cuda_sampling_enqueue(cs, d_lg, (size_t)vocab, n, dev_row, sm,
                                  ids, NULL, stream) != BT_OK ||
            cuda_sampling_finish(cs, stream) != BT_OK) {
            printf("FAIL cuda_sampling\n");
            exit(1);
        }
        cuda_sampling_stats(cs, &st);
        stats_since(&st, &st0);
        for (int r = 0; r < n; r++)
            n_wide += sampler_wide(sm[r]);
        /* a miss marks its request wide, unless its nucleus turned out
         * small (at most CS_K / 2: back to the candidates) */
        if (step == 0 && (n_wide > (int)st.top_miss ||
                          (st.top_miss > 0 && n_wide == 0))) {
            printf("  FAIL e2e: %llu top misses, %d requests marked wide\n",
                   (unsigned long long)st.top_miss, n_wide);
            bad++;
        }
        if (step == 1 && st.top_miss + wide0 > miss0) {
            printf("  FAIL e2e: %llu top misses in the second step, %llu "
                   "in the first with %d requests marked wide\n",
                   (unsigned long long)st.top_miss,
                   (unsigned long long)miss0, wide0);
            bad++;
        }
        if (step == 0) {
            miss0 = st.top_miss;
            wide0 = n_wide;
        }
        bad += check_e2e_rows(h, vocab, n, sm, tw, ids, tmp);
        if (st.dist == 0 || st.row > 8) {
            printf("  FAIL e2e: dist %llu rows, %llu copied whole\n",
                   (unsigned long long)st.dist, (unsigned long long)st.row);
            bad++;
        }
        printf("%s end to end vocab %d step %d: argmax %llu top %llu "
               "top_miss %llu dist %llu declined %llu row %llu wide %d\n",
               bad ? "FAIL" : "PASS", vocab, step,
               (unsigned long long)st.argmax, (unsigned long long)st.top,
               (unsigned long long)st.top_miss, (unsigned long long)st.dist,
               (unsigned long long)st.dist_declined,
               (unsigned long long)st.row, n_wide);
        g_fail += bad;
        bad = 0;
        /* the second step with fresh streams (the contract's reference
         * draws a fresh sampler's first uniform) that keep the route */
        for (int r = 0; r < n; r++) {
            const bool wide = sampler_wide(sm[r]);
            sampler_destroy(&sm[r]);
            sampler_destroy(&tw[r]);
            make_pair(r, vocab, &sm[r], &tw[r]);
            sampler_set_wide(sm[r], wide);
        }
    }
    for (int r = 0; r < n; r++) {
        sampler_destroy(&sm[r]);
        sampler_destroy(&tw[r]);
    }
    cuda_sampling_destroy(&cs);
    cudaFree(d_lg);
    CK(cudaStreamDestroy(stream));
    free(h);
    free(tmp);
}

// ---------------------------------------------------------------------
// 3. --bench

static void bench(void)
{
    const int vocab = 128256, rows[3] = {1, 8, 64}, iters = 20;
    float *h = malloc(sizeof(float) * 64 * (size_t)vocab);
    cuda_dist_spec_t spec[64];
    float *d_lg, *d_p;
    cuda_dist_spec_t *d_spec;
    cuda_dist_out_t *d_out;
    cudaEvent_t e0, e1;

    for (int r = 0; r < 64; r++)
        make_row(h + (size_t)r * vocab, vocab, 0);
    CK(cudaMalloc((void **)&d_lg, sizeof(float) * 64 * (size_t)vocab));
    CK(cudaMalloc((void **)&d_p, sizeof(float) * 64 * (size_t)vocab));
    CK(cudaMalloc((void **)&d_spec, sizeof(spec)));
    CK(cudaMalloc((void **)&d_out, sizeof(cuda_dist_out_t) * 64));
    CK(cudaMemcpy(d_lg, h, sizeof(float) * 64 * (size_t)vocab,
                  cudaMemcpyHostToDevice));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int mode = 0; mode < 2; mode++) {
        for (int r = 0; r < 64; r++) {
            sampler_params_t p;
            sampler_params_init(&p);
            p.temperature = 1.0f;
            p.top_p = mode ? 1.0f : 0.999f;
            sample_dist_ref_spec(&p, (float)(r * 37 % 64) / 64.0f, r,
                                 &spec[r]);
        }
        CK(cudaMemcpy(d_spec, spec, sizeof(spec), cudaMemcpyHostToDevice));
        for (int ri = 0; ri < 3; ri++) {
            float ms = 0.0f;
            (void)cuda_sample_dist(d_lg, vocab, vocab, d_spec, rows[ri], d_p,
                                   d_out, NULL);
            CK(cudaEventRecord(e0, NULL));
            for (int it = 0; it < iters; it++)
                (void)cuda_sample_dist(d_lg, vocab, vocab, d_spec, rows[ri],
                                       d_p, d_out, NULL);
            CK(cudaEventRecord(e1, NULL));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("bench sample_dist %s rows=%d vocab=%d: %.1f us per call"
                   " (target < 500 at 64 rows)\n",
                   mode ? "plain-T" : "top_p=0.999", rows[ri], vocab,
                   1000.0 * ms / iters);
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(d_lg);
    cudaFree(d_p);
    cudaFree(d_spec);
    cudaFree(d_out);
    free(h);
}

int main(int argc, char **argv)
{
    static const int vocabs[3] = {512, 32000, 128256};

    setenv("BT_SAMPLE_DIST", "1", 1); /* the path under test (the default) */
    cuda_switches_reload(); /* launchers read the table, cuda_switches.h */

    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return 0;
    }
    /* the size the launch picks for 504 rows (one block a row), then
     * every cluster size forced (BT_SAMPLE_DIST_CLUSTER; capped by the
     * device and by 4096 elements a block), unless the caller set one */
    static const char *const clusters[] = {"16", "8", "4", "2"};
    const bool sweep = getenv("BT_SAMPLE_DIST_CLUSTER") == NULL;
    for (int v = 0; v < 3; v++)
        check_kernel(vocabs[v]);
    for (size_t ci = 0; sweep && ci < sizeof(clusters) / sizeof(clusters[0]);
         ci++) {
        setenv("BT_SAMPLE_DIST_CLUSTER", clusters[ci], 1);
        cuda_switches_reload();
        for (int v = 1; v < 3; v++)
            check_kernel(vocabs[v]);
    }
    if (sweep) {
        unsetenv("BT_SAMPLE_DIST_CLUSTER");
        cuda_switches_reload();
    }
    check_end_to_end(32000);
    check_end_to_end(128256);
    printf("%s test_sample_dist\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
