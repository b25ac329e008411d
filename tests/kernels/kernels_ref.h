/*
 * kernels_ref.h - plain-C float32 references of the CUDA kernels in
 * worker/cuda/kernels/ (one <op>_ref.c each).  Same argument meaning as
 * the launchers, on host float arrays.
 */
#ifndef BT_TESTS_KERNELS_KERNELS_REF_H
#define BT_TESTS_KERNELS_KERNELS_REF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out (n, dim) = table[ids[i]] */
void embed_ref(const float *table, const int *ids, int n, int dim,
               float *out);

/* See cuda_rmsnorm(): x (rows, dim) updated by add when add != NULL. */
void rmsnorm_ref(float *x, const float *add, const float *w, const int *rows,
                 int n_rows, int dim, float eps, float *out);

/* See cuda_topk_logprob(): per row of logits (n, vocab), the k best ids
 * (value desc, id asc; NaN never) and their logit - logsumexp (NaN left
 * out); missing candidates get id 0 and -inf. */
void topk_ref(const float *logits, int n, int vocab, int k, int *ids,
              float *logp);

/* out (n, hidden) = silu(gu[:, :hidden]) * gu[:, hidden:] */
void swiglu_ref(const float *gu, int n, int hidden, float *out);

/* See cuda_rope_kv(); caches are (slots, nkv, hd). */
void rope_kv_ref(const float *qkv, const float *bias, const float *inv_freq,
                 const int *pos, const int *slot, int n_tokens, int nh,
                 int nkv, int hd, int rope_half, float *q, float *k_cache,
                 float *v_cache);

/* See cuda_attn_args_t: per-token paged attention, out (n, nh, hd). */
void attn_ref(int nh, int nkv, int hd, int block_size, float scale,
              const float *q, const float *k_cache, const float *v_cache,
              const int *block_tables, const uint8_t *masks,
              const int *kv_len, const int *bt_off, const int *ctx_len,
              const int *mask_off, int n_tokens, float *out);

/* y (t, o) = x (t, i) . w (o, i)^T, plus y when accumulate. */
void gemm_ref(int n_tok, int n_out, int n_in, const float *x, const float *w,
              float *y, int accumulate);

/* See cuda_kv_copy_slots(): byte copy of n slot rows in every layer of
 * k and v, every read before every write. */
void kv_copy_ref(void *k, void *v, int n_layers, size_t layer_bytes,
                 size_t row_bytes, const int *src, const int *dst, int n);

/* Lowest index of the largest value. */
int argmax_ref(const float *row, int n);
/* cuda_sample_top of one row: the min(k, vocab) largest values (desc,
 * then index asc), and the sum of expf((x - max) * inv_t). */
void sample_top_ref(const float *row, int vocab, float inv_t, int k,
                    int *ids, float *vals, double *sum);

#ifdef __cplusplus
}
#endif
#endif /* BT_TESTS_KERNELS_KERNELS_REF_H */
