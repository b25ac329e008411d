/*
 * draft.h - small kernels of the EAGLE draft head on the device
 * (worker/cuda/cuda_draft.c): row gathers/scatters between feature
 * buffers, bias broadcast, and top-k of log-softmax rows so that only
 * (token, log-prob) candidates cross to the host.
 */
#ifndef BT_WORKER_CUDA_KERNELS_DRAFT_H
#define BT_WORKER_CUDA_KERNELS_DRAFT_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most candidates cuda_topk_logprob returns per row. */
#define CUDA_TOPK_MAX 16

/* Row copy in dtype dt, for i < n:
 *   s = d_src_idx ? d_src_idx[i] : i; source row = s >= 0 ? src_a[s]
 *   : src_b[-s - 1];  r = d_dst_idx ? d_dst_idx[i] : i; dst[r] = source
 *   (skipped when r < 0).
 * Rows are dim elements; indices trusted. */
bt_status_t cuda_draft_rows(const void *d_src_a, const void *d_src_b,
                            const int *d_src_idx, const int *d_dst_idx,
                            int n, int dim, void *d_dst, cuda_dtype_t dt,
                            cudaStream_t stream);

/* d_h (n, dim) f32: every row = d_bias (dim) f32. */
bt_status_t cuda_draft_bias(float *d_h, const float *d_bias, int n, int dim,
                            cudaStream_t stream);

/* For each row r of d_logits (n, vocab) f32: the k (<= CUDA_TOPK_MAX)
 * largest entries, best first, ties to the lower id (NaN never wins), as
 * ids d_ids (n, k) and log-probabilities d_logp (n, k) = logit -
 * logsumexp(row). */
bt_status_t cuda_topk_logprob(const float *d_logits, int n, int vocab, int k,
                              int *d_ids, float *d_logp,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_DRAFT_H */
