/*
 * cpu_attention.c - attention over the paged KV cache for a chunk of
 * query tokens of one sequence and one GQA group of heads.
 *
 * The backend writes the new tokens' K/V into their slots first, so the
 * queries see cached slots and new tokens the same way: through the block
 * table.  Per query head of the group:
 *   1. scores S (n_q, slots) = Q K^T with the weight-stationary matmul,
 *      one call per run of adjacent block ids (adjacent blocks are one
 *      contiguous region), so each key row is read once for all queries;
 *   2. scale by 1/sqrt(head_dim), hide slots the query may not see, and
 *      softmax each row (vectorized exp);
 *   3. out = P V, walking the value rows once and adding each into every
 *      query row that gives it weight.
 * Causal chunks skip the slots past their last query entirely.
 */
#include <math.h>
#include <string.h>

#include "cpu_int.h"

/* y += a * x over n floats. */
static inline void cpu_attn_axpy(float *y, float a, const float *x, int n)
{
    for (int j = 0; j < n; j++)
        y[j] += a * x[j];
}

/* Number of slots new token i sees a prefix of: everything up to its own
 * slot (causal), or all slots when a mask picks them. */
static inline int cpu_attn_row_limit(const cpu_attn_seq_t *s, int i)
{
    return s->mask != NULL ? s->ctx_len + s->n_new : s->ctx_len + i + 1;
}

/* Slots [p0, p0 + *len_p) that start at p0 and lie in consecutive block
 * ids (one contiguous region of the pool); returns the region's first
 * row offset. */
static inline size_t cpu_attn_run(const cpu_attn_seq_t *s, int p0,
                                  int limit, int *len_p)
{
    int bs = s->block_size;
    int b = p0 / bs;
    int first = s->block_table[b];
    int end = (b + 1) * bs;

    while (end < limit && s->block_table[end / bs] == first + (end / bs - b))
        end += bs;
    *len_p = (end < limit ? end : limit) - p0;
    return ((size_t)first * bs + p0 % bs) * s->kv_row;
}

static void cpu_attention_head(float *out, int ldo, const float *q, int ldq,
                               const cpu_attn_seq_t *s, int kv_head, int i0,
                               int n_q, float *S)
{
    int hd = s->head_dim;
    int n_slots = s->ctx_len + s->n_new;
    int limit = cpu_attn_row_limit(s, i0 + n_q - 1); /* widest row */
    const float *kb = s->k_layer + (size_t)kv_head * hd;
    const float *vb = s->v_layer + (size_t)kv_head * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int len;

    /* 1. S = Q K^T over slots [0, limit) */
    for (int p0 = 0; p0 < limit; p0 += len) {
        size_t off = cpu_attn_run(s, p0, limit, &len);

        cpu__matmul(S + p0, n_slots, q, ldq, kb + off, s->kv_row, NULL, n_q,
                    hd, 0, len, false);
    }

    /* 2. masked, scaled softmax per query row */
    for (int r = 0; r < n_q; r++) {
        int i = i0 + r;
        int lim = cpu_attn_row_limit(s, i);
        float *row = S + (size_t)r * n_slots;
        float max = -INFINITY, sum = 0.0f, inv;

        for (int p = 0; p < lim; p++) {
            row[p] *= scale;
            if (s->mask != NULL && p >= s->ctx_len &&
                s->mask[(size_t)i * s->n_new + (p - s->ctx_len)] == 0)
                row[p] = -INFINITY;
            max = row[p] > max ? row[p] : max;
        }
        if (max == -INFINITY) { /* a mask row that hides everything */
            memset(row, 0, (size_t)limit * sizeof(*row));
            continue;
        }
        for (int p = 0; p < lim; p++)
            row[p] -= max;
        cpu__exp_inplace(row, lim);
        for (int p = 0; p < lim; p++)
            sum += row[p];
        inv = 1.0f / sum;
        for (int p = 0; p < lim; p++)
            row[p] *= inv;
        for (int p = lim; p < limit; p++)
            row[p] = 0.0f;
    }

    /* 3. out = P V */
    for (int r = 0; r < n_q; r++)
        memset(out + (size_t)r * ldo, 0, (size_t)hd * sizeof(*out));
    for (int p0 = 0; p0 < limit; p0 += len) {
        const float *v = vb + cpu_attn_run(s, p0, limit, &len);

        for (int p = p0; p < p0 + len; p++, v += s->kv_row) {
            for (int r = 0; r < n_q; r++) {
                float w = S[(size_t)r * n_slots + p];

                if (w != 0.0f)
                    cpu_attn_axpy(out + (size_t)r * ldo, w, v, hd);
            }
        }
    }
}

void cpu__attention(float *out, int ldo, const float *q, int ldq,
                    const cpu_attn_seq_t *s, int kv_head, int group, int i0,
                    int n_q, float *scratch)
{
    for (int h = 0; h < group; h++)
        cpu_attention_head(out + (size_t)h * s->head_dim, ldo,
                           q + (size_t)h * s->head_dim, ldq, s, kv_head, i0,
                           n_q, scratch);
}
