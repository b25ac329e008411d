/*
 * cpu_exp.c - vectorized exp for softmax and SwiGLU.
 *
 * Softmax and SiLU call exp once per score and per hidden unit, which at
 * small model sizes costs as much as the matmuls when done one expf at a
 * time.  This is the Cephes expf (as in avx_mathfun): x = n ln2 + r with
 * |r| <= ln2/2, a degree-6 polynomial for exp(r), then 2^n through the
 * exponent bits; about 1 ulp from expf.  Inputs are clamped to
 * [-88.376, 88.376]; at the low end 2^n underflows to exactly 0, so
 * masked (-INFINITY) scores contribute nothing.
 */
#include <math.h>

#include "cpu_int.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* exp of 8 floats (the polynomial above). */
__attribute__((target("avx2,fma"))) static inline __m256
cpu_exp8(__m256 v)
{
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 lo = _mm256_set1_ps(-88.3762626647949f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f);
    const __m256 c2 = _mm256_set1_ps(-2.12194440e-4f);
    const __m256 p0 = _mm256_set1_ps(1.9875691500E-4f);
    const __m256 p1 = _mm256_set1_ps(1.3981999507E-3f);
    const __m256 p2 = _mm256_set1_ps(8.3334519073E-3f);
    const __m256 p3 = _mm256_set1_ps(4.1665795894E-2f);
    const __m256 p4 = _mm256_set1_ps(1.6666665459E-1f);
    const __m256 p5 = _mm256_set1_ps(5.0000001201E-1f);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256 fx, z, y;
    __m256i e;

    v = _mm256_max_ps(_mm256_min_ps(v, hi), lo); /* -inf -> lo */
    fx = _mm256_floor_ps(_mm256_fmadd_ps(v, log2e, half));
    v = _mm256_fnmadd_ps(fx, c1, v);
    v = _mm256_fnmadd_ps(fx, c2, v);
    z = _mm256_mul_ps(v, v);
    y = _mm256_fmadd_ps(p0, v, p1);
    y = _mm256_fmadd_ps(y, v, p2);
    y = _mm256_fmadd_ps(y, v, p3);
    y = _mm256_fmadd_ps(y, v, p4);
    y = _mm256_fmadd_ps(y, v, p5);
    y = _mm256_fmadd_ps(y, z, v);
    y = _mm256_add_ps(y, one);
    e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx),
                                           _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma")))
static void cpu_exp_avx2(float *x, int n)
{
    int i = 0;

    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, cpu_exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        x[i] = expf(x[i]);
}

/* cpu__exp_shift8 with AVX2. */
__attribute__((target("avx2,fma")))
static void cpu_exp_shift8_avx2(float *x, int n, const float shift[8],
                                float sum[8])
{
    __m256 vs = _mm256_loadu_ps(shift), acc = _mm256_setzero_ps();

    for (int i = 0; i < n; i += 8) {
        __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));

        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(sum, acc);
}
#define CPU_HAVE_EXP_AVX2 1
#endif

void cpu__exp_inplace(float *x, int n)
{
#ifdef CPU_HAVE_EXP_AVX2
    if (cpu__have_avx2()) {
        cpu_exp_avx2(x, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        x[i] = expf(x[i]);
}

void cpu__exp_shift8(float *x, int n, const float shift[8], float sum[8])
{
#ifdef CPU_HAVE_EXP_AVX2
    if (cpu__have_avx2()) {
        cpu_exp_shift8_avx2(x, n, shift, sum);
        return;
    }
#endif
    for (int l = 0; l < 8; l++)
        sum[l] = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - shift[i % 8]);
        sum[i % 8] += x[i];
    }
}
