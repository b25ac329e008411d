/*
 * sample_dist.h - the plain-C core of cuda_sample_dist (a row sampled on
 * the device from its whole distribution: no 256-candidate limit), shared
 * by the kernel (sample.cu), its CPU reference
 * (tests/kernels/sample_dist_ref.c), the host side (cuda_sample.c) and
 * the CPU test (tests/worker/test_sample_dist.c).  No CUDA headers.
 *
 * What a row computes (the host sampler's steps, worker/sampler.c):
 *   max over the row; NaN anywhere or an infinite max: token
 *     CUDA_DIST_NONFINITE (the host samples the whole row, exactly);
 *   e_i = expf((l_i - max) * inv_t), sum = sum of e_i (double, block
 *     order), P_i = (float)(e_i / sum);
 *   F = {i : P_i >= min_p * (float)(1 / sum)} (all when min_p is 0);
 *   mode (sd_mode): id order over F (plain temperature, min-p), the best
 *     of F (top-k 1), the sorted nucleus (top-p: (P desc, id asc), the
 *     first min(top_k, |F|), the (1 - top_p) / (n - 1) cut, then the
 *     prefix whose mass reaches top_p), or CUDA_DIST_ORDER (top-k > 1
 *     without top-p: the host's quickselect order, which needs the row);
 *   the draw: the first candidate in that order whose cumulative mass
 *     exceeds u * keep (keep = the candidates' mass), u = the sampler's
 *     own uniform.
 * Masses are fixed point (SD_FX_ONE = 2^60 = probability 1: integer sums,
 * the same in any order); the host sums doubles in its order and walks a
 * float running sum for the draw (see the contract in cuda_sample.h).
 */
#ifndef BT_WORKER_CUDA_KERNELS_SAMPLE_DIST_H
#define BT_WORKER_CUDA_KERNELS_SAMPLE_DIST_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SD_HD static inline __host__ __device__
#else
#define SD_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_dist_out_t.token when the device did not sample the row */
#define CUDA_DIST_NONFINITE (-1) /* NaN or infinite logits: host legacy */
#define CUDA_DIST_ORDER (-2)     /* top-k > 1 alone: quickselect order */

/* One row to sample (host -> device). */
typedef struct {
    int row;     /* row index: logits at d_logits + row * ld */
    int top_k;   /* 0 = off */
    float inv_t; /* 1.0f / temperature, temperature > 0 */
    float top_p; /* (0, 1]; 1 = off */
    float min_p; /* [0, 1]; 0 = off */
    float u;     /* the sampler's next uniform, k / 2^24 in [0, 1) */
} cuda_dist_spec_t;

/* One row's result (device -> host). */
typedef struct {
    int token;     /* sampled id, or CUDA_DIST_NONFINITE / _ORDER */
    int n;         /* candidates drawn from (nucleus / survivors) */
    uint64_t keep; /* their mass, SD_FX_ONE = 1 */
    double sum;    /* the normalizer sum of e_i */
} cuda_dist_out_t;

#define SD_FX_ONE 0x1p60

enum {
    SD_MODE_ID = 0, /* F in id order */
    SD_MODE_TOP1,   /* the first of F in (P desc, id asc) */
    SD_MODE_SORTED, /* top-p over (P desc, id asc) */
    SD_MODE_ORDER   /* not done on the device */
};

/* Order-preserving key of a probability (P >= 0: its bits). */
SD_HD uint32_t sd_key(float p)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(p);
#else
    uint32_t u;
    memcpy(&u, &p, sizeof(u));
    return u;
#endif
}

SD_HD float sd_unkey(uint32_t k)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(k);
#else
    float f;
    memcpy(&f, &k, sizeof(f));
    return f;
#endif
}

/* A probability in fixed point, truncated (exact for P >= 2^-37). */
SD_HD uint64_t sd_fx(float p)
{
    return (uint64_t)((double)p * SD_FX_ONE);
}

/* The min-p cut, as sampler.c computes it (0: every id passes). */
SD_HD float sd_cut_m(float min_p, double sum)
{
    return min_p > 0.0f ? min_p * (float)(1.0 / sum) : 0.0f;
}

/* The top-p pre-cut over nk candidates, as sampler.c computes it. */
SD_HD float sd_cut_p(float top_p, int nk)
{
    return (1.0f - top_p) / (float)(nk > 1 ? nk - 1 : 1);
}

/* How the row is sampled, given |F| = n_f. */
SD_HD int sd_mode(const cuda_dist_spec_t *s, int n_f)
{
    if (s->top_p < 1.0f)
        return SD_MODE_SORTED;
    if (s->top_k > 0 && s->top_k < n_f)
        return s->top_k == 1 ? SD_MODE_TOP1 : SD_MODE_ORDER;
    return SD_MODE_ID;
}

/* The candidates' count limit in sorted mode: min(top_k, n_f), cut to
 * the g candidates at or above the top-p pre-cut (all if none is). */
SD_HD int sd_limit(const cuda_dist_spec_t *s, int n_f, int g)
{
    int nk = s->top_k > 0 && s->top_k < n_f ? s->top_k : n_f;
    int limit = g < nk ? g : nk;

    return limit == 0 ? nk : limit;
}

/* floor(u * keep) exactly, u = U / 2^24: the draw picks the first
 * candidate whose cumulative mass exceeds it (u < C / keep). */
SD_HD uint64_t sd_target(uint64_t keep, float u)
{
    uint64_t uu = (uint64_t)(u * 16777216.0f);

    if (uu > 0xFFFFFFull)
        uu = 0xFFFFFFull;
    return (keep >> 24) * uu + (((keep & 0xFFFFFFull) * uu) >> 24);
}

/* Within a run of cnt equal candidates of mass w each that starts after
 * mass s_gt: the rank (1-based) of the first whose cumulative mass
 * exceeds t (t >= s_gt), at most cnt. */
SD_HD uint32_t sd_rank_in_run(uint64_t t, uint64_t s_gt, uint64_t w,
                              uint32_t cnt)
{
    uint64_t j = w ? (t - s_gt) / w + 1 : cnt;

    return j < cnt ? (uint32_t)j : cnt;
}

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_SAMPLE_DIST_H */
