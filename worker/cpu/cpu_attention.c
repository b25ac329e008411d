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
 *
 * With AVX2+FMA (head_dim a multiple of 8): a decode query (the last new
 * token, no mask) takes one fused path: scores eight keys at a time with
 * a transposing hadd tree, scaled and max-tracked in the same pass, one
 * exp pass, then P V accumulated in registers with 1/sum applied at the
 * end.  Other queries use the steps above with step 2 (without a mask)
 * and step 3 vectorized the same way.
 */
#include <math.h>
#include <string.h>

#include "bt_util.h"
#include "cpu_int.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_ATTN_X86 1
#define CPU_AVX2 __attribute__((target("avx2,fma")))
#define CPU_AVX512VL __attribute__((target("avx2,fma,avx512f,avx512vl")))
#endif

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
    int nb = b + 1;           /* next block index, without a division */
    int end = nb * bs;

    while (end < limit && s->block_table[nb] == first + (nb - b)) {
        nb++;
        end += bs;
    }
    *len_p = (end < limit ? end : limit) - p0;
    return ((size_t)first * bs + (p0 - b * bs)) * s->kv_row;
}

#ifdef CPU_ATTN_X86
/* Softmax of row[0, n) scaled by `scale`, every slot visible (n >= 1). */
CPU_AVX2 static void cpu_softmax_avx2(float *row, int n, float scale)
{
    __m256 vs = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY), vsum = _mm256_setzero_ps();
    __m128 m4, s4;
    float max, sum, inv;
    int p = 0;

    for (; p + 8 <= n; p += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(row + p), vs);

        _mm256_storeu_ps(row + p, v);
        vmax = _mm256_max_ps(vmax, v);
    }
    m4 = _mm_max_ps(_mm256_castps256_ps128(vmax),
                    _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    max = _mm_cvtss_f32(m4);
    for (; p < n; p++) {
        row[p] *= scale;
        max = row[p] > max ? row[p] : max;
    }
    vmax = _mm256_set1_ps(max);
    for (p = 0; p + 8 <= n; p += 8)
        _mm256_storeu_ps(row + p,
                         _mm256_sub_ps(_mm256_loadu_ps(row + p), vmax));
    for (; p < n; p++)
        row[p] -= max;
    cpu__exp_inplace(row, n);
    for (p = 0; p + 8 <= n; p += 8)
        vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(row + p));
    s4 = _mm_add_ps(_mm256_castps256_ps128(vsum),
                    _mm256_extractf128_ps(vsum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum = _mm_cvtss_f32(s4);
    for (; p < n; p++)
        sum += row[p];
    inv = 1.0f / sum;
    vs = _mm256_set1_ps(inv);
    for (p = 0; p + 8 <= n; p += 8)
        _mm256_storeu_ps(row + p, _mm256_mul_ps(_mm256_loadu_ps(row + p), vs));
    for (; p < n; p++)
        row[p] *= inv;
}

/* One key's products with q, summed over 8-column chunks: a vector of 8
 * partial sums of q . k (head_dim a multiple of 8). */
CPU_AVX2 static inline __m256 cpu_attn_dot8(const float *k, const float *q,
                                            int hd)
{
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(k), _mm256_loadu_ps(q));

    for (int c = 8; c < hd; c += 8)
        t = _mm256_fmadd_ps(_mm256_loadu_ps(k + c), _mm256_loadu_ps(q + c),
                            t);
    return t;
}

/* Scores of one query against slots [0, limit), head_dim a multiple of
 * 8: S[p] = (q . K[p]) * scale; returns their maximum.  Eight keys at a
 * time: one vector of partial sums per key, then a transposing hadd tree
 * turns the eight into one vector of eight scores (no scalar horizontal
 * sums).  HD16: head_dim is 16 and
 * q stays in two registers. */
#define CPU_ATTN_QK1(NAME, HD16)                                            \
CPU_AVX2 static float NAME(float *S, const float *q, const cpu_attn_seq_t *s,\
                           const float *kb, int limit, float scale)         \
{                                                                           \
    int hd = HD16 ? 16 : s->head_dim;                                       \
    size_t kv_row = (size_t)s->kv_row;                                      \
    __m256 q0 = _mm256_loadu_ps(q), q1 = _mm256_loadu_ps(q + 8);            \
    __m256 vscale = _mm256_set1_ps(scale);                                  \
    __m256 vmax = _mm256_set1_ps(-INFINITY);                                \
    __m128 m4;                                                              \
    float max;                                                              \
    int len;                                                                \
                                                                            \
    for (int p0 = 0; p0 < limit; p0 += len) {                               \
        const float *k = kb + cpu_attn_run(s, p0, limit, &len);             \
        int p = p0, end = p0 + len;                                         \
                                                                            \
        for (; p + 8 <= end; p += 8, k += 8 * kv_row) {                     \
            __m256 t0, t1, t2, t3, t4, t5, t6, t7, a01, a23, a45, a67;      \
            __m256 b0, b1;                                                  \
                                                                            \
            if (HD16) {                                                     \
                t0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 8), q1,            \
                                     _mm256_mul_ps(_mm256_loadu_ps(k), q0));\
                t1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + kv_row + 8), q1,   \
                                     _mm256_mul_ps(                         \
                                         _mm256_loadu_ps(k + kv_row), q0)); \
                t2 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 2 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 2 * kv_row), q0));             \
                t3 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 3 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 3 * kv_row), q0));             \
                t4 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 4 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 4 * kv_row), q0));             \
                t5 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 5 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 5 * kv_row), q0));             \
                t6 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 6 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 6 * kv_row), q0));             \
                t7 = _mm256_fmadd_ps(_mm256_loadu_ps(k + 7 * kv_row + 8),   \
                                     q1, _mm256_mul_ps(_mm256_loadu_ps(     \
                                         k + 7 * kv_row), q0));             \
            } else {                                                        \
                t0 = cpu_attn_dot8(k, q, hd);                               \
                t1 = cpu_attn_dot8(k + kv_row, q, hd);                      \
                t2 = cpu_attn_dot8(k + 2 * kv_row, q, hd);                  \
                t3 = cpu_attn_dot8(k + 3 * kv_row, q, hd);                  \
                t4 = cpu_attn_dot8(k + 4 * kv_row, q, hd);                  \
                t5 = cpu_attn_dot8(k + 5 * kv_row, q, hd);                  \
                t6 = cpu_attn_dot8(k + 6 * kv_row, q, hd);                  \
                t7 = cpu_attn_dot8(k + 7 * kv_row, q, hd);                  \
            }                                                               \
            a01 = _mm256_hadd_ps(t0, t1);                                   \
            a23 = _mm256_hadd_ps(t2, t3);                                   \
            a45 = _mm256_hadd_ps(t4, t5);                                   \
            a67 = _mm256_hadd_ps(t6, t7);                                   \
            b0 = _mm256_hadd_ps(a01, a23);                                  \
            b1 = _mm256_hadd_ps(a45, a67);                                  \
            b0 = _mm256_mul_ps(_mm256_add_ps(                               \
                _mm256_permute2f128_ps(b0, b1, 0x20),                       \
                _mm256_permute2f128_ps(b0, b1, 0x31)), vscale);             \
            _mm256_storeu_ps(S + p, b0);                                    \
            vmax = _mm256_max_ps(vmax, b0);                                 \
        }                                                                   \
        for (; p < end; p++, k += kv_row) {                                 \
            __m256 t = cpu_attn_dot8(k, q, hd);                             \
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(t),                \
                                  _mm256_extractf128_ps(t, 1));             \
                                                                            \
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));                         \
            h = _mm_mul_ss(_mm_add_ss(h, _mm_movehdup_ps(h)),               \
                           _mm256_castps256_ps128(vscale));                 \
            S[p] = _mm_cvtss_f32(h);                                        \
            vmax = _mm256_max_ps(vmax, _mm256_broadcastss_ps(h));           \
        }                                                                   \
    }                                                                       \
    (void)q0;                                                               \
    (void)q1;                                                               \
    m4 = _mm_max_ps(_mm256_castps256_ps128(vmax),                           \
                    _mm256_extractf128_ps(vmax, 1));                        \
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));                             \
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));                               \
    max = _mm_cvtss_f32(m4);                                                \
    return max;                                                             \
}

CPU_ATTN_QK1(cpu_attn_qk1_avx2, false)
CPU_ATTN_QK1(cpu_attn_qk1_hd16_avx2, true)

/* out row r = sum over slots p < lim_r of P[r][p] * V[p], head_dim a
 * multiple of 8: 16 columns at a time in registers, four chains per
 * column vector (slots p mod 4) so the FMA latency is hidden even for a
 * 16-wide head; the sums are multiplied by `mul` (a softmax's 1/sum). */
CPU_AVX2 static void cpu_attn_pv_avx2(float *out, int ldo, const float *S,
                                      int n_slots, const cpu_attn_seq_t *s,
                                      const float *vb, int i0, int n_q,
                                      float mul)
{
    int hd = s->head_dim;
    size_t kv_row = (size_t)s->kv_row;
    __m256 vmul = _mm256_set1_ps(mul);

    for (int r = 0; r < n_q; r++) {
        const float *P = S + (size_t)r * n_slots;
        int lim = cpu_attn_row_limit(s, i0 + r);
        float *o = out + (size_t)r * ldo;

        for (int c0 = 0; c0 < hd; c0 += 16) {
            /* lo: columns c0..c0+7, hi: c0+8..c0+15 (when they exist) */
            bool two = c0 + 16 <= hd;
            __m256 z = _mm256_setzero_ps();
            __m256 lo0 = z, lo1 = z, lo2 = z, lo3 = z;
            __m256 hi0 = z, hi1 = z, hi2 = z, hi3 = z;
            int len;

            for (int p0 = 0; p0 < lim; p0 += len) {
                const float *v = vb + cpu_attn_run(s, p0, lim, &len) + c0;
                int p = p0, end = p0 + len;

                for (; p + 4 <= end; p += 4, v += 4 * kv_row) {
                    __m256 w0 = _mm256_broadcast_ss(P + p);
                    __m256 w1 = _mm256_broadcast_ss(P + p + 1);
                    __m256 w2 = _mm256_broadcast_ss(P + p + 2);
                    __m256 w3 = _mm256_broadcast_ss(P + p + 3);
                    const float *v1 = v + kv_row, *v2 = v1 + kv_row;
                    const float *v3 = v2 + kv_row;

                    lo0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v), lo0);
                    lo1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1), lo1);
                    lo2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v2), lo2);
                    lo3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v3), lo3);
                    if (two) {
                        hi0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + 8), hi0);
                        hi1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 8),
                                              hi1);
                        hi2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v2 + 8),
                                              hi2);
                        hi3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v3 + 8),
                                              hi3);
                    }
                }
                for (; p < end; p++, v += kv_row) {
                    __m256 w0 = _mm256_broadcast_ss(P + p);

                    lo0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v), lo0);
                    if (two)
                        hi0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + 8), hi0);
                }
            }
            _mm256_storeu_ps(o + c0, _mm256_mul_ps(
                _mm256_add_ps(_mm256_add_ps(lo0, lo1),
                              _mm256_add_ps(lo2, lo3)), vmul));
            if (two)
                _mm256_storeu_ps(o + c0 + 8, _mm256_mul_ps(
                    _mm256_add_ps(_mm256_add_ps(hi0, hi1),
                                  _mm256_add_ps(hi2, hi3)), vmul));
        }
    }
}

/* One query row that sees slots [0, n) (a decode token): scaled scores
 * and their max in one pass, exp(s - max) and its sum, then P V with the
 * unnormalized weights and 1/sum applied to the output. */
CPU_AVX2 static void cpu_attn_decode_avx2(float *out, const float *q,
                                          const cpu_attn_seq_t *s,
                                          const float *kb, const float *vb,
                                          int n, float scale, float *S)
{
    float max = s->head_dim == 16 ? cpu_attn_qk1_hd16_avx2(S, q, s, kb, n,
                                                           scale)
                                  : cpu_attn_qk1_avx2(S, q, s, kb, n, scale);
    __m256 vmax = _mm256_set1_ps(max), vsum = _mm256_setzero_ps();
    __m128 s4;
    float sum;
    int p;

    for (p = 0; p + 8 <= n; p += 8)
        _mm256_storeu_ps(S + p, _mm256_sub_ps(_mm256_loadu_ps(S + p), vmax));
    for (; p < n; p++)
        S[p] -= max;
    cpu__exp_inplace(S, n);
    for (p = 0; p + 8 <= n; p += 8)
        vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(S + p));
    s4 = _mm_add_ps(_mm256_castps256_ps128(vsum),
                    _mm256_extractf128_ps(vsum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum = _mm_cvtss_f32(s4);
    for (; p < n; p++)
        sum += S[p];
    /* i0 = n_new - 1 with no mask: the row sees exactly [0, n) */
    cpu_attn_pv_avx2(out, 0, S, n, s, vb, s->n_new - 1, 1, 1.0f / sum);
}

/* ----------------------------------------------------------------------
 * Decode attention over all heads of a sequence (cpu__attention_decode).
 *
 * The heads are cut into tiles of 64 output floats (8 vector
 * accumulators): CPU_DEC_COLS / head_dim query heads, the tile's "lanes",
 * when head_dim <= 64, else one head.  A tile walks each cached K row and
 * V row once for all its lanes, in slot order, so the rows stream through
 * the cache sequentially instead of once per head with a stride, and the
 * loops are long even for 8- or 16-wide heads.  Scores are kept
 * interleaved, W[p * lanes + i] for slot p and lane i: a group of eight
 * (slot, lane) dot products is reduced by one transposing hadd tree
 * straight into one vector of W, the softmax runs on whole vectors with
 * a per-lane shift, and P V broadcasts a slot's lane weights from one
 * place.  Lanes past the last head repeat the tile's first head: their
 * results are computed and dropped. */
#define CPU_DEC_COLS 64

typedef struct {
    int n_lanes;         /* query heads per tile: 8, 4, 2 or 1 */
    int n_real;          /* lanes that are real heads */
    int head[8];         /* query head of each lane */
    const float *q[8];   /* its query (head_dim floats) */
    int koff[8];         /* its KV head's first column in a KV row */
} cpu_dec_tile_t;

/* True when the CPU has AVX-512VL (32 vector registers for the AVX2
 * code); false when cpu__matmul_force_portable or no AVX2. */
static bool cpu_attn_force_avx2 = false; /* tests */

static bool cpu_have_avx512vl(void)
{
    static int have = -1; /* -1 until probed; relaxed atomics: benign */
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);

    if (__atomic_load_n(&cpu_attn_force_avx2, __ATOMIC_RELAXED))
        return false;
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512vl");
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h != 0 && cpu__have_avx2();
}

/* Horizontal sums of eight vectors: one vector [sum t0, ..., sum t7].
 * Pairwise sums by shufps + add (cheaper than hadd on current cores). */
CPU_AVX2 static inline __m256 cpu_attn_pairs(__m256 a, __m256 b)
{
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88),
                         _mm256_shuffle_ps(a, b, 0xdd));
}

CPU_AVX2 static inline __m256 cpu_attn_hsum8(const __m256 t[8])
{
    __m256 a01 = cpu_attn_pairs(t[0], t[1]), a23 = cpu_attn_pairs(t[2], t[3]);
    __m256 a45 = cpu_attn_pairs(t[4], t[5]), a67 = cpu_attn_pairs(t[6], t[7]);
    __m256 b0 = cpu_attn_pairs(a01, a23), b1 = cpu_attn_pairs(a45, a67);

    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                         _mm256_permute2f128_ps(b0, b1, 0x31));
}

/* Sum of the eight lanes of t. */
CPU_AVX2 static inline float cpu_attn_hsum(__m256 t)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(t),
                          _mm256_extractf128_ps(t, 1));

    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Scaled scores of a tile of LANES lanes against slots [0, n): W[p *
 * LANES + i].  Head width 64 / LANES, or hd_rt (a multiple of 64) for
 * one lane.  Eight (slot, lane) dots per hadd tree: 8 / LANES slots. */
#define CPU_DEC_QK(NAME, LANES, TARGET)                                     \
TARGET static void NAME(float *W, const cpu_dec_tile_t *tl,                 \
                          const cpu_attn_seq_t *s, const float *kb, int n,  \
                          int hd_rt, float scale)                           \
{                                                                           \
    const int hd = LANES > 1 ? CPU_DEC_COLS / LANES : hd_rt;                \
    const int spg = 8 / LANES; /* slots per group */                       \
    size_t kv_row = (size_t)s->kv_row;                                      \
    __m256 vscale = _mm256_set1_ps(scale);                                  \
    __m256 qv[8]; /* the lanes' queries, when they fit (LANES > 1) */      \
    int koff[LANES];                                                        \
    int len;                                                                \
                                                                            \
    for (int i = 0; i < LANES; i++) {                                       \
        koff[i] = tl->koff[i];                                              \
        for (int c = 0; LANES > 1 && c < hd; c += 8)                        \
            qv[i * (hd / 8) + c / 8] = _mm256_loadu_ps(tl->q[i] + c);       \
    }                                                                       \
    for (int p0 = 0; p0 < n; p0 += len) {                                   \
        const float *k = kb + cpu_attn_run(s, p0, n, &len);                 \
        int p = p0, end = p0 + len;                                         \
                                                                            \
        for (; p + spg <= end; p += spg, k += spg * kv_row) {               \
            __m256 t[8];                                                    \
                                                                            \
            for (int j = 0; j < 8; j++) {                                   \
                const float *kr = k + (size_t)(j / LANES) * kv_row +        \
                                  koff[j % LANES];                          \
                const float *qr = tl->q[j % LANES];                         \
                const __m256 *qq = qv + (j % LANES) * (hd / 8);             \
                __m256 a = _mm256_mul_ps(_mm256_loadu_ps(kr), LANES > 1 ?   \
                                         qq[0] : _mm256_loadu_ps(qr));      \
                                                                            \
                for (int c = 8; c < hd; c += 8)                             \
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(kr + c), LANES > 1 ?\
                                        qq[c / 8] : _mm256_loadu_ps(qr + c),\
                                        a);                                 \
                t[j] = a;                                                   \
            }                                                               \
            _mm256_storeu_ps(W + (size_t)p * LANES,                         \
                             _mm256_mul_ps(cpu_attn_hsum8(t), vscale));     \
        }                                                                   \
        for (; p < end; p++, k += kv_row)                                   \
            for (int i = 0; i < LANES; i++)                                 \
                W[(size_t)p * LANES + i] =                                  \
                    cpu_attn_hsum(cpu_attn_dot8(k + tl->koff[i],            \
                                                tl->q[i], hd)) * scale;     \
    }                                                                       \
}

CPU_DEC_QK(cpu_dec_qk8, 8, CPU_AVX2)
CPU_DEC_QK(cpu_dec_qk4, 4, CPU_AVX2)
CPU_DEC_QK(cpu_dec_qk2, 2, CPU_AVX2)
CPU_DEC_QK(cpu_dec_qk1, 1, CPU_AVX2)
CPU_DEC_QK(cpu_dec_qk8_vl, 8, CPU_AVX512VL)
CPU_DEC_QK(cpu_dec_qk4_vl, 4, CPU_AVX512VL)
CPU_DEC_QK(cpu_dec_qk2_vl, 2, CPU_AVX512VL)
CPU_DEC_QK(cpu_dec_qk1_vl, 1, CPU_AVX512VL)

/* wl[i] = w[i] in every element, i < lanes: for 4 or 8 lanes by in-lane
 * shuffles of one or two 128-bit loads (P V is bound by loads, and a
 * shuffle runs on another port). */
#define CPU_DEC_WEIGHTS(wl, w, LANES)                                       \
    do {                                                                    \
        if ((LANES) >= 4) {                                                 \
            for (int h4 = 0; h4 < (LANES); h4 += 4) {                       \
                __m256 w4 = _mm256_broadcast_ps((const __m128 *)((w) + h4));\
                                                                            \
                (wl)[h4] = _mm256_permute_ps(w4, 0x00);                     \
                (wl)[h4 + 1] = _mm256_permute_ps(w4, 0x55);                 \
                (wl)[h4 + 2] = _mm256_permute_ps(w4, 0xaa);                 \
                (wl)[h4 + 3] = _mm256_permute_ps(w4, 0xff);                 \
            }                                                               \
        } else {                                                            \
            for (int i = 0; i < (LANES); i++)                               \
                (wl)[i] = _mm256_broadcast_ss((w) + i);                     \
        }                                                                   \
    } while (0)

/* out (the tile's heads, head_dim apart) = sum over slots p < n of W[p]
 * V[p] per lane, times inv[lane]: 8 vector accumulators, one FMA chain
 * each per slot; a slot's lane weights are broadcast once. */
#define CPU_DEC_PV(NAME, LANES)                                             \
CPU_AVX2 static void NAME(float *out, const cpu_dec_tile_t *tl,             \
                          const float *W, const cpu_attn_seq_t *s,          \
                          const float *vb, int n, int hd_rt,                \
                          const float inv[8])                               \
{                                                                           \
    const int hd = LANES > 1 ? CPU_DEC_COLS / LANES : hd_rt;                \
    const int vpl = 8 / LANES; /* vectors per lane per pass */             \
    size_t kv_row = (size_t)s->kv_row;                                      \
                                                                            \
    for (int c0 = 0; c0 < hd; c0 += CPU_DEC_COLS) {                         \
        __m256 acc[8];                                                      \
        int len;                                                            \
                                                                            \
        for (int j = 0; j < 8; j++)                                         \
            acc[j] = _mm256_setzero_ps();                                   \
        for (int p0 = 0; p0 < n; p0 += len) {                               \
            const float *v = vb + cpu_attn_run(s, p0, n, &len) + c0;        \
            const float *w = W + (size_t)p0 * LANES;                        \
                                                                            \
            for (int p = p0; p < p0 + len; p++, v += kv_row, w += LANES) {  \
                __m256 wl[LANES];                                           \
                                                                            \
                CPU_DEC_WEIGHTS(wl, w, LANES);                              \
                for (int j = 0; j < 8; j++)                                 \
                    acc[j] = _mm256_fmadd_ps(                               \
                        wl[j / vpl], _mm256_loadu_ps(                       \
                            v + tl->koff[j / vpl] + (j % vpl) * 8),         \
                        acc[j]);                                            \
            }                                                               \
        }                                                                   \
        for (int j = 0; j < 8; j++) {                                       \
            int i = j / vpl;                                                \
                                                                            \
            if (i < tl->n_real)                                             \
                _mm256_storeu_ps(out + (size_t)tl->head[i] * hd + c0 +      \
                                 (j % vpl) * 8,                             \
                                 _mm256_mul_ps(acc[j],                      \
                                               _mm256_set1_ps(inv[i])));    \
        }                                                                   \
    }                                                                       \
}

CPU_DEC_PV(cpu_dec_pv8, 8)
CPU_DEC_PV(cpu_dec_pv4, 4)
CPU_DEC_PV(cpu_dec_pv2, 2)
CPU_DEC_PV(cpu_dec_pv1, 1)

/* out (the tile's heads, head_dim apart) = sum over slots p < n of W[p]
 * V[p] as above with two slots per step and 16 accumulators (even and
 * odd slots): with AVX-512VL's 32 vector registers nothing spills, and
 * twice the FMA chains hide the FMA latency. */
#define CPU_DEC_PV2(NAME, LANES)                                             \
CPU_AVX512VL static void NAME(float *out, const cpu_dec_tile_t *tl,             \
                          const float *W, const cpu_attn_seq_t *s,          \
                          const float *vb, int n, int hd_rt,                \
                          const float inv[8])                               \
{                                                                           \
    const int hd = LANES > 1 ? CPU_DEC_COLS / LANES : hd_rt;                \
    const int vpl = 8 / LANES; /* vectors per lane per pass */             \
    size_t kv_row = (size_t)s->kv_row;                                      \
                                                                            \
    for (int c0 = 0; c0 < hd; c0 += CPU_DEC_COLS) {                         \
        __m256 acc[8];                                                      \
        int len;                                                            \
                                                                            \
        __m256 acc2[8];                                                     \
                                                                            \
        for (int j = 0; j < 8; j++)                                         \
            acc[j] = acc2[j] = _mm256_setzero_ps();                         \
        for (int p0 = 0; p0 < n; p0 += len) {                               \
            const float *v = vb + cpu_attn_run(s, p0, n, &len) + c0;        \
            const float *w = W + (size_t)p0 * LANES;                        \
                                                                            \
            int p = p0;                                                     \
                                                                            \
            for (; p + 2 <= p0 + len; p += 2, v += 2 * kv_row,              \
                 w += 2 * LANES) {                                          \
                __m256 wl[LANES], wm[LANES];                                \
                                                                            \
                CPU_DEC_WEIGHTS(wl, w, LANES);                              \
                CPU_DEC_WEIGHTS(wm, w + LANES, LANES);                      \
                for (int j = 0; j < 8; j++) {                               \
                    size_t o = (size_t)tl->koff[j / vpl] + (j % vpl) * 8;   \
                                                                            \
                    acc[j] = _mm256_fmadd_ps(wl[j / vpl],                   \
                                             _mm256_loadu_ps(v + o), acc[j]);\
                    acc2[j] = _mm256_fmadd_ps(                              \
                        wm[j / vpl], _mm256_loadu_ps(v + kv_row + o),       \
                        acc2[j]);                                           \
                }                                                           \
            }                                                               \
            for (; p < p0 + len; p++, v += kv_row, w += LANES) {            \
                __m256 wl[LANES];                                           \
                                                                            \
                CPU_DEC_WEIGHTS(wl, w, LANES);                              \
                for (int j = 0; j < 8; j++)                                 \
                    acc[j] = _mm256_fmadd_ps(                               \
                        wl[j / vpl], _mm256_loadu_ps(                       \
                            v + tl->koff[j / vpl] + (j % vpl) * 8),         \
                        acc[j]);                                            \
            }                                                               \
        }                                                                   \
        for (int j = 0; j < 8; j++) {                                       \
            int i = j / vpl;                                                \
                                                                            \
            if (i < tl->n_real)                                             \
                _mm256_storeu_ps(out + (size_t)tl->head[i] * hd + c0 +      \
                                 (j % vpl) * 8,                             \
                                 _mm256_mul_ps(_mm256_add_ps(acc[j], acc2[j]),\
                                               _mm256_set1_ps(inv[i])));    \
        }                                                                   \
    }                                                                       \
}

CPU_DEC_PV2(cpu_dec_pv8_vl, 8)
CPU_DEC_PV2(cpu_dec_pv4_vl, 4)
CPU_DEC_PV2(cpu_dec_pv2_vl, 2)
CPU_DEC_PV2(cpu_dec_pv1_vl, 1)

/* Softmax of the interleaved rows of W (n_pad slots x lanes, the padding
 * already -INFINITY); returns 1/sum of each lane in inv. */
CPU_AVX2 static void cpu_dec_softmax(float *W, int n_pad, int lanes,
                                     float inv[8])
{
    int m = n_pad * lanes; /* a multiple of 8 */
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    float mx[8], shift[8], sum[8];

    for (int p = 0; p < m; p += 8)
        vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(W + p));
    _mm256_storeu_ps(mx, vmax);
    for (int l = lanes; l < 8; l++) /* fold lanes of the same head */
        mx[l % lanes] = mx[l] > mx[l % lanes] ? mx[l] : mx[l % lanes];
    for (int l = 0; l < 8; l++)
        shift[l] = mx[l % lanes];
    cpu__exp_shift8(W, m, shift, sum);
    for (int l = lanes; l < 8; l++)
        sum[l % lanes] += sum[l];
    for (int i = 0; i < lanes; i++)
        inv[i] = 1.0f / sum[i];
}

/* One tile of cpu__attention_decode (AVX2). */
static void cpu_dec_tile(float *out, const cpu_dec_tile_t *tl,
                         const cpu_attn_seq_t *s, int n, float scale,
                         float *W)
{
    int hd = s->head_dim;
    int lanes = tl->n_lanes;
    int n_pad = (n + 7) & ~7;
    const float *kb = s->k_layer, *vb = s->v_layer;
    float inv[8];

    if (cpu_have_avx512vl()) {
        switch (lanes) {
        case 8: cpu_dec_qk8_vl(W, tl, s, kb, n, hd, scale); break;
        case 4: cpu_dec_qk4_vl(W, tl, s, kb, n, hd, scale); break;
        case 2: cpu_dec_qk2_vl(W, tl, s, kb, n, hd, scale); break;
        default: cpu_dec_qk1_vl(W, tl, s, kb, n, hd, scale); break;
        }
    } else {
        switch (lanes) {
        case 8: cpu_dec_qk8(W, tl, s, kb, n, hd, scale); break;
        case 4: cpu_dec_qk4(W, tl, s, kb, n, hd, scale); break;
        case 2: cpu_dec_qk2(W, tl, s, kb, n, hd, scale); break;
        default: cpu_dec_qk1(W, tl, s, kb, n, hd, scale); break;
        }
    }
    for (int i = n * lanes; i < n_pad * lanes; i++)
        W[i] = -INFINITY;
    cpu_dec_softmax(W, n_pad, lanes, inv);
    if (cpu_have_avx512vl()) {
        switch (lanes) {
        case 8: cpu_dec_pv8_vl(out, tl, W, s, vb, n, hd, inv); break;
        case 4: cpu_dec_pv4_vl(out, tl, W, s, vb, n, hd, inv); break;
        case 2: cpu_dec_pv2_vl(out, tl, W, s, vb, n, hd, inv); break;
        default: cpu_dec_pv1_vl(out, tl, W, s, vb, n, hd, inv); break;
        }
        return;
    }
    switch (lanes) {
    case 8: cpu_dec_pv8(out, tl, W, s, vb, n, hd, inv); break;
    case 4: cpu_dec_pv4(out, tl, W, s, vb, n, hd, inv); break;
    case 2: cpu_dec_pv2(out, tl, W, s, vb, n, hd, inv); break;
    default: cpu_dec_pv1(out, tl, W, s, vb, n, hd, inv); break;
    }
}
#endif

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
    bool vec = false; /* AVX2 kernels */
    int len;

#ifdef CPU_ATTN_X86
    vec = cpu__have_avx2();
#endif
    (void)vec; /* only read by the x86 paths */

#ifdef CPU_ATTN_X86
    /* the last new token of a causal sequence (decode) sees [0, limit) */
    if (vec && n_q == 1 && hd % 8 == 0 && s->mask == NULL &&
        i0 == s->n_new - 1) {
        cpu_attn_decode_avx2(out, q, s, kb, vb, limit, scale, S);
        return;
    }
#endif

    /* 1. S = Q K^T over slots [0, limit) */
#ifdef CPU_ATTN_X86
    if (vec && n_q == 1 && hd == 16)
        (void)cpu_attn_qk1_hd16_avx2(S, q, s, kb, limit, 1.0f);
    else if (vec && n_q == 1 && hd % 8 == 0)
        (void)cpu_attn_qk1_avx2(S, q, s, kb, limit, 1.0f);
    else
#endif
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

#ifdef CPU_ATTN_X86
        if (vec && s->mask == NULL) {
            cpu_softmax_avx2(row, lim, scale);
            for (int p = lim; p < limit; p++)
                row[p] = 0.0f;
            continue;
        }
#endif
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
#ifdef CPU_ATTN_X86
    if (vec && hd % 8 == 0) {
        cpu_attn_pv_avx2(out, ldo, S, n_slots, s, vb, i0, n_q, 1.0f);
        return;
    }
#endif
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

void cpu__attention_decode(float *out, const float *q,
                           const cpu_attn_seq_t *s, int n_kv_heads,
                           int group, float *scratch)
{
    int hd = s->head_dim;
    int n_heads = n_kv_heads * group;
    int ld = n_heads * hd;

#ifdef CPU_ATTN_X86
    if (cpu__have_avx2() && s->mask == NULL &&
        (hd == 8 || hd == 16 || hd == 32 || hd % CPU_DEC_COLS == 0)) {
        int n = s->ctx_len + s->n_new;
        int lanes = hd < CPU_DEC_COLS ? CPU_DEC_COLS / hd : 1;
        float scale = 1.0f / sqrtf((float)hd);
        cpu_dec_tile_t tl;

        tl.n_lanes = lanes;
        for (int h0 = 0; h0 < n_heads; h0 += lanes) {
            tl.n_real = BT_MIN(lanes, n_heads - h0);
            for (int i = 0; i < lanes; i++) {
                int h = i < tl.n_real ? h0 + i : h0;

                tl.head[i] = h;
                tl.q[i] = q + (size_t)h * hd;
                tl.koff[i] = (h / group) * hd;
            }
            cpu_dec_tile(out, &tl, s, n, scale, scratch);
        }
        return;
    }
#endif
    for (int kvh = 0; kvh < n_kv_heads; kvh++)
        cpu__attention(out + (size_t)kvh * group * hd, ld,
                       q + (size_t)kvh * group * hd, ld, s, kvh, group,
                       s->n_new - 1, 1, scratch);
}

void cpu__attention_force_avx2(bool on)
{
#ifdef CPU_ATTN_X86
    __atomic_store_n(&cpu_attn_force_avx2, on, __ATOMIC_RELAXED);
#else
    (void)on;
#endif
}
