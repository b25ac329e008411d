/*
 * rope_kv.h - RoPE on q and k, fused with writing k and v into the paged
 * KV cache (and the optional q/k/v bias add).
 */
#ifndef BT_WORKER_CUDA_KERNELS_ROPE_KV_H
#define BT_WORKER_CUDA_KERNELS_ROPE_KV_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_tokens;
    int n_heads;
    int n_kv_heads;
    int head_dim;              /* even */
    int rope_half;             /* 1: rotate (i, i+hd/2); 0: (2i, 2i+1) */
    const void *d_qkv;         /* (n_tokens, (nh + 2*nkv) * hd) q|k|v */
    const void *d_bias;        /* ((nh + 2*nkv) * hd) or NULL */
    const float *d_inv_freq;   /* (hd/2) scaled inverse frequencies */
    const int *d_pos;          /* (n_tokens) RoPE positions */
    const int *d_slot;         /* (n_tokens) block*block_size + offset,
                                  < 0: do not write K/V */
    void *d_q;                 /* (n_tokens, nh * hd) rotated q (out) */
    void *d_k_cache;           /* (n_blocks * block_size, nkv, hd) layer K */
    void *d_v_cache;           /* (n_blocks * block_size, nkv, hd) layer V */
    const float *d_kv_scale;   /* NULL: the cache is in the activation
                                  dtype; else FP8 KV, (2, nkv) this layer's
                                  K then V scales: the cache holds E4M3
                                  codes of bf16(value) / scale, rounded as
                                  common/bt_fp8.h (the cpu's bytes) */
    int pdl_late;              /* set by cuda_rope_kv from cuda__pdl_late
                                  (cuda_int.h) */
} cuda_rope_kv_args_t;

/* All tensors in `dt` except the f32 frequencies and int32 indices. */
bt_status_t cuda_rope_kv(const cuda_rope_kv_args_t *args, cuda_dtype_t dt,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_ROPE_KV_H */
