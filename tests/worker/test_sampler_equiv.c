/*
 * test_sampler_equiv.c - the fast host sampler against the implementation
 * it replaced, kept here verbatim as a test-only reference (ref_*).
 *
 * The seeded token streams are a contract (the cluster tests compare
 * sampled streams between processes; sampler_sample_top replays the
 * host's steps), so the rewrite must give the SAME token for the same
 * seed and row, and sampler_probs must give bit-identical rows.  Random
 * rows (vocab 512 and 128,256; flat, peaked, coarse ties, all-equal,
 * near-flat, extreme ranges, non-finite values) go through every
 * combination of temperature, top-k, top-p, min-p and penalties, with a
 * reference sampler and a new one walking in lockstep.
 *
 * Also prints (no assertion) the time of 64 rows x 128,256 per kind of
 * sampling, reference vs new.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "sampler.h"

/* ---- the reference: worker/sampler.c as of fe501c8 --------------------
 * One change: where every probability is NaN and min-p keeps nothing,
 * the old code read s->cands[-1] (undefined); both now take the row's
 * argmax as the one candidate. */

typedef struct {
    int token;
    int count;
} ref_seen_t;

typedef struct {
    int id;
    float p;
} ref_cand_t;

typedef struct {
    sampler_params_t params;
    int vocab_size;
    uint64_t rng;
    ref_seen_t *seen;
    int seen_cap;
    int seen_n;
    ref_cand_t *cands;
    float *scratch;
} ref_t;

static uint64_t ref_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static ref_t *ref_create(const sampler_params_t *params, int vocab_size)
{
    ref_t *s = calloc(1, sizeof(*s));

    s->params = *params;
    s->vocab_size = vocab_size;
    s->rng = ref_mix(params->seed) | 1;
    s->seen_cap = 64;
    s->seen = malloc(sizeof(*s->seen) * (size_t)s->seen_cap);
    s->cands = malloc(sizeof(*s->cands) * (size_t)vocab_size);
    s->scratch = malloc(sizeof(float) * (size_t)vocab_size);
    for (int i = 0; i < s->seen_cap; i++)
        s->seen[i].token = -1;
    return s;
}

static void ref_destroy(ref_t *s)
{
    free(s->seen);
    free(s->cands);
    free(s->scratch);
    free(s);
}

static bool ref_uses_penalties(const ref_t *s)
{
    return s->params.repetition_penalty != 1.0f ||
           s->params.presence_penalty != 0.0f ||
           s->params.frequency_penalty != 0.0f;
}

static void ref_seen_insert(ref_seen_t *table, int cap, int token,
                            int count)
{
    unsigned h = ((unsigned)token * 2654435761u) & (unsigned)(cap - 1);

    while (table[h].token != -1 && table[h].token != token)
        h = (h + 1) & (unsigned)(cap - 1);
    if (table[h].token == -1) {
        table[h].token = token;
        table[h].count = 0;
    }
    table[h].count += count;
}

static void ref_observe(ref_t *s, int token)
{
    if (token < 0 || token >= s->vocab_size || !ref_uses_penalties(s))
        return;
    if ((s->seen_n + 1) * 2 > s->seen_cap) {
        int cap = s->seen_cap * 2;
        ref_seen_t *grown = malloc(sizeof(*grown) * (size_t)cap);
        for (int i = 0; i < cap; i++)
            grown[i].token = -1;
        for (int i = 0; i < s->seen_cap; i++) {
            if (s->seen[i].token != -1)
                ref_seen_insert(grown, cap, s->seen[i].token,
                                s->seen[i].count);
        }
        free(s->seen);
        s->seen = grown;
        s->seen_cap = cap;
    }
    {
        unsigned h = ((unsigned)token * 2654435761u) &
                     (unsigned)(s->seen_cap - 1);
        while (s->seen[h].token != -1 && s->seen[h].token != token)
            h = (h + 1) & (unsigned)(s->seen_cap - 1);
        if (s->seen[h].token == -1)
            s->seen_n++;
    }
    ref_seen_insert(s->seen, s->seen_cap, token, 1);
}

static const float *ref_penalise(ref_t *s, const float *logits)
{
    const sampler_params_t *p = &s->params;

    if (!ref_uses_penalties(s) || s->seen_n == 0)
        return logits;
    memcpy(s->scratch, logits, sizeof(float) * (size_t)s->vocab_size);
    for (int i = 0; i < s->seen_cap; i++) {
        int t = s->seen[i].token;
        float v;

        if (t == -1)
            continue;
        v = s->scratch[t];
        if (p->repetition_penalty != 1.0f)
            v = v > 0.0f ? v / p->repetition_penalty
                         : v * p->repetition_penalty;
        v -= p->presence_penalty;
        v -= p->frequency_penalty * (float)s->seen[i].count;
        s->scratch[t] = v;
    }
    return s->scratch;
}

static int ref_argmax(const float *x, int n)
{
    float m[8], best;
    int i = 0;

    if (n < 16 || x[0] != x[0]) {
        int b = 0;
        for (int j = 1; j < n; j++)
            if (x[j] > x[b])
                b = j;
        return b;
    }
    for (int l = 0; l < 8; l++)
        m[l] = x[0];
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    best = m[0];
    for (int l = 1; l < 8; l++)
        best = m[l] > best ? m[l] : best;
    for (; i < n; i++)
        best = x[i] > best ? x[i] : best;
    for (i = 0; i < n; i++)
        if (x[i] == best)
            return i;
    return 0;
}

static int ref_cand_cmp(const void *a, const void *b)
{
    const ref_cand_t *x = a, *y = b;

    if (x->p > y->p)
        return -1;
    if (x->p < y->p)
        return 1;
    return x->id - y->id;
}

static void ref_select_top(ref_cand_t *c, int n, int k)
{
    int lo = 0, hi = n - 1;

    while (lo < hi) {
        ref_cand_t pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (ref_cand_cmp(&c[i], &pivot) < 0)
                i++;
            while (ref_cand_cmp(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                ref_cand_t t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

static int ref_candidates(ref_t *s, const float *logits)
{
    const sampler_params_t *p = &s->params;
    int vocab = s->vocab_size, n = vocab;
    float max = logits[ref_argmax(logits, vocab)];
    double sum = 0.0, keep;
    float inv_t = 1.0f / p->temperature;

    for (int i = 0; i < vocab; i++) {
        float e = expf((logits[i] - max) * inv_t);
        s->cands[i].id = i;
        s->cands[i].p = e;
        sum += e;
    }
    for (int i = 0; i < vocab; i++)
        s->cands[i].p = (float)(s->cands[i].p / sum);
    if (p->min_p > 0.0f) {
        float cut = p->min_p * (float)(1.0 / sum);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (s->cands[i].p >= cut)
                s->cands[m++] = s->cands[i];
        }
        n = m;
        if (n == 0) { /* the one change (see above) */
            s->cands[0].id = ref_argmax(logits, vocab);
            s->cands[0].p = 1.0f;
            return 1;
        }
    }
    if (p->top_k > 0 && p->top_k < n) {
        ref_select_top(s->cands, n, p->top_k);
        n = p->top_k;
    }
    if (p->top_p < 1.0f) {
        float cut = (1.0f - p->top_p) / (float)(n > 1 ? n - 1 : 1);
        int m = 0;
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            if (s->cands[i].p >= cut)
                s->cands[m++] = s->cands[i];
        }
        if (m == 0)
            m = n;
        n = m;
        qsort(s->cands, (size_t)n, sizeof(*s->cands), ref_cand_cmp);
        for (int i = 0; i < n; i++) {
            cum += s->cands[i].p;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    keep = 0.0;
    for (int i = 0; i < n; i++)
        keep += s->cands[i].p;
    for (int i = 0; i < n; i++)
        s->cands[i].p = (float)(s->cands[i].p / keep);
    return n;
}

static float ref_uniform(ref_t *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545f4914f6cdd1dull) >> 40) /
           16777216.0f;
}

static int ref_sample(ref_t *s, float *logits)
{
    const float *row = ref_penalise(s, logits);
    float r, cum = 0.0f;
    int n;

    if (s->params.temperature == 0.0f)
        return ref_argmax(row, s->vocab_size);
    n = ref_candidates(s, row);
    r = ref_uniform(s);
    for (int i = 0; i < n; i++) {
        cum += s->cands[i].p;
        if (r < cum)
            return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}

static void ref_probs(ref_t *s, const float *logits, float *probs)
{
    const float *row = ref_penalise(s, logits);
    int n;

    memset(probs, 0, sizeof(float) * (size_t)s->vocab_size);
    if (s->params.temperature == 0.0f) {
        probs[ref_argmax(row, s->vocab_size)] = 1.0f;
        return;
    }
    n = ref_candidates(s, row);
    for (int i = 0; i < n; i++)
        probs[s->cands[i].id] = s->cands[i].p;
}

/* ---- random rows -------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / 16777216.0f;
}

#define N_KINDS 11

static void fill_row(float *row, int vocab, int kind)
{
    for (int i = 0; i < vocab; i++) {
        float u = frand();
        switch (kind) {
        case 0: row[i] = 4.0f * u; break;                       /* flat */
        case 1: row[i] = 12.0f * u * u * u; break;              /* peaked */
        case 2: row[i] = (float)(int)(6.0f * u); break;         /* ties */
        case 3: row[i] = 0.0f; break;                           /* equal */
        case 4: row[i] = 0.01f * u; break;                      /* ~flat */
        case 5: /* LLM-like: a bell of logits and a few spikes */
            row[i] = 2.0f * (u + frand() + frand() - 1.5f);
            if (frand() < 0.0005f)
                row[i] += 8.0f + 4.0f * frand();
            break;
        case 6: /* extreme range, -inf and huge negatives */
            row[i] = u < 0.1f ? -INFINITY
                     : u < 0.2f ? -1e30f
                     : 80.0f * u - 40.0f;
            break;
        case 7: /* a block of tied maxima across top-k boundaries */
            row[i] = (i % 97) < 3 ? 5.0f : 5.0f * u;
            break;
        case 8: row[i] = (float)(int)(3.0f * u) * 0.5f; break;  /* coarse */
        case 9: /* one dominant token */
            row[i] = i == vocab / 3 ? 30.0f : u;
            break;
        default: /* non-finite: NaN, +inf, or all -inf */
            row[i] = u;
            break;
        }
    }
    if (kind == N_KINDS - 1) {
        int which = (int)(frand() * 4.0f);
        int at = (int)(frand() * (float)vocab) % vocab;
        if (which == 0)
            row[at] = NAN;
        else if (which == 1)
            row[at] = INFINITY;
        else if (which == 2)
            for (int i = 0; i < vocab; i++)
                row[i] = -INFINITY;
        else
            row[0] = NAN;
    }
}

/* ---- equivalence -------------------------------------------------------- */

static const float g_temps[] = {0.0f, 0.25f, 0.8f, 1.0f, 1.7f};
static const int g_topks[] = {0, 1, 2, 50, 700};
static const float g_topps[] = {1.0f, 0.3f, 0.9f, 0.95f, 0.999f};
static const float g_minps[] = {0.0f, 0.02f, 0.2f};
#define N_COMBOS (5 * 5 * 5 * 3 * 2)

static void combo_params(int c, uint64_t seed, sampler_params_t *p)
{
    sampler_params_init(p);
    p->seed = seed;
    p->temperature = g_temps[c % 5];
    c /= 5;
    p->top_k = g_topks[c % 5];
    c /= 5;
    p->top_p = g_topps[c % 5];
    c /= 5;
    p->min_p = g_minps[c % 3];
    c /= 3;
    if (c % 2) {
        p->repetition_penalty = 1.3f;
        p->presence_penalty = 0.5f;
        p->frequency_penalty = 0.3f;
    }
}

static long g_rows;

/* Runs `rows` rows of the given kinds through both samplers in lockstep;
 * every `probs_every`-th row also compares sampler_probs bit for bit. */
static void run_combo(int combo, int vocab, int rows, int kind0,
                      int probs_every)
{
    sampler_params_t p;
    sampler_t *s;
    ref_t *r;
    float *row = malloc(sizeof(float) * (size_t)vocab);
    float *copy = malloc(sizeof(float) * (size_t)vocab);
    float *pa = malloc(sizeof(float) * (size_t)vocab);
    float *pb = malloc(sizeof(float) * (size_t)vocab);

    combo_params(combo, 1000 + (uint64_t)combo * 7 + (uint64_t)vocab,
                 &p);
    BT_ASSERT_OK(sampler_create(&p, vocab, &s));
    r = ref_create(&p, vocab);
    /* a prompt, some of it repeated, for the penalties */
    for (int i = 0; i < 40; i++) {
        int t = (int)(frand() * (float)vocab) % vocab;
        if (i % 5 == 0)
            t = i % vocab;
        sampler_observe(s, t);
        ref_observe(r, t);
    }
    for (int it = 0; it < rows; it++) {
        int kind = (kind0 + it) % N_KINDS, a, b;
        fill_row(row, vocab, kind);
        if (probs_every > 0 && it % probs_every == 0) {
            sampler_probs(s, row, pa);
            ref_probs(r, row, pb);
            if (memcmp(pa, pb, sizeof(float) * (size_t)vocab) != 0) {
                int at = 0;
                while (memcmp(&pa[at], &pb[at], sizeof(float)) == 0)
                    at++;
                BT_TEST_FAIL("probs: vocab %d combo %d (T %g k %d p %g "
                             "min_p %g pen %d) kind %d: id %d %.9g vs %.9g",
                             vocab, combo, (double)p.temperature, p.top_k,
                             (double)p.top_p, (double)p.min_p,
                             p.repetition_penalty != 1.0f, kind, at,
                             (double)pa[at], (double)pb[at]);
            }
        }
        memcpy(copy, row, sizeof(float) * (size_t)vocab);
        a = sampler_sample(s, row);
        b = ref_sample(r, copy);
        if (a != b)
            BT_TEST_FAIL("vocab %d combo %d (T %g k %d p %g min_p %g pen %d)"
                         " row %d kind %d: new %d, reference %d", vocab,
                         combo, (double)p.temperature, p.top_k,
                         (double)p.top_p, (double)p.min_p,
                         p.repetition_penalty != 1.0f, it, kind, a, b);
        sampler_observe(s, a);
        ref_observe(r, b);
        g_rows++;
    }
    BT_ASSERT_EQ(sampler_uniform(s) == ref_uniform(r), 1);
    sampler_destroy(&s);
    ref_destroy(r);
    free(row);
    free(copy);
    free(pa);
    free(pb);
}

/* ---- timing ------------------------------------------------------------- */

static void time_kind(const char *name, const sampler_params_t *p,
                      float *rows, int n_rows, int vocab)
{
    float *row = malloc(sizeof(float) * (size_t)vocab);
    sampler_t *s;
    ref_t *r;
    uint64_t t0, t1, t2;
    long sa = 0, sb = 0;

    BT_ASSERT_OK(sampler_create(p, vocab, &s));
    r = ref_create(p, vocab);
    t0 = bt_time_ns();
    for (int i = 0; i < n_rows; i++) {
        memcpy(row, rows + (size_t)i * vocab, sizeof(float) * (size_t)vocab);
        sb += ref_sample(r, row);
    }
    t1 = bt_time_ns();
    for (int i = 0; i < n_rows; i++) {
        memcpy(row, rows + (size_t)i * vocab, sizeof(float) * (size_t)vocab);
        sa += sampler_sample(s, row);
    }
    t2 = bt_time_ns();
    BT_ASSERT_EQ(sa, sb);
    fprintf(stderr, "  %-22s reference %8.1f ms   new %7.1f ms   (%.1fx)\n",
            name, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
            (double)(t1 - t0) / (double)(t2 - t1 + 1));
    sampler_destroy(&s);
    ref_destroy(r);
    free(row);
}

static void timing(void)
{
#if defined(__SANITIZE_ADDRESS__)
    int n_rows = 4;
#else
    int n_rows = 64;
#endif
    const int vocab = 128256;
    const char *env = getenv("BT_SAMPLER_BENCH_ROWS");
    float *rows;

    if (env != NULL)
        n_rows = atoi(env);
    if (n_rows <= 0)
        return;
    rows = malloc(sizeof(float) * (size_t)vocab * (size_t)n_rows);
    for (int flat = 0; flat < 2; flat++) {
        sampler_params_t p;
        for (int i = 0; i < n_rows; i++)
            fill_row(rows + (size_t)i * vocab, vocab, flat ? 0 : 5);
        fprintf(stderr, "%d rows x %d, %s logits:\n", n_rows, vocab,
                flat ? "flat (uniform 0..4)" : "LLM-like (bell + spikes)");
        sampler_params_init(&p);
        p.seed = 5;
        p.temperature = 1.0f;
        p.top_p = 0.95f;
        time_kind("T 1, top-p 0.95", &p, rows, n_rows, vocab);
        p.top_p = 0.999f;
        time_kind("T 1, top-p 0.999", &p, rows, n_rows, vocab);
        p.top_p = 1.0f;
        p.top_k = 50;
        time_kind("T 1, top-k 50", &p, rows, n_rows, vocab);
        p.top_k = 0;
        p.min_p = 0.05f;
        time_kind("T 1, min-p 0.05", &p, rows, n_rows, vocab);
        p.min_p = 0.0f;
        time_kind("T 1 only", &p, rows, n_rows, vocab);
        p.top_k = 50;
        p.top_p = 0.95f;
        p.repetition_penalty = 1.2f;
        time_kind("k 50 p 0.95 penalties", &p, rows, n_rows, vocab);
    }
    free(rows);
}

int main(void)
{
    size_t live = bt_alloc_live_count();
    uint64_t t0 = bt_time_ns();
#if defined(__SANITIZE_ADDRESS__)
    const int big_rows = 1; /* ~10x slower: stay well under a minute */
#else
    const int big_rows = 2;
#endif

    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    /* every combination, vocab 512: each kind of row several times */
    for (int c = 0; c < N_COMBOS; c++)
        run_combo(c, 512, 3 * N_KINDS, c, 4);
    /* vocab 128,256: every combination with temperature > 0 on a few
     * rows, walking through the kinds */
    for (int c = 0; c < N_COMBOS; c++) {
        if (g_temps[c % 5] == 0.0f && c % 3 != 0)
            continue;
        run_combo(c, 128256, big_rows, c, (c % 4 == 0) ? 1 : 0);
    }
    fprintf(stderr, "%ld rows identical to the reference (%.1f s)\n",
            g_rows, (double)(bt_time_ns() - t0) / 1e9);
    timing();
    BT_ASSERT_EQ(bt_alloc_live_count(), live);
    BT_TEST_PASS("worker/sampler_equiv");
    return 0;
}
