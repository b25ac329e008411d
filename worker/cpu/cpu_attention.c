/*
 * cpu_attention.c - one query row of attention over the paged KV cache.
 *
 * The backend writes the new tokens' K/V into their slots first, so a
 * query sees cached slots and new tokens the same way: through the block
 * table.  Scores are scaled by 1/sqrt(head_dim), softmaxed, and used to
 * average the value rows.  Cached slots are walked block by block (no
 * division per slot); new tokens are filtered by the mask row.
 */
#include <math.h>
#include <string.h>

#include "cpu_int.h"

static inline float cpu_attn_dot(const float *a, const float *b, int n)
{
    float acc[8] = { 0 };
    float sum = 0.0f;
    int j = 0;

    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[j + l] * b[j + l];
    for (; j < n; j++)
        acc[j & 7] += a[j] * b[j];
    for (int l = 0; l < 8; l++)
        sum += acc[l];
    return sum;
}

static inline void cpu_attn_axpy(float *y, float a, const float *x, int n)
{
    for (int j = 0; j < n; j++)
        y[j] += a * x[j];
}

static inline size_t cpu_attn_slot(const cpu_attn_seq_t *s, int p)
{
    int b = s->block_table[p / s->block_size];

    return ((size_t)b * s->block_size + p % s->block_size) * s->kv_row;
}

static inline bool cpu_attn_sees(const uint8_t *mask_row, int i, int j)
{
    return mask_row != NULL ? mask_row[j] != 0 : j <= i;
}

void cpu__attention_row(float *out, const float *q, const cpu_attn_seq_t *s,
                        int kv_head, int i, const uint8_t *mask_row,
                        float *scores)
{
    const float *kb = s->k_layer + (size_t)kv_head * s->head_dim;
    const float *vb = s->v_layer + (size_t)kv_head * s->head_dim;
    int hd = s->head_dim;
    int bs = s->block_size;
    float scale = 1.0f / sqrtf((float)hd);
    float max = -INFINITY, sum = 0.0f, inv;
    int n = 0;

    /* scores: cached slots block by block, then the visible new tokens */
    for (int p0 = 0; p0 < s->ctx_len; p0 += bs) {
        int len = s->ctx_len - p0 < bs ? s->ctx_len - p0 : bs;
        const float *k = kb + (size_t)s->block_table[p0 / bs] * bs *
                                  s->kv_row;

        for (int o = 0; o < len; o++, k += s->kv_row)
            scores[n++] = cpu_attn_dot(q, k, hd) * scale;
    }
    for (int j = 0; j < s->n_new; j++) {
        if (cpu_attn_sees(mask_row, i, j))
            scores[n++] = cpu_attn_dot(q, kb + cpu_attn_slot(s, s->ctx_len + j),
                                       hd) * scale;
    }

    if (n == 0) { /* a mask row that hides everything: no signal */
        memset(out, 0, (size_t)hd * sizeof(*out));
        return;
    }

    /* softmax */
    for (int p = 0; p < n; p++)
        max = scores[p] > max ? scores[p] : max;
    for (int p = 0; p < n; p++) {
        scores[p] = expf(scores[p] - max);
        sum += scores[p];
    }
    inv = 1.0f / sum;

    /* weighted sum of values, same slot order */
    memset(out, 0, (size_t)hd * sizeof(*out));
    n = 0;
    for (int p0 = 0; p0 < s->ctx_len; p0 += bs) {
        int len = s->ctx_len - p0 < bs ? s->ctx_len - p0 : bs;
        const float *v = vb + (size_t)s->block_table[p0 / bs] * bs *
                                  s->kv_row;

        for (int o = 0; o < len; o++, v += s->kv_row)
            cpu_attn_axpy(out, scores[n++], v, hd);
    }
    for (int j = 0; j < s->n_new; j++) {
        if (cpu_attn_sees(mask_row, i, j))
            cpu_attn_axpy(out, scores[n++],
                          vb + cpu_attn_slot(s, s->ctx_len + j), hd);
    }
    for (int d = 0; d < hd; d++)
        out[d] *= inv;
}
