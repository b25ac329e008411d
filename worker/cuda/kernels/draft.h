/*
 * draft.h - small kernels of the EAGLE draft head on the device
 * (worker/cuda/cuda_draft.c): row gathers/scatters between feature
 * buffers, bias broadcast, and top-k of log-softmax rows so that only
 * (token, log-prob) candidates cross to the host.
 */
#ifndef BT_WORKER_CUDA_KERNELS_DRAFT_H
#define BT_WORKER_CUDA_KERNELS_DRAFT_H

#include <stdint.h>

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
 * logsumexp(row) (NaN left out of the sum).  d_ws: at least
 * cuda_topk_logprob_ws_floats(n, vocab, k) floats of scratch.  Rows of
 * up to 512K ids. */
bt_status_t cuda_topk_logprob(const float *d_logits, int n, int vocab, int k,
                              int *d_ids, float *d_logp, float *d_ws,
                              cudaStream_t stream);
size_t cuda_topk_logprob_ws_floats(int n, int vocab, int k);

/* ---- the device draft loop (cuda_draft_tree): one tree per sequence,
 * its nodes (spec_node_t, node_cap each) and state on the device; every
 * step is spec_tree_impl.h's text, run by one thread per sequence, so
 * the tree is the host path's bit for bit. */

/* Per-sequence state of the device draft loop. */
typedef struct {
    int state;      /* draft state (head KV / store slice) */
    int draft_len;  /* head KV slots with true pairs: tree rows' ctx */
    int cached;     /* target tokens cached: level d rows at cached+d-1 */
    int tokens;     /* draft tokens to select */
    int n_nodes;    /* device-written from here on */
    int n_front;
    int n_exp;
    int n_sel;
    int front[CUDA_TOPK_MAX];
} cuda_tree_seq_t;

/* Level 1: sequence i's nodes = its k candidates (d_ids/d_logp (n, k)),
 * the whole frontier. */
bt_status_t cuda_tree_level1(int n, int k, const int *d_ids,
                             const float *d_logp, void *d_nodes,
                             int node_cap, cuda_tree_seq_t *d_seqs,
                             cudaStream_t stream);

/* Level d's head rows (n * k: sequence i's frontier node r is row
 * i * k + r) written as cuda_draft.c's pass metadata d_meta (tok, pos,
 * slot, kv_len, bt_off, ctx, mask_off, feat_src, out_dst arrays of n * k)
 * and tree masks d_mask (row j at j * d * k, d * k bytes), the same
 * values spec_level_rows + draft_pass give. */
bt_status_t cuda_tree_rows(int n, int k, int d, const void *d_nodes,
                           int node_cap, const cuda_tree_seq_t *d_seqs,
                           int state_slots, int nb_per, int store_rows,
                           int *d_meta, uint8_t *d_mask,
                           cudaStream_t stream);

/* Level d's candidates (d_ids/d_logp (n * k, k)) appended as children
 * and the next frontier chosen (spec_tree_expand). */
bt_status_t cuda_tree_expand(int n, int k, int d, const int *d_ids,
                             const float *d_logp, void *d_nodes,
                             int node_cap, cuda_tree_seq_t *d_seqs,
                             cudaStream_t stream);

/* The final selection (spec_tree_select): vidx of every node, d_order
 * (n, node_cap) selected ids best first, n_sel. */
bt_status_t cuda_tree_select(int n, void *d_nodes, int node_cap,
                             cuda_tree_seq_t *d_seqs, int *d_order,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_DRAFT_H */
