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
