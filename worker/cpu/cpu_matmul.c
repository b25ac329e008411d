/*
 * cpu_matmul.c - out = x @ w^T (+ bias) for a batch of token rows.
 *
 * Weight stationary: the outer loop walks blocks of 4 weight rows, the
 * inner loop every token row, so each weight row is fetched from memory
 * once per call and then dotted with the whole batch from L1.  That is
 * why a decode batch of 32 costs much less per token than batch 1.
 *
 * The AVX2+FMA kernel computes 4 rows x 3 tokens per tile (12 vector
 * accumulators, 3 token loads and 4 weight loads per 8 columns), reduces
 * the 4 row accumulators of a token with a transposing hadd tree and
 * stores 4 outputs at once.  A single token uses 8 x 1 tiles so that 8
 * independent FMA chains hide the FMA latency.  Columns that do not fill
 * a vector are read with masked loads.  The kernel is chosen at run time
 * (no -march flags: the binary runs on any x86-64); other CPUs use the
 * portable C loop, written with 8 independent lanes so the compiler can
 * vectorize it without reassociating sums (no -ffast-math).
 */
#include <string.h>

#include "bt_util.h"
#include "cpu_int.h"

// ----------------------------------------------------------------------------
// portable C

/* One dot product with 8 independent partial sums. */
static float cpu_dot_c(const float *a, const float *b, int n)
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

static void cpu_matmul_c(float *out, int ldo, const float *x, int ldx,
                         const float *w, int ldw, const float *bias,
                         int n_tok, int k, int n_begin, int n_end,
                         bool accumulate)
{
    for (int n = n_begin; n < n_end; n++) {
        const float *wr = w + (size_t)n * ldw;
        float b = bias != NULL ? bias[n] : 0.0f;

        for (int t = 0; t < n_tok; t++) {
            float v = cpu_dot_c(wr, x + (size_t)t * ldx, k) + b;
            float *o = out + (size_t)t * ldo + n;

            *o = accumulate ? *o + v : v;
        }
    }
}

void cpu__matmul_ref(float *out, int ldo, const float *x, int ldx,
                     const float *w, int ldw, const float *bias, int n_tok,
                     int k, int n_begin, int n_end, bool accumulate)
{
    for (int t = 0; t < n_tok; t++) {
        for (int n = n_begin; n < n_end; n++) {
            float v = 0.0f;

            for (int j = 0; j < k; j++)
                v += x[(size_t)t * ldx + j] * w[(size_t)n * ldw + j];
            if (bias != NULL)
                v += bias[n];
            if (accumulate)
                out[(size_t)t * ldo + n] += v;
            else
                out[(size_t)t * ldo + n] = v;
        }
    }
}

// ----------------------------------------------------------------------------
// packed weights

size_t cpu__pack_size(int n_out, int k)
{
    return (size_t)BT_DIV_UP(n_out, CPU_PACK_NR) * CPU_PACK_NR * (size_t)k;
}

void cpu__pack(float *dst, const float *w, int ldw, int n_out, int k)
{
    int n_panels = BT_DIV_UP(n_out, CPU_PACK_NR);

    for (int p = 0; p < n_panels; p++) {
        float *panel = dst + (size_t)p * k * CPU_PACK_NR;

        for (int c = 0; c < CPU_PACK_NR; c++) {
            int n = p * CPU_PACK_NR + c;

            for (int j = 0; j < k; j++)
                panel[(size_t)j * CPU_PACK_NR + c] =
                    n < n_out ? w[(size_t)n * ldw + j] : 0.0f;
        }
    }
}

/* Portable: one panel x one token at a time; the inner loop over the
 * panel's 16 independent sums vectorizes without reassociation. */
static void cpu_matmul_packed_c(float *out, int ldo, const float *x, int ldx,
                                const float *wp, const float *bias,
                                int n_tok, int k, int n_begin, int n_end,
                                bool accumulate)
{
    for (int n0 = n_begin; n0 < n_end; n0 += CPU_PACK_NR) {
        const float *panel = wp + (size_t)(n0 / CPU_PACK_NR) * k *
                                  CPU_PACK_NR;
        int valid = BT_MIN(CPU_PACK_NR, n_end - n0);

        for (int t = 0; t < n_tok; t++) {
            const float *xr = x + (size_t)t * ldx;
            float *o = out + (size_t)t * ldo + n0;
            float acc[CPU_PACK_NR] = { 0 };

            for (int j = 0; j < k; j++)
                for (int c = 0; c < CPU_PACK_NR; c++)
                    acc[c] += xr[j] * panel[(size_t)j * CPU_PACK_NR + c];
            for (int c = 0; c < valid; c++) {
                float v = acc[c] + (bias != NULL ? bias[n0 + c] : 0.0f);

                o[c] = accumulate ? o[c] + v : v;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// AVX2 + FMA

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_HAVE_X86_KERNEL 1
#define CPU_AVX2 __attribute__((target("avx2,fma")))

/* Lane l of the result is the horizontal sum of the l-th argument. */
CPU_AVX2 static inline __m128 cpu_hsum4(__m256 a, __m256 b, __m256 c,
                                        __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);

    return _mm_add_ps(_mm256_castps256_ps128(abcd),
                      _mm256_extractf128_ps(abcd, 1));
}

/* Stores 4 consecutive outputs with bias and accumulate applied. */
CPU_AVX2 static inline void cpu_store4(float *o, __m128 v, const float *bias,
                                       bool accumulate)
{
    if (bias != NULL)
        v = _mm_add_ps(v, _mm_loadu_ps(bias));
    if (accumulate)
        v = _mm_add_ps(v, _mm_loadu_ps(o));
    _mm_storeu_ps(o, v);
}

/* 8 weight rows x 1 token. */
CPU_AVX2 static void cpu_tile_8x1(float *o, const float *x, const float *w,
                                  size_t ldw, int k, int k8, __m256i tail,
                                  const float *bias, bool accumulate)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    __m256 a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps();
    __m256 a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw;
    const float *w3 = w + 3 * ldw, *w4 = w + 4 * ldw;
    const float *w5 = w + 5 * ldw, *w6 = w + 6 * ldw;
    const float *w7 = w + 7 * ldw;
    int j = 0;

    for (; j < k8; j += 8) {
        __m256 xv = _mm256_loadu_ps(x + j);

        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), xv, a3);
        a4 = _mm256_fmadd_ps(_mm256_loadu_ps(w4 + j), xv, a4);
        a5 = _mm256_fmadd_ps(_mm256_loadu_ps(w5 + j), xv, a5);
        a6 = _mm256_fmadd_ps(_mm256_loadu_ps(w6 + j), xv, a6);
        a7 = _mm256_fmadd_ps(_mm256_loadu_ps(w7 + j), xv, a7);
    }
    if (j < k) {
        __m256 xv = _mm256_maskload_ps(x + j, tail);

        a0 = _mm256_fmadd_ps(_mm256_maskload_ps(w0 + j, tail), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_maskload_ps(w1 + j, tail), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_maskload_ps(w2 + j, tail), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_maskload_ps(w3 + j, tail), xv, a3);
        a4 = _mm256_fmadd_ps(_mm256_maskload_ps(w4 + j, tail), xv, a4);
        a5 = _mm256_fmadd_ps(_mm256_maskload_ps(w5 + j, tail), xv, a5);
        a6 = _mm256_fmadd_ps(_mm256_maskload_ps(w6 + j, tail), xv, a6);
        a7 = _mm256_fmadd_ps(_mm256_maskload_ps(w7 + j, tail), xv, a7);
    }
    cpu_store4(o, cpu_hsum4(a0, a1, a2, a3), bias, accumulate);
    cpu_store4(o + 4, cpu_hsum4(a4, a5, a6, a7),
               bias != NULL ? bias + 4 : NULL, accumulate);
}

/* 4 weight rows x NT tokens (NT = 1..3), unrolled by the compiler. */
#define CPU_TILE_4XN(NT)                                                    \
CPU_AVX2 static void cpu_tile_4x##NT(float *o, int ldo, const float *x,     \
                                     int ldx, const float *w, size_t ldw,   \
                                     int k, int k8, __m256i tail,           \
                                     const float *bias, bool accumulate)    \
{                                                                           \
    __m256 acc[4][NT];                                                      \
    const float *wr[4];                                                     \
    int j = 0;                                                              \
                                                                            \
    for (int r = 0; r < 4; r++) {                                           \
        wr[r] = w + (size_t)r * ldw;                                        \
        for (int c = 0; c < NT; c++)                                        \
            acc[r][c] = _mm256_setzero_ps();                                \
    }                                                                       \
    for (; j < k8; j += 8) {                                                \
        __m256 xv[NT];                                                      \
        for (int c = 0; c < NT; c++)                                        \
            xv[c] = _mm256_loadu_ps(x + (size_t)c * ldx + j);               \
        for (int r = 0; r < 4; r++) {                                       \
            __m256 wv = _mm256_loadu_ps(wr[r] + j);                         \
            for (int c = 0; c < NT; c++)                                    \
                acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);          \
        }                                                                   \
    }                                                                       \
    if (j < k) {                                                            \
        __m256 xv[NT];                                                      \
        for (int c = 0; c < NT; c++)                                        \
            xv[c] = _mm256_maskload_ps(x + (size_t)c * ldx + j, tail);      \
        for (int r = 0; r < 4; r++) {                                       \
            __m256 wv = _mm256_maskload_ps(wr[r] + j, tail);                \
            for (int c = 0; c < NT; c++)                                    \
                acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);          \
        }                                                                   \
    }                                                                       \
    for (int c = 0; c < NT; c++)                                            \
        cpu_store4(o + (size_t)c * ldo,                                     \
                   cpu_hsum4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]),   \
                   bias, accumulate);                                       \
}

CPU_TILE_4XN(1)
CPU_TILE_4XN(2)
CPU_TILE_4XN(3)

/* One weight row against every token (leftover rows). */
CPU_AVX2 static void cpu_row_1xn(float *out, int ldo, const float *x,
                                 int ldx, const float *wr, int n_tok, int k,
                                 int k8, __m256i tail, float b,
                                 bool accumulate)
{
    for (int t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * ldx;
        __m256 a0 = _mm256_setzero_ps();
        __m128 s;
        float v;
        int j = 0;

        for (; j < k8; j += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + j),
                                 _mm256_loadu_ps(xr + j), a0);
        if (j < k)
            a0 = _mm256_fmadd_ps(_mm256_maskload_ps(wr + j, tail),
                                 _mm256_maskload_ps(xr + j, tail), a0);
        s = _mm_add_ps(_mm256_castps256_ps128(a0),
                       _mm256_extractf128_ps(a0, 1));
        s = _mm_hadd_ps(s, s);
        s = _mm_hadd_ps(s, s);
        v = _mm_cvtss_f32(s) + b;
        out[(size_t)t * ldo] = accumulate ? out[(size_t)t * ldo] + v : v;
    }
}

CPU_AVX2 static void cpu_matmul_avx2(float *out, int ldo, const float *x,
                                     int ldx, const float *w, size_t ldw,
                                     const float *bias, int n_tok, int k,
                                     int n_begin, int n_end, bool accumulate)
{
    int k8 = k & ~7;
    int rem = k - k8;
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6,
                                                        7));
    int n = n_begin;

    if (n_tok == 1) {
        for (; n + 8 <= n_end; n += 8)
            cpu_tile_8x1(out + n, x, w + (size_t)n * ldw, ldw, k, k8, tail,
                         bias != NULL ? bias + n : NULL, accumulate);
    }
    for (; n + 4 <= n_end; n += 4) {
        const float *wr = w + (size_t)n * ldw;
        const float *b = bias != NULL ? bias + n : NULL;
        int t = 0;

        for (; t + 3 <= n_tok; t += 3)
            cpu_tile_4x3(out + (size_t)t * ldo + n, ldo,
                         x + (size_t)t * ldx, ldx, wr, ldw, k, k8, tail, b,
                         accumulate);
        if (n_tok - t == 2)
            cpu_tile_4x2(out + (size_t)t * ldo + n, ldo,
                         x + (size_t)t * ldx, ldx, wr, ldw, k, k8, tail, b,
                         accumulate);
        else if (n_tok - t == 1)
            cpu_tile_4x1(out + (size_t)t * ldo + n, ldo,
                         x + (size_t)t * ldx, ldx, wr, ldw, k, k8, tail, b,
                         accumulate);
    }
    for (; n < n_end; n++)
        cpu_row_1xn(out + n, ldo, x, ldx, w + (size_t)n * ldw, n_tok, k, k8,
                    tail, bias != NULL ? bias[n] : 0.0f, accumulate);
}
/* Stores vector v of a packed tile row: columns [off, off + 8) of the
 * row at o, of which the first `valid` (counted from column 0) exist. */
CPU_AVX2 static inline void cpu_pk_store8(float *o, __m256 v,
                                          const float *bias, int off,
                                          int valid, bool accumulate)
{
    if (valid >= off + 8) {
        if (bias != NULL)
            v = _mm256_add_ps(v, _mm256_loadu_ps(bias + off));
        if (accumulate)
            v = _mm256_add_ps(v, _mm256_loadu_ps(o + off));
        _mm256_storeu_ps(o + off, v);
    } else if (valid > off) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - off),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5,
                                                         6, 7));

        if (bias != NULL)
            v = _mm256_add_ps(v, _mm256_maskload_ps(bias + off, m));
        if (accumulate)
            v = _mm256_add_ps(v, _mm256_maskload_ps(o + off, m));
        _mm256_maskstore_ps(o + off, m, v);
    }
}

/* Micro-kernel: MR tokens x NP panels (NP * 16 outputs) in MR * NP * 2
 * accumulators (at most 12 of the 16 ymm registers).  Per column j: NP * 2
 * panel loads, MR broadcasts, MR * NP * 2 FMAs.  `valid` outputs of the
 * tile exist (the rest are the zero padding of the last panel).
 *
 * The accumulators are named variables, not an array: GCC keeps an array
 * of 12 vectors in registers but also stores it to the stack on every
 * iteration.  Tall tiles (MR 3..6, NP 1) use rows 0..5 x vectors 0..1,
 * narrow ones (MR 1..2) vectors 0..7; the constant guards drop the rest. */
#define CPU_PK_KERNEL(MR_, NP_)                                             \
CPU_AVX2 static void cpu_pk_##MR_##x##NP_(float *o, int ldo,               \
                                          const float *x, int ldx,         \
                                          const float *wp, size_t pstride, \
                                          int k, int valid,                \
                                          const float *bias,               \
                                          bool accumulate)                 \
{                                                                           \
    enum { MR = MR_, NP = NP_ };                                            \
    __m256 z = _mm256_setzero_ps();                                         \
    __m256 c00 = z, c01 = z, c02 = z, c03 = z, c04 = z, c05 = z, c06 = z;  \
    __m256 c07 = z, c10 = z, c11 = z, c12 = z, c13 = z, c14 = z, c15 = z;  \
    __m256 c16 = z, c17 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z;  \
    __m256 c41 = z, c50 = z, c51 = z;                                       \
    /* rows past MR alias row 0 (never read) */                            \
    const float *x0 = x;                                                    \
    const float *x1 = MR > 1 ? x + (size_t)ldx : x;                         \
    const float *x2 = MR > 2 ? x + (size_t)2 * ldx : x;                     \
    const float *x3 = MR > 3 ? x + (size_t)3 * ldx : x;                     \
    const float *x4 = MR > 4 ? x + (size_t)4 * ldx : x;                     \
    const float *x5 = MR > 5 ? x + (size_t)5 * ldx : x;                     \
                                                                            \
    for (int j = 0; j < k; j++) {                                           \
        const float *w = wp + (size_t)j * CPU_PACK_NR;                      \
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);        \
        __m256 w2 = z, w3 = z, w4 = z, w5 = z, w6 = z, w7 = z;              \
        __m256 b;                                                           \
                                                                            \
        if (NP > 1) {                                                       \
            w2 = _mm256_loadu_ps(w + pstride);                              \
            w3 = _mm256_loadu_ps(w + pstride + 8);                          \
        }                                                                   \
        if (NP > 2) {                                                       \
            w4 = _mm256_loadu_ps(w + 2 * pstride);                          \
            w5 = _mm256_loadu_ps(w + 2 * pstride + 8);                      \
        }                                                                   \
        if (NP > 3) {                                                       \
            w6 = _mm256_loadu_ps(w + 3 * pstride);                          \
            w7 = _mm256_loadu_ps(w + 3 * pstride + 8);                      \
        }                                                                   \
        b = _mm256_broadcast_ss(x0 + j);                                    \
        c00 = _mm256_fmadd_ps(w0, b, c00);                                  \
        c01 = _mm256_fmadd_ps(w1, b, c01);                                  \
        if (NP > 1) {                                                       \
            c02 = _mm256_fmadd_ps(w2, b, c02);                              \
            c03 = _mm256_fmadd_ps(w3, b, c03);                              \
        }                                                                   \
        if (NP > 2) {                                                       \
            c04 = _mm256_fmadd_ps(w4, b, c04);                              \
            c05 = _mm256_fmadd_ps(w5, b, c05);                              \
        }                                                                   \
        if (NP > 3) {                                                       \
            c06 = _mm256_fmadd_ps(w6, b, c06);                              \
            c07 = _mm256_fmadd_ps(w7, b, c07);                              \
        }                                                                   \
        if (MR > 1) {                                                       \
            b = _mm256_broadcast_ss(x1 + j);                                \
            c10 = _mm256_fmadd_ps(w0, b, c10);                              \
            c11 = _mm256_fmadd_ps(w1, b, c11);                              \
            if (NP > 1) {                                                   \
                c12 = _mm256_fmadd_ps(w2, b, c12);                          \
                c13 = _mm256_fmadd_ps(w3, b, c13);                          \
            }                                                               \
            if (NP > 2) {                                                   \
                c14 = _mm256_fmadd_ps(w4, b, c14);                          \
                c15 = _mm256_fmadd_ps(w5, b, c15);                          \
            }                                                               \
            if (NP > 3) {                                                   \
                c16 = _mm256_fmadd_ps(w6, b, c16);                          \
                c17 = _mm256_fmadd_ps(w7, b, c17);                          \
            }                                                               \
        }                                                                   \
        if (MR > 2) {                                                       \
            b = _mm256_broadcast_ss(x2 + j);                                \
            c20 = _mm256_fmadd_ps(w0, b, c20);                              \
            c21 = _mm256_fmadd_ps(w1, b, c21);                              \
        }                                                                   \
        if (MR > 3) {                                                       \
            b = _mm256_broadcast_ss(x3 + j);                                \
            c30 = _mm256_fmadd_ps(w0, b, c30);                              \
            c31 = _mm256_fmadd_ps(w1, b, c31);                              \
        }                                                                   \
        if (MR > 4) {                                                       \
            b = _mm256_broadcast_ss(x4 + j);                                \
            c40 = _mm256_fmadd_ps(w0, b, c40);                              \
            c41 = _mm256_fmadd_ps(w1, b, c41);                              \
        }                                                                   \
        if (MR > 5) {                                                       \
            b = _mm256_broadcast_ss(x5 + j);                                \
            c50 = _mm256_fmadd_ps(w0, b, c50);                              \
            c51 = _mm256_fmadd_ps(w1, b, c51);                              \
        }                                                                   \
    }                                                                       \
    {                                                                       \
        __m256 row0[8] = { c00, c01, c02, c03, c04, c05, c06, c07 };        \
        __m256 row1[8] = { c10, c11, c12, c13, c14, c15, c16, c17 };        \
        __m256 rest[4][2] = { { c20, c21 }, { c30, c31 }, { c40, c41 },     \
                              { c50, c51 } };                               \
                                                                            \
        for (int v = 0; v < 2 * NP; v++) {                                  \
            cpu_pk_store8(o, row0[v], bias, 8 * v, valid, accumulate);      \
            if (MR > 1)                                                     \
                cpu_pk_store8(o + ldo, row1[v], bias, 8 * v, valid,         \
                              accumulate);                                  \
        }                                                                   \
        for (int r = 2; r < MR; r++)                                        \
            for (int v = 0; v < 2; v++)                                     \
                cpu_pk_store8(o + (size_t)r * ldo, rest[r - 2][v], bias,    \
                              8 * v, valid, accumulate);                    \
    }                                                                       \
}

CPU_PK_KERNEL(1, 1)
CPU_PK_KERNEL(1, 2)
CPU_PK_KERNEL(1, 3)
CPU_PK_KERNEL(1, 4)
CPU_PK_KERNEL(2, 1)
CPU_PK_KERNEL(2, 2)
CPU_PK_KERNEL(2, 3)
CPU_PK_KERNEL(3, 1)
CPU_PK_KERNEL(4, 1)
CPU_PK_KERNEL(5, 1)
CPU_PK_KERNEL(6, 1)

typedef void (*cpu_pk_fn_t)(float *o, int ldo, const float *x, int ldx,
                            const float *wp, size_t pstride, int k,
                            int valid, const float *bias, bool accumulate);

/* Weight stationary over panels: each panel (k x 16 floats) is loaded
 * into L1 once and used by every token block.  Batches of 1-2 tokens take
 * several panels at once (GEMV: enough independent FMA chains to hide
 * the latency); larger batches are cut into row blocks of 3-6 tokens of
 * near-equal size (8 = 4 + 4, 32 = 6 + 6 + 5 + 5 + 5 + 5). */
CPU_AVX2 static void cpu_matmul_packed_avx2(float *out, int ldo,
                                            const float *x, int ldx,
                                            const float *wp,
                                            const float *bias, int n_tok,
                                            int k, int n_begin, int n_end,
                                            bool accumulate)
{
    static const cpu_pk_fn_t narrow[2][4] = {
        { cpu_pk_1x1, cpu_pk_1x2, cpu_pk_1x3, cpu_pk_1x4 },
        { cpu_pk_2x1, cpu_pk_2x2, cpu_pk_2x3, cpu_pk_2x3 },
    };
    static const cpu_pk_fn_t tall[7] = { /* by block height 3..6 */
        NULL, NULL, NULL, cpu_pk_3x1, cpu_pk_4x1, cpu_pk_5x1, cpu_pk_6x1
    };
    size_t ps = (size_t)k * CPU_PACK_NR;
    int n0 = n_begin;

    if (n_tok <= 2) {
        int max_np = n_tok == 1 ? 4 : 3;

        while (n0 < n_end) {
            int np = BT_MIN(max_np, BT_DIV_UP(n_end - n0, CPU_PACK_NR));

            narrow[n_tok - 1][np - 1](out + n0, ldo, x, ldx,
                                      wp + (size_t)(n0 / CPU_PACK_NR) * ps,
                                      ps, k, n_end - n0,
                                      bias != NULL ? bias + n0 : NULL,
                                      accumulate);
            n0 += np * CPU_PACK_NR;
        }
        return;
    }
    for (; n0 < n_end; n0 += CPU_PACK_NR) {
        const float *panel = wp + (size_t)(n0 / CPU_PACK_NR) * ps;
        const float *b = bias != NULL ? bias + n0 : NULL;
        int n_blocks = BT_DIV_UP(n_tok, 6);

        for (int blk = 0; blk < n_blocks; blk++) {
            int t0 = (int)((long)n_tok * blk / n_blocks);
            int t1 = (int)((long)n_tok * (blk + 1) / n_blocks);

            tall[t1 - t0](out + (size_t)t0 * ldo + n0, ldo,
                          x + (size_t)t0 * ldx, ldx, panel, ps, k,
                          n_end - n0, b, accumulate);
        }
    }
}
#endif /* x86-64 kernel */

// ----------------------------------------------------------------------------
// dispatch

static bool cpu_force_portable; /* tests: exercise the C kernel */

void cpu__matmul_force_portable(bool on)
{
    __atomic_store_n(&cpu_force_portable, on, __ATOMIC_RELAXED);
}

bool cpu__have_avx2(void)
{
#ifdef CPU_HAVE_X86_KERNEL
    static int have = -1; /* -1 until probed; relaxed atomics: benign */
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);

    if (__atomic_load_n(&cpu_force_portable, __ATOMIC_RELAXED))
        return false;
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h != 0;
#else
    return false;
#endif
}

void cpu__matmul(float *out, int ldo, const float *x, int ldx,
                 const float *w, int ldw, const float *bias, int n_tok, int k,
                 int n_begin, int n_end, bool accumulate)
{
#ifdef CPU_HAVE_X86_KERNEL
    if (cpu__have_avx2()) {
        cpu_matmul_avx2(out, ldo, x, ldx, w, (size_t)ldw, bias, n_tok, k,
                        n_begin, n_end, accumulate);
        return;
    }
#endif
    cpu_matmul_c(out, ldo, x, ldx, w, ldw, bias, n_tok, k, n_begin, n_end,
                 accumulate);
}

void cpu__matmul_packed(float *out, int ldo, const float *x, int ldx,
                        const float *wp, int n_out, const float *bias,
                        int n_tok, int k, int n_begin, int n_end,
                        bool accumulate)
{
    BT_ASSERT(n_begin % CPU_PACK_NR == 0 && n_end <= n_out);
    if (n_begin >= n_end || n_tok <= 0)
        return;
#ifdef CPU_HAVE_X86_KERNEL
    if (cpu__have_avx2()) {
        cpu_matmul_packed_avx2(out, ldo, x, ldx, wp, bias, n_tok, k, n_begin,
                               n_end, accumulate);
        return;
    }
#endif
    cpu_matmul_packed_c(out, ldo, x, ldx, wp, bias, n_tok, k, n_begin, n_end,
                        accumulate);
}
