/*
 * sampler.c - logits -> next token.
 *
 * Order of operations (as in vLLM and transformers): penalties on the raw
 * logits, then temperature, then truncation (top-k, top-p, min-p) on the
 * softmax probabilities, then one draw from the renormalised distribution.
 * Temperature 0 is greedy argmax (lowest id wins a tie, as llama2.c).
 *
 * Seen tokens are kept in a small open-addressing table rather than a
 * vocab-sized array, so a request on a 128k-vocabulary model costs memory
 * in proportion to its own length.
 */
#include "sampler.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

typedef struct {
    int token; /* -1 = empty */
    int count;
} sampler_seen_t;

typedef struct {
    int id;
    float p;
} sampler_cand_t;

struct sampler_s {
    sampler_params_t params;
    int vocab_size;
    uint64_t rng;             /* xorshift64* state */
    sampler_seen_t *seen;     /* (seen_cap) hash table of observed tokens */
    int seen_cap;             /* power of two */
    int seen_n;
    sampler_cand_t *cands;    /* (vocab_size) scratch */
    uint64_t *keys;           /* (vocab_size) the same memory as cands,
                               * as sort keys (a call uses one view) */
    uint64_t *tmp;            /* (vocab_size) radix sort buffer; top-p
                               * samplers only */
    float *scratch;           /* (vocab_size) penalised logits, then the
                               * row's probabilities */
    bool wide;                /* sampler_set_wide: last row's nucleus lay
                               * beyond a device's candidates */
    const uint64_t *mask;     /* ((vocab_size + 63) / 64) allowed tokens
                               * (sampler_set_mask, borrowed); NULL: all */
    sampler_logprobs_t lp;    /* the last sample's (params.logprobs) */
};

_Static_assert(sizeof(sampler_cand_t) == sizeof(uint64_t),
               "keys share the candidates' memory");

void sampler_params_init(sampler_params_t *params)
{
    params_sampling_init(params);
}

bt_status_t sampler_params_validate(const sampler_params_t *p)
{
    char err[160];

    if (params_sampling_validate(p, err, sizeof(err), NULL) != BT_OK)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SAMPLE", "%s", err);
    return BT_OK;
}

/* splitmix64: spreads any seed (0 included) over the xorshift state. */
static uint64_t sampler_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

bt_status_t sampler_create(const sampler_params_t *params, int vocab_size,
                           sampler_t **sampler_p)
{
    sampler_t *s;
    bt_status_t status;

    status = sampler_params_validate(params);
    if (status != BT_OK)
        return status;
    if (vocab_size <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SAMPLE", "vocab size %d",
                        vocab_size);
    s = bt_calloc(1, sizeof(*s), "sampler");
    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->params = *params;
    s->vocab_size = vocab_size;
    s->rng = sampler_mix(params->seed) | 1;
    s->seen_cap = 64;
    s->seen = bt_malloc(sizeof(*s->seen) * (size_t)s->seen_cap,
                        "sampler_seen");
    s->cands = bt_malloc(sizeof(*s->cands) * (size_t)vocab_size,
                         "sampler_cands");
    s->scratch = bt_malloc(sizeof(float) * (size_t)vocab_size,
                           "sampler_scratch");
    s->keys = (uint64_t *)(void *)s->cands;
    if (params->temperature > 0.0f && params->top_p < 1.0f)
        s->tmp = bt_malloc(sizeof(*s->tmp) * (size_t)vocab_size,
                           "sampler_sort");
    if (s->seen == NULL || s->cands == NULL || s->scratch == NULL ||
        (s->tmp == NULL && params->temperature > 0.0f &&
         params->top_p < 1.0f)) {
        sampler_destroy(&s);
        return BT_ERR_NO_MEMORY;
    }
    for (int i = 0; i < s->seen_cap; i++)
        s->seen[i].token = -1;
    *sampler_p = s;
    return BT_OK;
}

void sampler_destroy(sampler_t **sampler_p)
{
    sampler_t *s = *sampler_p;

    if (s == NULL)
        return;
    bt_free(s->seen);
    bt_free(s->cands);
    bt_free(s->tmp);
    bt_free(s->scratch);
    bt_free(s);
    *sampler_p = NULL;
}

static bool sampler_uses_penalties(const sampler_t *s)
{
    return s->params.repetition_penalty != 1.0f ||
           s->params.presence_penalty != 0.0f ||
           s->params.frequency_penalty != 0.0f;
}

static void sampler_seen_insert(sampler_seen_t *table, int cap, int token,
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

void sampler_observe(sampler_t *s, int token)
{
    if (token < 0 || token >= s->vocab_size || !sampler_uses_penalties(s))
        return;
    if ((s->seen_n + 1) * 2 > s->seen_cap) {
        int cap = s->seen_cap * 2;
        sampler_seen_t *grown = bt_malloc(sizeof(*grown) * (size_t)cap,
                                          "sampler_seen");
        if (grown == NULL)
            return; /* penalties degrade; sampling still works */
        for (int i = 0; i < cap; i++)
            grown[i].token = -1;
        for (int i = 0; i < s->seen_cap; i++) {
            if (s->seen[i].token != -1)
                sampler_seen_insert(grown, cap, s->seen[i].token,
                                    s->seen[i].count);
        }
        bt_free(s->seen);
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
    sampler_seen_insert(s->seen, s->seen_cap, token, 1);
}

/* Applies penalties to a copy of the logits; returns the row to use. */
static const float *sampler_penalise_only(sampler_t *s, const float *logits)
{
    const sampler_params_t *p = &s->params;

    if (!sampler_uses_penalties(s) || s->seen_n == 0)
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

/* Penalties, then the grammar's mask (sampler_set_mask): disallowed
 * tokens get -inf, so every later step (argmax, softmax, truncation)
 * sees only allowed ones.  Returns the row to use. */
static const float *sampler_penalise(sampler_t *s, const float *logits)
{
    const float *row = sampler_penalise_only(s, logits);
    const int vocab = s->vocab_size;

    if (s->mask == NULL)
        return row;
    if (row != s->scratch)
        memcpy(s->scratch, logits, sizeof(float) * (size_t)vocab);
    for (int w = 0; w * 64 < vocab; w++) {
        uint64_t m = s->mask[w];
        if (m == ~0ull)
            continue;
        for (int t = w * 64; t < vocab && t < w * 64 + 64; t++)
            if (!(m >> (t - w * 64) & 1))
                s->scratch[t] = -INFINITY;
    }
    return s->scratch;
}

/* First index of the largest value; NaNs never win (x[0] NaN: 0).  Two
 * passes: eight running maxima the compiler vectorizes, then a scan for
 * the first match (same result as the plain loop, ~8x faster on a 128K
 * vocabulary). */
static int sampler_argmax(const float *x, int n)
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

static int sampler_cand_cmp(const void *a, const void *b)
{
    const sampler_cand_t *x = a, *y = b;

    if (x->p > y->p)
        return -1;
    if (x->p < y->p)
        return 1;
    return x->id - y->id;
}

// ---------------------------------------------------------------------
// The sampling steps, and the invariants that make them fast AND exact
//
// Seeded token streams are a contract (seeded requests give the same
// tokens in `baton run`, in a cluster, and through sampler_sample_top),
// so the full-row paths below must produce, bit for bit, what the plain
// implementation (kept as the reference in tests/worker/
// test_sampler_equiv.c) produces.  That implementation is:
//
//   e_i  = expf((l_i - max) / T)        float, max = largest logit
//   sum  = e_0 + e_1 + ...              double, added in id order
//   P_i  = (float)(e_i / sum)
//   F    = {i : P_i >= min_p * (float)(1 / sum)}, in id order (min-p)
//   top-k: quickselect on F leaves its k best first, in the order
//          quickselect's swaps give (sampler_select_top)
//   top-p: cut = (1 - top_p) / (float)(n - 1) (n: the count so far);
//          G = the survivors with P >= cut (all n if none), sorted by
//          (P desc, id asc); the nucleus is G's prefix up to the first
//          element at which the double running sum reaches top_p
//   keep = double sum of the survivors' P in list order; q_i =
//          (float)(P_i / keep); one uniform r; the token is the first
//          whose float running sum of q exceeds r (else the last).
//
// What the token depends on is therefore: the survivors' P values, their
// list order, and the order of every sum.  The fast paths keep all three:
//  - (P desc, id asc) is a total order on finite P (ids are unique).
//    It is the numeric order of the 64-bit key (bits(P) << 32 | ~id):
//    for 0 <= P <= 1 the float bits of P order like P.  Any sort of the
//    keys therefore gives the reference's qsort order, whatever the
//    algorithm.
//  - min-p, the top-k SET and the top-p cut each keep a prefix of that
//    order, so with top-p the list is simply the sorted order's prefix
//    of length min(top_k, #{P >= cut}) (or top_k / n when no P passes
//    the cut), cut off where the running sum reaches top_p.  Only that
//    prefix is sorted: a histogram of the keys' high bits finds a bucket
//    boundary past which the count or the sum (bounded from below, with
//    a margin far above double rounding) is enough, the keys above it
//    are gathered in id order and radix sorted (stable, so ties stay id
//    ascending).  Should the margin ever not suffice, the whole list is
//    sorted instead.
//  - top-k without top-p keeps quickselect's order, so it runs the same
//    quickselect on the keys (same pivots, same swaps: comparing keys
//    gives the same answers as comparing (P, id)); k = 1 is the largest
//    key.
//  - All sums are the same double or float additions in the same order.
// A row whose normaliser is not finite (NaN or infinite logits, or a
// temperature so small that 1/T overflows) takes the reference's own
// steps (sampler_candidates_legacy), so even those rows keep their ids.

#define SAMPLER_SMALL_SORT 64  /* insertion sort at or below this */
#define SAMPLER_HIST_SHIFT 52  /* key >> 52: float bits >> 20 of P */
#define SAMPLER_HIST_N 1024    /* P <= 1: bits >> 20 <= 0x3f8 */
#define SAMPLER_RADIX_BITS 11
#define SAMPLER_RADIX_N (1 << SAMPLER_RADIX_BITS)

static uint64_t sampler_key(float p, int id)
{
    uint32_t bits;

    memcpy(&bits, &p, sizeof(bits));
    return ((uint64_t)bits << 32) | (uint32_t)(0xffffffffu - (uint32_t)id);
}

static float sampler_key_p(uint64_t key)
{
    uint32_t bits = (uint32_t)(key >> 32);
    float p;

    memcpy(&p, &bits, sizeof(p));
    return p;
}

static int sampler_key_id(uint64_t key)
{
    return (int)(0xffffffffu - (uint32_t)key);
}

#define SAMPLER_BLOCK 64 /* positions classified at a time */

/* One side of a Hoare partition of c[lo..hi] around the value pv: the
 * positions where the scan from the left stops (c[x] <= pv, i.e. "not
 * better than the pivot"), ascending, or from the right (c[x] >= pv),
 * descending, classified SAMPLER_BLOCK at a time without branches. */
typedef struct {
    int pos[SAMPLER_BLOCK]; /* stops found in the current block */
    int n;                  /* how many */
    int at;                 /* next one to hand out */
    int next;               /* next position to classify */
} sampler_scan_t;

/* The next stop, or INT_MAX (left) / INT_MIN (right) when none is left
 * in [lo, hi]. */
static int sampler_scan_left(sampler_scan_t *sc, const uint64_t *c, int hi,
                             uint64_t pv)
{
    while (sc->at == sc->n) {
        int end = sc->next + SAMPLER_BLOCK - 1 < hi ? sc->next +
                                                      SAMPLER_BLOCK - 1
                                                    : hi;
        if (sc->next > hi)
            return INT_MAX;
        sc->n = 0;
        sc->at = 0;
        for (int x = sc->next; x <= end; x++) {
            sc->pos[sc->n] = x;
            sc->n += c[x] <= pv;
        }
        sc->next = end + 1;
    }
    return sc->pos[sc->at++];
}

static int sampler_scan_right(sampler_scan_t *sc, const uint64_t *c, int lo,
                              uint64_t pv)
{
    while (sc->at == sc->n) {
        int end = sc->next - (SAMPLER_BLOCK - 1) > lo ? sc->next -
                                                        (SAMPLER_BLOCK - 1)
                                                      : lo;
        if (sc->next < lo)
            return INT_MIN;
        sc->n = 0;
        sc->at = 0;
        for (int x = sc->next; x >= end; x--) {
            sc->pos[sc->n] = x;
            sc->n += c[x] >= pv;
        }
        sc->next = end - 1;
    }
    return sc->pos[sc->at++];
}

/* The reference's quickselect, on keys: moves the k most probable to the
 * front, in the same (unsorted) order as sampler_select_top on the same
 * candidates (a larger key is a "smaller" candidate there).
 *
 * Its Hoare partition is computed without the scalar scans' branch
 * misses, with the same swaps: with unique keys, the scans stop at the
 * positions a_1 < a_2 < ... holding keys <= the pivot (from the left)
 * and b_1 > b_2 > ... holding keys >= it (from the right), classified
 * on the row as it was before the partition (a scan only ever reads a
 * position that no swap has touched yet, while a_t <= b_t); the t-th
 * swap exchanges a_t and b_t, for as long as a_t <= b_t.  After the
 * last swap (T), the scans stop once more at i = min(a_{T+1}, b_T) and
 * j = max(b_{T+1}, a_T) (the swapped-in keys stop them), or, when a_T =
 * b_T (the pivot swapped with itself), i = a_T + 1 and j = a_T - 1.  A
 * block classified early may see a position that a swap changed since;
 * such positions lie beyond b_T (or before a_T), where min / max ignore
 * them. */
static void sampler_select_top_keys(uint64_t *c, int n, int k)
{
    int lo = 0, hi = n - 1;

    while (lo < hi) {
        uint64_t pivot = c[(lo + hi) / 2];
        sampler_scan_t left = {.next = lo}, right = {.next = hi};
        int i, j, a, b, last_a = lo - 1, last_b = hi + 1;

        for (;;) {
            a = sampler_scan_left(&left, c, hi, pivot);
            b = sampler_scan_right(&right, c, lo, pivot);
            if (a > b) {
                i = a < last_b ? a : last_b;
                j = b > last_a ? b : last_a;
                break;
            }
            {
                uint64_t t = c[a];
                c[a] = c[b];
                c[b] = t;
            }
            if (a == b) {
                i = a + 1;
                j = a - 1;
                break;
            }
            last_a = a;
            last_b = b;
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Sorts keys descending (unique keys: no stability question). */
static void sampler_sort_small(uint64_t *a, int n)
{
    for (int i = 1; i < n; i++) {
        uint64_t x = a[i];
        int j = i;
        while (j > 0 && a[j - 1] < x) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Sorts n keys of P in [0, 1] by P descending, stably (LSD radix on the
 * float bits of P), so keys given in id order come out in key order
 * descending.  Ping-pongs between a and tmp; returns where the result
 * is. */
static uint64_t *sampler_sort_radix(uint64_t *a, uint64_t *tmp, int n)
{
    static const int shifts[3] = {0, SAMPLER_RADIX_BITS,
                                  2 * SAMPLER_RADIX_BITS};
    int hist[3][SAMPLER_RADIX_N];

    memset(hist, 0, sizeof(hist));
    for (int i = 0; i < n; i++) {
        uint32_t d = ~(uint32_t)(a[i] >> 32); /* ascending = P desc */
        hist[0][d & (SAMPLER_RADIX_N - 1)]++;
        hist[1][(d >> shifts[1]) & (SAMPLER_RADIX_N - 1)]++;
        hist[2][d >> shifts[2]]++;
    }
    for (int pass = 0; pass < 3; pass++) {
        int *h = hist[pass], total = 0;
        bool trivial = false;

        for (int b = 0; b < SAMPLER_RADIX_N; b++) {
            int c = h[b];
            if (c == n) {
                trivial = true; /* one digit value: order unchanged */
                break;
            }
            h[b] = total;
            total += c;
        }
        if (trivial)
            continue;
        for (int i = 0; i < n; i++) {
            uint32_t d = ~(uint32_t)(a[i] >> 32);
            tmp[h[(d >> shifts[pass]) & (SAMPLER_RADIX_N - 1)]++] = a[i];
        }
        {
            uint64_t *t = a;
            a = tmp;
            tmp = t;
        }
    }
    return a;
}

/* The top-p nucleus of the n keys in c (id order), of which only the
 * first `limit` in sorted order may be kept: returns the sorted nucleus
 * (in c or s->tmp), its length in *n_p and the running sum at its end in
 * *keep_p (the sum of its P in order: the reference's `keep`), or NULL
 * when the gathered prefix fell short.  c may be reordered. */
static const uint64_t *sampler_nucleus(sampler_t *s, uint64_t *c, int n,
                                       int limit, double top_p, int *n_p,
                                       double *keep_p)
{
    const uint64_t *sorted = c;
    int m = n, take, nn;
    double cum = 0.0;

    if (n > SAMPLER_SMALL_SORT) {
        int cnt[SAMPLER_HIST_N] = {0};
        int b, seen = 0;
        double low = 0.0;

        /* bucket b holds P with float bits in [b << 20, (b + 1) << 20):
         * P >= the bucket's lowest value, so `low` bounds the sum of the
         * buckets walked from below */
        for (int i = 0; i < n; i++)
            cnt[c[i] >> SAMPLER_HIST_SHIFT]++;
        for (b = SAMPLER_HIST_N - 1; b > 0; b--) {
            seen += cnt[b];
            low += (double)cnt[b] *
                   (double)sampler_key_p((uint64_t)b << SAMPLER_HIST_SHIFT);
            if (seen >= limit || low >= top_p + 1e-6)
                break;
        }
        if (b > 0) {
            uint64_t edge = (uint64_t)b << SAMPLER_HIST_SHIFT;
            m = 0;
            for (int i = 0; i < n; i++) {
                c[m] = c[i];
                m += c[i] >= edge;
            }
        }
    }
    if (m <= SAMPLER_SMALL_SORT) {
        sampler_sort_small(c, m);
        sorted = c;
    } else {
        sorted = sampler_sort_radix(c, s->tmp, m);
    }
    take = limit < m ? limit : m;
    nn = -1;
    for (int i = 0; i < take; i++) {
        cum += sampler_key_p(sorted[i]);
        if (cum >= top_p) {
            nn = i + 1;
            break;
        }
    }
    if (nn < 0 && m >= limit)
        nn = limit; /* the running sum never reached top_p */
    if (nn >= 0) {
        *n_p = nn;
        *keep_p = cum;
        return sorted;
    }
    /* the gathered prefix fell short (a margin failure that double
     * rounding cannot cause): the caller sorts all */
    *n_p = -1;
    return NULL;
}

/* The reference's order, when it is not id order: the candidates in draw
 * order as keys, or (keys NULL) ids 0..n-1 with probabilities p. */
typedef struct {
    const uint64_t *keys; /* (n) candidates in draw order, or NULL */
    const float *p;       /* (n) P by id when keys is NULL */
    int n;                /* number of candidates */
    double keep;          /* sum of their P in draw order (double) */
} sampler_dist_t;

/* Builds F (min-p survivors, or all ids) as keys in id order from the
 * probabilities in p; `expect` is F's size when known (else -1).
 * Returns F's size. */
static int sampler_survivors(const sampler_t *s, const float *p, float cut,
                             int expect, uint64_t *keys)
{
    const int vocab = s->vocab_size;
    int m = 0;

    if (cut <= 0.0f) {
        for (int i = 0; i < vocab; i++)
            keys[i] = sampler_key(p[i], i);
        return vocab;
    }
    if (expect >= 0 && expect < vocab / 16) {
        /* few survivors: a branch that is almost never taken */
        for (int i = 0; i < vocab; i++)
            if (p[i] >= cut)
                keys[m++] = sampler_key(p[i], i);
        return m;
    }
    for (int i = 0; i < vocab; i++) {
        keys[m] = sampler_key(p[i], i);
        m += p[i] >= cut;
    }
    return m;
}

/* The fast full-row path: same candidates, same order, same sums as the
 * reference (see the section comment).  Returns false, touching nothing
 * but s->scratch, when the row's normaliser is not finite. */
static bool sampler_dist(sampler_t *s, const float *row, sampler_dist_t *d)
{
    const sampler_params_t *prm = &s->params;
    const int vocab = s->vocab_size;
    float *p = s->scratch; /* may be row itself: updated in place */
    uint64_t *keys = s->keys;
    float max = row[sampler_argmax(row, vocab)];
    float inv_t = 1.0f / prm->temperature, cut_m = 0.0f, cut_p;
    double sum = 0.0, keep = 0.0;
    int n, nk, n_f = 0;
    bool top_k;

    for (int i = 0; i < vocab; i++) {
        float e = expf((row[i] - max) * inv_t);
        p[i] = e;
        sum += e;
    }
    if (!(sum >= 1.0 && sum <= DBL_MAX)) /* the max's term is 1 */
        return false;

    if (prm->min_p <= 0.0f && (prm->top_k <= 0 || prm->top_k >= vocab) &&
        prm->top_p >= 1.0f) {
        /* plain temperature: every id, in id order (one loop: the sum's
         * dependency chain hides the divisions) */
        for (int i = 0; i < vocab; i++) {
            float q = (float)(p[i] / sum);
            p[i] = q;
            keep += q;
        }
        d->keys = NULL;
        d->p = p;
        d->n = vocab;
        d->keep = keep;
        return true;
    }
    if (prm->min_p > 0.0f)
        cut_m = prm->min_p * (float)(1.0 / sum); /* the max's P is 1/sum */
    for (int i = 0; i < vocab; i++) {
        float q = (float)(p[i] / sum);
        p[i] = q;
        n_f += q >= cut_m;
    }
    n = sampler_survivors(s, p, cut_m, n_f, keys);
    top_k = prm->top_k > 0 && prm->top_k < n;
    nk = top_k ? prm->top_k : n;

    if (prm->top_p >= 1.0f) {
        if (top_k && nk == 1) {
            int best = 0;
            for (int i = 1; i < n; i++)
                best = keys[i] > keys[best] ? i : best;
            keys[0] = keys[best];
        } else if (top_k) {
            sampler_select_top_keys(keys, n, nk);
        }
        for (int i = 0; i < nk; i++)
            keep += sampler_key_p(keys[i]);
        d->keys = keys;
        d->n = nk;
        d->keep = keep;
        return true;
    }

    /* top-p over the first nk of the sorted order: the survivors of the
     * cut are a prefix of it too */
    {
        const uint64_t *nucleus;
        int g = 0, limit, nn;

        cut_p = (1.0f - prm->top_p) / (float)(nk > 1 ? nk - 1 : 1);
        for (int i = 0; i < n; i++)
            g += sampler_key_p(keys[i]) >= cut_p;
        limit = g < nk ? g : nk;
        if (limit == 0)
            limit = nk;
        nucleus = sampler_nucleus(s, keys, n, limit, (double)prm->top_p,
                                  &nn, &keep);
        if (nucleus == NULL) {
            /* sort everything (never expected; see sampler_nucleus) */
            n = sampler_survivors(s, p, cut_m, n_f, keys);
            nucleus = n <= SAMPLER_SMALL_SORT
                          ? (sampler_sort_small(keys, n), keys)
                          : sampler_sort_radix(keys, s->tmp, n);
            nn = limit;
            for (int i = 0; i < limit; i++) {
                keep += sampler_key_p(nucleus[i]);
                if (keep >= (double)prm->top_p) {
                    nn = i + 1;
                    break;
                }
            }
        }
        d->keys = nucleus;
        d->n = nn;
        d->keep = keep;
    }
    return true;
}

/* Moves the k most probable to the front (unordered). */
static void sampler_select_top(sampler_cand_t *c, int n, int k)
{
    int lo = 0, hi = n - 1;

    while (lo < hi) {
        sampler_cand_t pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (sampler_cand_cmp(&c[i], &pivot) < 0)
                i++;
            while (sampler_cand_cmp(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                sampler_cand_t t = c[i];
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

/* The reference's steps, for rows whose normaliser is not finite (NaN or
 * infinite logits): the truncated, renormalised candidate list in
 * s->cands.  Where every probability is NaN and min-p leaves nothing
 * (the reference then read before the list), the row's argmax is the one
 * candidate.  Returns the candidate count (>= 1). */
static int sampler_candidates_legacy(sampler_t *s, const float *logits)
{
    const sampler_params_t *p = &s->params;
    int vocab = s->vocab_size, n = vocab;
    float max = logits[sampler_argmax(logits, vocab)];
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
        /* max prob is exp(0)/sum = 1/sum */
        float cut = p->min_p * (float)(1.0 / sum);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (s->cands[i].p >= cut)
                s->cands[m++] = s->cands[i];
        }
        n = m;
        if (n == 0) {
            s->cands[0].id = sampler_argmax(logits, vocab);
            s->cands[0].p = 1.0f;
            return 1;
        }
    }
    if (p->top_k > 0 && p->top_k < n) {
        sampler_select_top(s->cands, n, p->top_k);
        n = p->top_k;
    }
    if (p->top_p < 1.0f) {
        /* Tokens below (1-top_p)/(n-1) can never be in the nucleus, so
         * drop them before sorting (llama2.c's trick). */
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
        qsort(s->cands, (size_t)n, sizeof(*s->cands), sampler_cand_cmp);
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

float sampler_uniform(sampler_t *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545f4914f6cdd1dull) >> 40) /
           16777216.0f;
}

void sampler_skip(sampler_t *s, int n)
{
    /* sampler_sample draws exactly one uniform per sampled token when
     * temperature > 0, and none when greedy. */
    if (s->params.temperature == 0.0f)
        return;
    for (int i = 0; i < n; i++)
        (void)sampler_uniform(s);
}

void sampler_logprobs_row(const float *logits, int vocab, int token,
                          int n_top, sampler_logprobs_t *out)
{
    float m = -INFINITY;
    double sum = 0.0;
    float lse;
    int n = 0;

    n_top = BT_MIN(BT_MAX(n_top, 0), BT_MIN(vocab, PARAMS_MAX_LOGPROBS));
    for (int i = 0; i < vocab; i++)
        m = logits[i] > m ? logits[i] : m;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - (double)m);
    lse = (float)((double)m + log(sum));
    /* top n_top by insertion: ids ascending and a strict > keep the
     * lower id first among ties, as the argmax does */
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float v = logits[i];
        int j;

        if (n == n_top && !(v > out->top_logprobs[n - 1]))
            continue;
        j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > out->top_logprobs[j - 1]) {
            out->top_logprobs[j] = out->top_logprobs[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_logprobs[j] = v;
        out->top_ids[j] = i;
    }
    for (int j = 0; j < n; j++)
        out->top_logprobs[j] -= lse;
    out->n_top = n;
    out->logprob = token >= 0 && token < vocab ? logits[token] - lse
                                               : -INFINITY;
}

const sampler_logprobs_t *sampler_last_logprobs(const sampler_t *s)
{
    return s->params.logprobs ? &s->lp : NULL;
}

bt_status_t sampler_prompt_lp_create(int n, int k,
                                     sampler_prompt_lp_t **plp_p)
{
    sampler_prompt_lp_t *plp;
    size_t m = n > 1 ? (size_t)n - 1 : 1;

    if (n < 1 || k < 0 || k > PARAMS_MAX_LOGPROBS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SAMPLE",
                        "prompt logprobs of %d tokens, %d alternatives", n,
                        k);
    plp = bt_calloc(1, sizeof(*plp), "sampler_prompt_lp");
    if (plp == NULL)
        return BT_ERR_NO_MEMORY;
    plp->n = n;
    plp->k = k;
    plp->lps = bt_calloc(m, sizeof(float), "sampler_prompt_lp");
    plp->top_ids = bt_calloc(m * (size_t)BT_MAX(k, 1), sizeof(int),
                             "sampler_prompt_lp");
    plp->top_lps = bt_calloc(m * (size_t)BT_MAX(k, 1), sizeof(float),
                             "sampler_prompt_lp");
    if (plp->lps == NULL || plp->top_ids == NULL || plp->top_lps == NULL) {
        sampler_prompt_lp_destroy(&plp);
        return BT_ERR_NO_MEMORY;
    }
    *plp_p = plp;
    return BT_OK;
}

void sampler_prompt_lp_destroy(sampler_prompt_lp_t **plp_p)
{
    sampler_prompt_lp_t *plp = *plp_p;

    if (plp == NULL)
        return;
    bt_free(plp->lps);
    bt_free(plp->top_ids);
    bt_free(plp->top_lps);
    bt_free(plp);
    *plp_p = NULL;
}

void sampler_prompt_lp_rows(sampler_prompt_lp_t *plp, const float *logits,
                            int vocab, const int *tokens, int pos0,
                            int n_rows)
{
    sampler_logprobs_t lp;

    for (int r = 0; r < n_rows; r++) {
        int p = pos0 + r + 1; /* the position this row scores */
        if (p < 1 || p >= plp->n)
            continue;
        sampler_logprobs_row(logits + (size_t)r * (size_t)vocab, vocab,
                             tokens[p], plp->k, &lp);
        plp->lps[p - 1] = lp.logprob;
        for (int j = 0; j < plp->k; j++) {
            /* n_top < k only for a vocabulary smaller than k */
            plp->top_ids[(size_t)(p - 1) * plp->k + j] =
                j < lp.n_top ? lp.top_ids[j] : 0;
            plp->top_lps[(size_t)(p - 1) * plp->k + j] =
                j < lp.n_top ? lp.top_logprobs[j] : -INFINITY;
        }
    }
}

static int sampler_sample_row(sampler_t *s, float *logits);

int sampler_sample(sampler_t *s, float *logits)
{
    int tok = sampler_sample_row(s, logits);

    if (s->params.logprobs)
        sampler_logprobs_row(logits, s->vocab_size, tok,
                             s->params.top_logprobs, &s->lp);
    return tok;
}

static int sampler_sample_row(sampler_t *s, float *logits)
{
    const float *row = sampler_penalise(s, logits);
    sampler_dist_t d;
    float r, cum = 0.0f;
    int n;

    if (s->params.temperature == 0.0f)
        return sampler_argmax(row, s->vocab_size);
    if (sampler_dist(s, row, &d)) {
        r = sampler_uniform(s);
        if (d.keys == NULL) {
            for (int i = 0; i < d.n; i++) {
                cum += (float)(d.p[i] / d.keep);
                if (r < cum)
                    return i;
            }
            return d.n - 1; /* rounding */
        }
        for (int i = 0; i < d.n; i++) {
            cum += (float)(sampler_key_p(d.keys[i]) / d.keep);
            if (r < cum)
                return sampler_key_id(d.keys[i]);
        }
        return sampler_key_id(d.keys[d.n - 1]); /* rounding */
    }
    row = sampler_penalise(s, logits); /* the scratch row was overwritten */
    n = sampler_candidates_legacy(s, row);
    r = sampler_uniform(s);
    for (int i = 0; i < n; i++) {
        cum += s->cands[i].p;
        if (r < cum)
            return s->cands[i].id;
    }
    return s->cands[n - 1].id; /* rounding */
}

void sampler_probs(sampler_t *s, const float *logits, float *probs)
{
    const float *row = sampler_penalise(s, logits);
    sampler_dist_t d;
    int n;

    memset(probs, 0, sizeof(float) * (size_t)s->vocab_size);
    if (s->params.temperature == 0.0f) {
        probs[sampler_argmax(row, s->vocab_size)] = 1.0f;
        return;
    }
    if (sampler_dist(s, row, &d)) {
        if (d.keys == NULL) {
            for (int i = 0; i < d.n; i++)
                probs[i] = (float)(d.p[i] / d.keep);
        } else {
            for (int i = 0; i < d.n; i++)
                probs[sampler_key_id(d.keys[i])] =
                    (float)(sampler_key_p(d.keys[i]) / d.keep);
        }
        return;
    }
    row = sampler_penalise(s, logits);
    n = sampler_candidates_legacy(s, row);
    for (int i = 0; i < n; i++)
        probs[s->cands[i].id] = s->cands[i].p;
}

bool sampler_is_argmax(const sampler_t *s)
{
    return s->params.temperature == 0.0f && !sampler_uses_penalties(s) &&
           s->mask == NULL && !s->params.logprobs;
}

void sampler_set_mask(sampler_t *s, const uint64_t *allowed)
{
    s->mask = allowed;
}

// ---------------------------------------------------------------------
// Sampling from a device's top candidates

sampler_need_t sampler_need(const sampler_t *s)
{
    const sampler_params_t *p = &s->params;

    if (sampler_uses_penalties(s) || s->mask != NULL || p->logprobs)
        return SAMPLER_NEED_ROW;
    if (p->temperature == 0.0f)
        return SAMPLER_NEED_ARGMAX;
    if (p->top_p < 1.0f || p->min_p > 0.0f || p->top_k == 1)
        return SAMPLER_NEED_TOP;
    return SAMPLER_NEED_ROW;
}

float sampler_temperature(const sampler_t *s)
{
    return s->params.temperature;
}

const sampler_params_t *sampler_params(const sampler_t *s)
{
    return &s->params;
}

float sampler_uniform_peek(const sampler_t *s)
{
    uint64_t x = s->rng;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return (float)((x * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f;
}

void sampler_set_wide(sampler_t *s, bool wide)
{
    s->wide = wide;
}

bool sampler_wide(const sampler_t *s)
{
    return s->wide;
}

bool sampler_is_dist(const sampler_t *s)
{
    const sampler_params_t *p = &s->params;

    if (p->temperature == 0.0f || sampler_uses_penalties(s) ||
        s->mask != NULL || p->logprobs)
        return false;
    return p->top_p < 1.0f || p->top_k <= 1 || p->top_k >= s->vocab_size;
}

static int sampler_cand_id_cmp(const void *a, const void *b)
{
    const sampler_cand_t *x = a, *y = b;

    return (x->id > y->id) - (x->id < y->id);
}

/* Mirrors sampler_candidates() + the draw of sampler_sample() step by
 * step.  The full row's order is (p desc, id asc) wherever it is sorted;
 * the candidates are its first k elements except that elements tied in p
 * with the k-th may hide outside them, so only candidates with p above
 * the k-th's are "reliable" (a prefix of the full sorted order). */
bool sampler_sample_top(sampler_t *s, const int *ids, const float *logits,
                        int k, double sum, int *token)
{
    const sampler_params_t *p = &s->params;
    const int vocab = s->vocab_size;
    sampler_cand_t *c = s->cands;
    bool complete = k == vocab, set_known, n_known;
    float inv_t, max, p_edge, cut_m = 0.0f, cut_p = 0.0f, r, cumf = 0.0f;
    int n_rel, n_f = vocab, n = vocab, nn = -1;
    double keep = 0.0;

    if (p->temperature == 0.0f || sampler_uses_penalties(s) ||
        s->mask != NULL || p->logprobs || k < 1 ||
        k > vocab || !(sum >= 1.0))
        return false;
    inv_t = 1.0f / p->temperature;
    max = logits[0];
    for (int i = 0; i < k; i++) {
        float e = expf((logits[i] - max) * inv_t);
        c[i].id = ids[i];
        c[i].p = (float)(e / sum);
    }
    p_edge = c[k - 1].p;
    n_rel = k;
    if (!complete)
        while (n_rel > 0 && !(c[n_rel - 1].p > p_edge))
            n_rel--;

    /* min-p: the passing set F (id order in the full path) */
    set_known = complete; /* F is exactly the passing candidates */
    if (p->min_p > 0.0f) {
        cut_m = p->min_p * (float)(1.0 / sum);
        if (complete || p_edge < cut_m) {
            set_known = true;
            n_f = 0;
            for (int i = 0; i < k; i++)
                n_f += c[i].p >= cut_m;
        } else {
            n_f = -1; /* >= k */
        }
    }
    /* top-k: n = the count after min-p and top-k */
    if (n_f >= 0) {
        n = p->top_k > 0 && p->top_k < n_f ? p->top_k : n_f;
        n_known = true;
    } else if (p->top_k > 0 && p->top_k <= k) {
        n = p->top_k; /* n_f >= k >= top_k: equal counts either way */
        n_known = true;
    } else {
        n_known = false; /* n >= k */
    }

    if (p->top_p >= 1.0f) {
        if (n_known && n == 1) {
            /* one survivor, the first of the sorted order */
            if (n_rel < 1)
                return false;
            qsort(c, (size_t)n_rel, sizeof(*c), sampler_cand_cmp);
            nn = 1;
        } else if (!set_known || (p->top_k > 0 && p->top_k < n_f)) {
            /* id order over an unknown set, or quickselect's order */
            return false;
        } else {
            nn = 0;
            for (int i = 0; i < k; i++)
                if (p->min_p <= 0.0f || c[i].p >= cut_m)
                    c[nn++] = c[i];
            qsort(c, (size_t)nn, sizeof(*c), sampler_cand_id_cmp);
        }
    } else {
        /* top-p: S = the sorted prefix that passes min-p, top-k and the
         * (1 - top_p) / (n - 1) cut; the nucleus is S's first elements
         * up to cumulative top_p, or all of S */
        double cum = 0.0;
        int i;

        cut_p = (1.0f - p->top_p) /
                (float)(n_known ? (n > 1 ? n - 1 : 1) : (k > 1 ? k - 1 : 1));
        qsort(c, (size_t)n_rel, sizeof(*c), sampler_cand_cmp);
        for (i = 0; i < n_rel; i++) {
            bool in_s = (!n_known || i < n) &&
                        (p->min_p <= 0.0f || c[i].p >= cut_m) &&
                        c[i].p >= cut_p;
            if (!in_s) {
                /* S ends here: exact unless the cut was only a bound; an
                 * empty S makes the full path keep all n */
                if ((c[i].p < cut_p && !n_known) || i == 0)
                    return false;
                nn = i;
                break;
            }
            cum += c[i].p;
            if (cum >= p->top_p) {
                nn = i + 1;
                break;
            }
        }
        if (nn < 0) {
            if (!complete)
                return false; /* S may go on beyond the candidates */
            nn = n_rel;
        }
    }
    for (int i = 0; i < nn; i++)
        keep += c[i].p;
    for (int i = 0; i < nn; i++)
        c[i].p = (float)(c[i].p / keep);
    r = sampler_uniform(s);
    for (int i = 0; i < nn; i++) {
        cumf += c[i].p;
        if (r < cumf) {
            *token = c[i].id;
            return true;
        }
    }
    *token = c[nn - 1].id; /* rounding */
    return true;
}
