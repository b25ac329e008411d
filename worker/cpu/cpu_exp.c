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

#include "cpu_exp8.h"

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
