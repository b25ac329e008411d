/*
 * spec_int.h - helpers shared inside worker/spec/ (the draft head, the
 * speculative decoder and the trainer).  Private to worker/spec/.
 */
#ifndef BT_WORKER_SPEC_SPEC_INT_H
#define BT_WORKER_SPEC_SPEC_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spec_head.h"

/* out (n, n_out) [+]= x (n, k) . w^T, w (n_out, k) row-major; bias may be
 * NULL.  Uses the CPU backend's weight-stationary kernel. */
void spec__matmul(float *out, const float *x, const float *w,
                  const float *bias, int n, int k, int n_out,
                  bool accumulate);

/* out (rows, cols) = in^T for in (cols, rows). */
void spec__transpose(float *out, const float *in, int rows, int cols);

/* out = x / sqrt(mean(x^2) + eps) * weight for one row of dim. */
void spec__rmsnorm(float *out, const float *x, const float *weight, int dim,
                   float eps);

/* Rotates n_heads heads of head_dim in vec (half-split layout) for
 * position pos; sign -1 rotates back (the backward pass). */
void spec__rope(float *vec, int n_heads, int head_dim, const float *inv_freq,
                int pos, float sign);

static inline float spec__silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* xorshift64* stream for seeded initialisation and training. */
static inline uint64_t spec__rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static inline float spec__rng_uniform(uint64_t *s)
{
    return (float)(spec__rng_next(s) >> 40) / 16777216.0f;
}

/* Names of the head's tensors in safetensors order of the flat array. */
extern const char *const spec__tensor_names[SPEC_HEAD_N_TENSORS];

#endif /* BT_WORKER_SPEC_SPEC_INT_H */
