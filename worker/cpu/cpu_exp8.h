/*
 * cpu_exp8.h - the 8-wide AVX2 exp of cpu_exp.c, for kernels that fuse it
 * into their own loops (cpu_exp.c, cpu_swiglu.c).  x86-64 GCC/Clang only;
 * include after <immintrin.h>.
 */
#ifndef BT_WORKER_CPU_CPU_EXP8_H
#define BT_WORKER_CPU_CPU_EXP8_H

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

#endif /* BT_WORKER_CPU_CPU_EXP8_H */
