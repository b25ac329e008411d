/*
 * kt_common.h - helpers for the kernel tests (tests/kernels/test_*.cu):
 * seeded random inputs, bf16 rounding, device upload in either dtype,
 * NaN poisoning of outputs, comparison against the CPU reference
 * (relative L2 error plus an elementwise abs+rel report), CUDA-event
 * timing.  Tests exit non-zero on the first failed comparison.
 */
#ifndef BT_TESTS_KERNELS_KT_COMMON_H
#define BT_TESTS_KERNELS_KT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_int.h"
#include "cuda_switches.h"

#define KT_CUDA(_expr)                                                      \
    do {                                                                    \
        cudaError_t _e = (_expr);                                           \
        if (_e != cudaSuccess) {                                            \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__,     \
                    #_expr, cudaGetErrorString(_e));                        \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

#define KT_OK(_expr)                                                        \
    do {                                                                    \
        int _st = (int)(_expr);                                             \
        if (_st != 0) {                                                     \
            fprintf(stderr, "FAIL %s:%d: %s returned %d\n", __FILE__,       \
                    __LINE__, #_expr, _st);                                 \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* Sets (value NULL: unsets) a switch and re-reads the switch table,
 * which the launchers read instead of the environment
 * (cuda_switches.h). */
static inline void kt_switch(const char *var, const char *value)
{
    if (value)
        setenv(var, value, 1);
    else
        unsetenv(var);
    cuda_switches_reload();
}

static uint64_t kt_rng = 0x9E3779B97F4A7C15ull;

static inline void kt_seed(uint64_t s) { kt_rng = s * 0x9E3779B97F4A7C15ull + 1; }

static inline uint32_t kt_u32(void)
{
    kt_rng ^= kt_rng << 13;
    kt_rng ^= kt_rng >> 7;
    kt_rng ^= kt_rng << 17;
    return (uint32_t)(kt_rng >> 11);
}

static inline float kt_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(kt_u32() & 0xFFFFFF) / 16777216.0f;
}

static inline uint16_t kt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000)
        return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float kt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Random values in [lo, hi), rounded to bf16 when dt is bf16 so that the
 * reference sees exactly what the GPU sees. */
static inline float *kt_rand_vec(size_t n, float lo, float hi,
                                 cuda_dtype_t dt)
{
    float *v = (float *)malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        v[i] = kt_uniform(lo, hi);
        if (dt == CUDA_DT_BF16)
            v[i] = kt_bf16_to_f32(kt_f32_to_bf16(v[i]));
    }
    return v;
}

/* Device copy of h (n floats) in dtype dt. */
static inline void *kt_upload(const float *h, size_t n, cuda_dtype_t dt)
{
    void *d = NULL;
    size_t es = dt == CUDA_DT_F32 ? 4 : 2;
    KT_CUDA(cudaMalloc(&d, es * (n ? n : 1)));
    if (dt == CUDA_DT_F32) {
        KT_CUDA(cudaMemcpy(d, h, 4 * n, cudaMemcpyHostToDevice));
    } else {
        uint16_t *b = (uint16_t *)malloc(2 * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
            b[i] = kt_f32_to_bf16(h[i]);
        KT_CUDA(cudaMemcpy(d, b, 2 * n, cudaMemcpyHostToDevice));
        free(b);
    }
    return d;
}

static inline void *kt_upload_raw(const void *h, size_t bytes)
{
    void *d = NULL;
    KT_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes)
        KT_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* A device buffer of n elements filled with NaN (all bits set). */
static inline void *kt_poisoned(size_t n, cuda_dtype_t dt)
{
    void *d = NULL;
    size_t bytes = (dt == CUDA_DT_F32 ? 4 : 2) * (n ? n : 1);
    KT_CUDA(cudaMalloc(&d, bytes));
    KT_CUDA(cudaMemset(d, 0xFF, bytes));
    return d;
}

static inline void kt_poison(void *d, size_t n, cuda_dtype_t dt)
{
    KT_CUDA(cudaMemset(d, 0xFF, (dt == CUDA_DT_F32 ? 4 : 2) * n));
}

/* Host floats of a device buffer of n elements in dtype dt. */
static inline float *kt_download(const void *d, size_t n, cuda_dtype_t dt)
{
    float *h = (float *)malloc(sizeof(float) * (n ? n : 1));
    KT_CUDA(cudaDeviceSynchronize());
    if (dt == CUDA_DT_F32) {
        KT_CUDA(cudaMemcpy(h, d, 4 * n, cudaMemcpyDeviceToHost));
    } else {
        uint16_t *b = (uint16_t *)malloc(2 * (n ? n : 1));
        KT_CUDA(cudaMemcpy(b, d, 2 * n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            h[i] = kt_bf16_to_f32(b[i]);
        free(b);
    }
    return h;
}

/* Tolerances (STYLE F34): relative L2 error bound per dtype, and the
 * elementwise abs + rel bound used only to list mismatches. */
static inline double kt_tol(cuda_dtype_t dt)
{
    return dt == CUDA_DT_F32 ? 1e-5 : 1e-2;
}

static int kt_failures;

/* Compares out against ref: fails on any NaN/Inf or when
 * ||out - ref|| / ||ref|| > tol.  Prints the first 5 values and up to 10
 * elementwise mismatches. Returns 1 on pass. */
static inline int kt_compare(const char *what, const float *out,
                             const float *ref, size_t n, double tol)
{
    double num = 0.0, den = 0.0;
    size_t bad = 0, shown = 0;

    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - ref[i];
        if (!isfinite(out[i])) {
            bad++;
            if (shown++ < 10)
                printf("  %s[%zu] = %g (ref %g): not finite (unwritten?)\n",
                       what, i, out[i], ref[i]);
            continue;
        }
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > 10 * tol + 10 * tol * fabs(ref[i]) && shown++ < 10)
            printf("  %s[%zu] = %.7g, ref %.7g\n", what, i, out[i], ref[i]);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int pass = bad == 0 && rel <= tol;
    printf("%s %-48s n=%-9zu rel_err=%.3e (tol %.0e) first: %.5g %.5g %.5g "
           "%.5g %.5g\n", pass ? "PASS" : "FAIL", what, n, rel, tol,
           n > 0 ? out[0] : 0.f, n > 1 ? out[1] : 0.f, n > 2 ? out[2] : 0.f,
           n > 3 ? out[3] : 0.f, n > 4 ? out[4] : 0.f);
    if (!pass)
        kt_failures++;
    return pass;
}

/* A yes/no check, counted and printed like kt_compare.  Returns ok. */
static inline int kt_check(const char *what, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    if (!ok)
        kt_failures++;
    return ok;
}

static inline const char *kt_dt_name(cuda_dtype_t dt)
{
    return dt == CUDA_DT_F32 ? "f32" : "bf16";
}

static inline int kt_finish(const char *name)
{
    if (kt_failures) {
        printf("%s: %d comparison(s) FAILED\n", name, kt_failures);
        return 1;
    }
    printf("%s: all passed\n", name);
    return 0;
}

/* A buffer larger than L2 (50 MB on H200) written to flush it. */
static inline void kt_flush_l2(void)
{
    static void *d_flush = NULL;
    const size_t bytes = 256u << 20;
    if (d_flush == NULL)
        KT_CUDA(cudaMalloc(&d_flush, bytes));
    KT_CUDA(cudaMemset(d_flush, 0, bytes));
}

/* Event timing on stream 0: kt_timer_start(), then `iters` calls, then
 * kt_timer_us(iters) = microseconds a call. */
static cudaEvent_t kt_timer_ev[2];

static inline void kt_timer_start(void)
{
    if (kt_timer_ev[0] == NULL) {
        KT_CUDA(cudaEventCreate(&kt_timer_ev[0]));
        KT_CUDA(cudaEventCreate(&kt_timer_ev[1]));
    }
    KT_CUDA(cudaEventRecord(kt_timer_ev[0], 0));
}

static inline double kt_timer_us(int iters)
{
    float ms = 0.0f;

    KT_CUDA(cudaEventRecord(kt_timer_ev[1], 0));
    KT_CUDA(cudaEventSynchronize(kt_timer_ev[1]));
    KT_CUDA(cudaEventElapsedTime(&ms, kt_timer_ev[0], kt_timer_ev[1]));
    return (double)ms * 1e3 / iters;
}

static int kt_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static inline float kt_median(float *v, int n)
{
    qsort(v, n, sizeof(float), kt_cmp_float);
    return v[n / 2];
}

#endif /* BT_TESTS_KERNELS_KT_COMMON_H */
