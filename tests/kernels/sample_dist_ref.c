/*
 * sample_dist_ref.c - CPU reference of cuda_sample_dist and its contract
 * check (see sample_dist_ref.h).
 */
#include "sample_dist_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t key;
    int id;
} sdr_cand_t;

static int sdr_cmp(const void *a, const void *b)
{
    const sdr_cand_t *x = a, *y = b;

    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

bool sample_dist_ref_probs(const float *row, int vocab, float inv_t,
                           float *p, double *sum_p)
{
    float mx = -INFINITY;
    double sum = 0.0;

    for (int i = 0; i < vocab; i++) {
        if (isnan(row[i]))
            return false;
        mx = row[i] > mx ? row[i] : mx;
    }
    if (isinf(mx))
        return false;
    for (int i = 0; i < vocab; i++) {
        float e = expf((row[i] - mx) * inv_t);
        p[i] = e;
        sum += e;
    }
    for (int i = 0; i < vocab; i++)
        p[i] = (float)((double)p[i] / sum);
    *sum_p = sum;
    return true;
}

void sample_dist_ref_pick(const float *p, int vocab, double sum,
                          const cuda_dist_spec_t *sp, cuda_dist_out_t *out)
{
    float cut_m = sd_cut_m(sp->min_p, sum);
    sdr_cand_t *c = malloc(sizeof(*c) * (size_t)vocab);
    uint64_t m_f = 0, keep = 0, t, s = 0, fx_top;
    int n_f = 0, mode, nn, pos = -1;

    out->token = -1;
    out->n = 0;
    out->keep = 0;
    out->sum = sum;
    for (int i = 0; i < vocab; i++)
        if (p[i] >= cut_m) {
            c[n_f].key = sd_key(p[i]);
            c[n_f++].id = i;
            m_f += sd_fx(p[i]);
        }
    mode = sd_mode(sp, n_f);
    if (mode == SD_MODE_ORDER) {
        out->token = CUDA_DIST_ORDER;
        goto out;
    }
    if (mode == SD_MODE_ID) {
        t = sd_target(m_f, sp->u);
        out->n = n_f;
        out->keep = m_f;
        for (int i = 0; i < n_f; i++) {
            s += sd_fx(sd_unkey(c[i].key));
            if (s > t) {
                out->token = c[i].id;
                break;
            }
        }
        goto out;
    }
    qsort(c, (size_t)n_f, sizeof(*c), sdr_cmp);
    if (mode == SD_MODE_TOP1) {
        nn = 1;
    } else {
        int nk = sp->top_k > 0 && sp->top_k < n_f ? sp->top_k : n_f;
        float cut_p = sd_cut_p(sp->top_p, nk);
        int g = 0, limit, m = -1;

        for (int i = 0; i < n_f; i++)
            g += sd_unkey(c[i].key) >= cut_p;
        limit = sd_limit(sp, n_f, g);
        fx_top = sd_fx(sp->top_p);
        if (fx_top == 0) {
            m = 1;
        } else {
            for (int i = 0; i < n_f && m < 0; i++) {
                s += sd_fx(sd_unkey(c[i].key));
                if (s > fx_top - 1)
                    m = i + 1;
            }
        }
        nn = m < 0 || m > limit ? limit : m;
    }
    for (int i = 0; i < nn; i++)
        keep += sd_fx(sd_unkey(c[i].key));
    out->n = nn;
    out->keep = keep;
    t = sd_target(keep, sp->u);
    s = 0;
    for (int i = 0; i < n_f; i++) {
        s += sd_fx(sd_unkey(c[i].key));
        if (s > t) {
            pos = i;
            break;
        }
    }
    if (pos < 0 || pos >= nn)
        pos = nn - 1;
    out->token = c[pos].id;
out:
    free(c);
}

void sample_dist_ref(const float *row, int vocab, const cuda_dist_spec_t *sp,
                     cuda_dist_out_t *out)
{
    float *p = malloc(sizeof(float) * (size_t)vocab);
    double sum;

    if (!sample_dist_ref_probs(row, vocab, sp->inv_t, p, &sum)) {
        memset(out, 0, sizeof(*out));
        out->token = CUDA_DIST_NONFINITE;
    } else {
        sample_dist_ref_pick(p, vocab, sum, sp, out);
    }
    free(p);
}

void sample_dist_ref_spec(const sampler_params_t *prm, float u, int row,
                          cuda_dist_spec_t *sp)
{
    sp->row = row;
    sp->top_k = prm->top_k;
    sp->inv_t = 1.0f / prm->temperature;
    sp->top_p = prm->top_p;
    sp->min_p = prm->min_p;
    sp->u = u;
}

bool sample_dist_ref_contract(const float *row, int vocab,
                              const sampler_params_t *prm, int token,
                              double keep, double tol0, int ulp_slack,
                              int *host_token_p,
                              double *slack_p, char *why, size_t why_len)
{
    float *p = malloc(sizeof(float) * (size_t)vocab);
    float *probs = malloc(sizeof(float) * (size_t)vocab);
    float *tmp = malloc(sizeof(float) * (size_t)vocab);
    sdr_cand_t *c = malloc(sizeof(*c) * ((size_t)vocab + 1));
    sampler_t *s = NULL;
    long double keep_h = 0.0L, cum = 0.0L, before = -1.0L, incl = -1.0L;
    long double hb = -1.0L, hi = -1.0L;
    double sum, tol, u;
    bool sorted, ok = false;
    int n = 0, host;

    why[0] = '\0';
    if (sampler_create(prm, vocab, &s) != BT_OK ||
        !sample_dist_ref_probs(row, vocab, 1.0f / prm->temperature, p,
                               &sum)) {
        snprintf(why, why_len, "non-finite row or no sampler");
        goto out;
    }
    u = sampler_uniform_peek(s);
    memcpy(tmp, row, sizeof(float) * (size_t)vocab);
    sampler_probs(s, tmp, probs);
    memcpy(tmp, row, sizeof(float) * (size_t)vocab);
    host = sampler_sample(s, tmp);
    *host_token_p = host;
    sorted = prm->top_p < 1.0f || prm->top_k == 1;
    for (int i = 0; i < vocab; i++)
        if (probs[i] > 0.0f) {
            c[n].key = sd_key(p[i]);
            c[n++].id = i;
            keep_h += p[i];
        }
    if (sorted)
        qsort(c, (size_t)n, sizeof(*c), sdr_cmp);
    tol = tol0; /* keep < 0: unknown (no nucleus-edge allowance) */
    if (keep >= 0.0)
        tol += fabs(keep / SD_FX_ONE - (double)keep_h) / (double)keep_h;
    if (ulp_slack > 0 && token >= 0 && token < vocab) {
        /* near-ties of the token that a few-ulp P difference reorders */
        const float pt = p[token];
        float lo = pt, hi = pt;
        long double near = 0.0L;
        for (int k = 0; k < ulp_slack; k++) {
            lo = nextafterf(lo, 0.0f);
            hi = nextafterf(hi, 1.0f);
        }
        for (int i = 0; i < n; i++) {
            const float pc = sd_unkey(c[i].key);
            if (c[i].id != token && pc >= lo && pc <= hi)
                near += pc;
        }
        tol += (double)(near / keep_h);
    }
    for (int i = 0; i < n; i++) {
        long double b = cum;
        cum += (long double)sd_unkey(c[i].key) / keep_h;
        if (c[i].id == token) {
            before = b;
            incl = cum;
        }
        if (c[i].id == host) {
            hb = b;
            hi = cum;
        }
    }
    if (token < 0 || token >= vocab) {
        snprintf(why, why_len, "token %d out of range", token);
        goto out;
    }
    if (before < 0.0L) { /* outside the host's candidates: past the end */
        before = cum;
        incl = cum;
    }
    if (slack_p != NULL) {
        double sl = 0.0;
        if (hb >= 0.0L) {
            if ((double)hb > u)
                sl = (double)hb - u;
            if ((double)hi < u)
                sl = u - (double)hi;
        }
        *slack_p = sl;
    }
    ok = (double)before <= u + tol && (double)incl >= u - tol;
    if (!ok)
        snprintf(why, why_len,
                 "u %.9f outside token %d's window [%.9Lf, %.9Lf] (tol %.2e;"
                 " host token %d, %d candidates)", u, token, before, incl,
                 tol, host, n);
out:
    sampler_destroy(&s);
    free(p);
    free(probs);
    free(tmp);
    free(c);
    return ok;
}

double sample_dist_ref_uniform(uint64_t *rng)
{
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    return (double)(*rng >> 11) / 9007199254740992.0;
}

void sample_dist_ref_row(float *row, int vocab, int kind, uint64_t *rng)
{
    for (int i = 0; i < vocab; i++) {
        double g = sample_dist_ref_uniform(rng) + sample_dist_ref_uniform(rng) +
                   sample_dist_ref_uniform(rng) - 1.5;
        switch (kind) {
        case 0: row[i] = (float)(0.5 * sample_dist_ref_uniform(rng)); break;
        case 1: row[i] = (float)(4.0 * g) + (i % 97 == 0 ? 12.0f : 0.0f);
                break;
        case 2: row[i] = (float)(int)(3.0 * g); break;
        case 3: row[i] = i % 3 ? -INFINITY : (float)(2.0 * g); break;
        default: row[i] = 1.0f; break;
        }
    }
    if (kind == 5)
        row[vocab / 2] = NAN;
    if (kind == 6)
        row[vocab / 3] = INFINITY;
}
