/*
 * attn_decode.h - paged attention over the KV cache, one query token per
 * work item (decode tokens, short chunks, masked draft trees), with the
 * key range split across thread blocks (flash-decoding).
 *
 * The per-token description (cuda_attn_args_t) is shared with the tiled
 * prefill kernel in attn_prefill.h.
 */
#ifndef BT_WORKER_CUDA_KERNELS_ATTN_DECODE_H
#define BT_WORKER_CUDA_KERNELS_ATTN_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int block_size;             /* tokens per KV block */
    float scale;                /* 1/sqrt(head_dim) */
    const void *d_q;            /* (tokens, nh, hd) rotated queries */
    const void *d_k_cache;      /* (n_blocks * block_size, nkv, hd) layer K */
    const void *d_v_cache;      /* (n_blocks * block_size, nkv, hd) layer V */
    const float *d_kv_scale;    /* NULL: K/V in the activation dtype; else
                                   FP8 KV (bf16 only): E4M3 codes, value =
                                   code * scale, (2, nkv) K then V scales
                                   of this layer (rope_kv.h).  Read by
                                   both decode kernels and the prefill
                                   kernels (FA2: fa2 / fa2wqv); the fused
                                   RoPE (d_qkv) writes codes with them */
    bool kv_widened;            /* with d_kv_scale: K/V are bf16 copies of
                                   the E4M3 codes (cuda_kv8_widen_pages:
                                   exact), read by the bf16 prefill
                                   kernels with the scales applied as
                                   for the codes (prefill only) */
    long long kv_slots;         /* n_blocks * block_size of those caches, or
                                   0 (unknown: the TMA prefill kernel,
                                   which maps them, is then not used) */
    const int *d_block_tables;  /* every sequence's block table, concatenated */
    const uint8_t *d_masks;     /* every sequence's (n, n) mask, concatenated */
    /* Per batch token: */
    const int *d_kv_len;        /* (tokens) attend to slots [0, kv_len) */
    const int *d_bt_off;        /* (tokens) start of its block table */
    const int *d_ctx_len;       /* (tokens) cached tokens of its sequence */
    const int *d_mask_off;      /* (tokens) offset of its mask row, or -1:
                                   slot s >= ctx_len is visible iff
                                   mask[mask_off + s - ctx_len] != 0 */
    void *d_out;                /* (tokens, nh, hd) attention output */
    int pdl_late;               /* set by cuda_attn_decode from
                                   cuda__pdl_late (cuda_int.h) */
    /* Optional: RoPE and the new key's K/V write fused into the decode
     * kernel (cuda_attn_decode_rope_ok), for steps whose every token is
     * one new token of its sequence, unmasked (kv_len = ctx_len + 1: no
     * token reads another's new key).  d_qkv NULL: d_q is read, rotated
     * and the cache written by cuda_rope_kv before.  Otherwise d_q is
     * neither read nor written; the fields are cuda_rope_kv_args_t's. */
    const void *d_qkv;          /* (tokens, (nh + 2 nkv) hd) q|k|v */
    const void *d_qkv_bias;     /* ((nh + 2 nkv) hd) or NULL */
    const float *d_inv_freq;    /* (hd / 2) */
    const int *d_pos;           /* (tokens) RoPE positions */
    const int *d_slot;          /* (tokens) the new key's slot, < 0: none */
    int rope_half;              /* 1: rotate (i, i + hd/2); 0: (2i, 2i+1) */
} cuda_attn_args_t;

/* True when cuda_attn_decode can take the fused RoPE fields for `n`
 * tokens (the tensor-core kernel runs them). */
bool cuda_attn_decode_rope_ok(const cuda_attn_args_t *args, int n,
                              cuda_dtype_t dt);

/* True when the kernels support this head size (8, 16, ..., 256). */
bool cuda_attn_head_dim_ok(int head_dim);

/* Chooses the split of the key range for `n` query tokens whose longest
 * key range is `max_kv`: split_len is a power of two (64 .. 4096, more
 * only when max_splits forces it), n_splits * split_len >= max_kv,
 * n_splits <= max_splits; the split that minimises the larger of waves
 * x (fixed cost + keys per block) and the keys over the bandwidth, + a
 * combine cost when split, a wave being `blocks_per_sm` blocks on each
 * of `n_sm` multiprocessors (one block per token and KV head when the
 * batch fills the GPU; short splits when one wave is not full and the
 * bandwidth does not bound the step). */
void cuda_attn_decode_plan(int n, int max_kv, int n_heads, int n_kv_heads,
                           int n_sm, int blocks_per_sm, int max_splits,
                           int *n_splits_p, int *split_len_p);

/* Blocks of the decode attention resident on one SM at once for this head
 * size, KV dtype and query group (heads a KV head; the tensor-core
 * kernel's occupancy on the current device: 2 for bf16 K/V at head size
 * 128, more for FP8 K/V, whose tiles take half the shared memory, and
 * most for FP8 groups of <= 8 heads); 2 for head sizes it does not take
 * or when the query fails.  cuda_attn_decode_plan's blocks_per_sm. */
int cuda_attn_decode_blocks_per_sm(int head_dim, bool kv8, int group);

/* Floats of workspace cuda_attn_decode needs (0 when n_splits == 1). */
size_t cuda_attn_decode_ws_floats(int n, int n_heads, int head_dim,
                                  int n_splits);

/* Attention for the `n` batch tokens listed in d_tok_idx (NULL: tokens
 * 0..n-1).  d_ws: cuda_attn_decode_ws_floats() floats. */
bt_status_t cuda_attn_decode(const cuda_attn_args_t *args,
                             const int *d_tok_idx, int n, int n_splits,
                             int split_len, float *d_ws, cuda_dtype_t dt,
                             cudaStream_t stream);

/* The tensor-core kernel (attn_decode_tc.cu) that cuda_attn_decode()
 * picks for bf16, head size 64/128 and up to 16 heads per KV head, unless
 * BT_ATTN_TC=0 is set (cuda_switches.h; tests of the general kernel). */
bool cuda_attn_decode_tc_ok(const cuda_attn_args_t *args, cuda_dtype_t dt);
bt_status_t cuda_attn_decode_tc(const cuda_attn_args_t *args,
                                const int *d_tok_idx, int n, int n_splits,
                                int split_len, float *d_ws,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_ATTN_DECODE_H */
