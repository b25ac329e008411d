/*
 * sample.h - token selection on the GPU, so that only ids (or a few
 * candidates per row) cross to the host.
 */
#ifndef BT_WORKER_CUDA_KERNELS_SAMPLE_H
#define BT_WORKER_CUDA_KERNELS_SAMPLE_H

#include "../cuda_int.h"
#include "sample_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most candidates cuda_sample_top returns per row. */
#define CUDA_SAMPLE_TOP_MAX 256

/* d_ids[r] = the lowest index of the largest value of logits row r
 * (the CPU argmax's tie rule).  d_logits (n_rows, vocab) f32. */
bt_status_t cuda_argmax(const float *d_logits, int n_rows, int vocab,
                        int *d_ids, cudaStream_t stream);

/* cuda_argmax over chosen rows: d_ids[i] = argmax of row d_rows[i] of
 * d_logits (rows of `ld` floats, the first `vocab` used).  d_rows NULL:
 * row i. */
bt_status_t cuda_argmax_rows(const float *d_logits, size_t ld,
                             const int *d_rows, int n, int vocab, int *d_ids,
                             cudaStream_t stream);

/* Top-k candidates and softmax normalizer of chosen rows, for sampling
 * on the host (sampler_sample_top).  For i < n, row x = d_logits +
 * d_rows[i] * ld (i when d_rows is NULL), with kk = min(k, vocab):
 *   d_ids[i*k + j], d_vals[i*k + j] (j < kk): the kk largest x values
 *     and their indices, ordered by value descending, then index
 *     ascending (ties at the boundary: lowest indices win);
 *   d_sum[i] = sum over the whole row (vocab values, in double) of
 *     expf((x[v] - max) * d_inv_t[i]), max = the row's largest value.
 * NaN counts as the smallest value.  k in 1..CUDA_SAMPLE_TOP_MAX.
 * d_ws: cuda_sample_top_ws_bytes(n, vocab) bytes of device scratch (the
 * row is split over up to 16 blocks; launches sharing it must not
 * overlap). */
bt_status_t cuda_sample_top(const float *d_logits, size_t ld,
                            const int *d_rows, int n, int vocab,
                            const float *d_inv_t, int k, int *d_ids,
                            float *d_vals, double *d_sum, void *d_ws,
                            cudaStream_t stream);
size_t cuda_sample_top_ws_bytes(int n, int vocab);

/* Samples chosen rows from their whole distribution, as sample_dist.h
 * describes (top-p / min-p / plain temperature with any nucleus size;
 * the host sampler's uniform comes in the spec, only the id goes back).
 * For i < n: d_spec[i] names the row (d_logits + row * ld, the first
 * `vocab` floats) and its parameters; d_out[i] gets the result.  d_p:
 * (n, vocab) f32 scratch, left holding row i's probabilities P.  One
 * thread-block cluster per row (up to 16 blocks, each a slice of the
 * row; BT_SAMPLE_DIST_CLUSTER=N caps the blocks, 1: one block); no
 * allocation, everything on `stream` (graph-safe). */
bt_status_t cuda_sample_dist(const float *d_logits, size_t ld, int vocab,
                             const cuda_dist_spec_t *d_spec, int n,
                             float *d_p, cuda_dist_out_t *d_out,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_SAMPLE_H */
