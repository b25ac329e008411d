/*
 * cpu_swiglu.c - the SwiGLU gate of the Llama feed-forward block.
 *
 * The backend fuses the gate and up projections into one matrix whose
 * rows alternate gate_i, up_i, so one matmul produces both and any
 * thread's slice of output rows holds matching gate/up pairs.  With AVX2
 * one pass de-interleaves eight pairs, takes exp(-gate) (cpu_exp8.h) and
 * writes gate / (1 + exp(-gate)) * up: no scratch pass, no expf calls.
 */
#include <math.h>

#include "cpu_int.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "cpu_exp8.h"

__attribute__((target("avx2,fma")))
static int cpu_swiglu_avx2(float *out, const float *gu, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 zero = _mm256_setzero_ps();
    int i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(gu + 2 * i);     /* g0 u0 g1 u1 | g2 .. */
        __m256 b = _mm256_loadu_ps(gu + 2 * i + 8); /* g4 u4 .. */
        /* per 128-bit half: [g0 g1 g4 g5], [u0 u1 u4 u5] (then g2 g3 g6 g7) */
        __m256 g = _mm256_shuffle_ps(a, b, 0x88);
        __m256 u = _mm256_shuffle_ps(a, b, 0xdd);
        __m256 e = cpu_exp8(_mm256_sub_ps(zero, g));
        __m256 r = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);

        /* lanes are g0 g1 g4 g5 g2 g3 g6 g7: restore the order */
        r = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(r),
                                                   0xd8));
        _mm256_storeu_ps(out + i, r);
    }
    return i;
}
#define CPU_HAVE_SWIGLU_AVX2 1
#endif

void cpu__swiglu(float *out, const float *gu, int n, float *tmp)
{
    int i = 0;

#ifdef CPU_HAVE_SWIGLU_AVX2
    if (cpu__have_avx2())
        i = cpu_swiglu_avx2(out, gu, n);
#endif
    if (i >= n)
        return;
    for (int j = i; j < n; j++)
        tmp[j - i] = -gu[2 * j];
    cpu__exp_inplace(tmp, n - i);
    for (int j = i; j < n; j++)
        out[j] = gu[2 * j] / (1.0f + tmp[j - i]) * gu[2 * j + 1];
}
