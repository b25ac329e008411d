/*
 * cuda_backend_int.h - what the CUDA backend's files share (cuda_backend.c
 * lists them): the per-rank and backend state, plans and graphs of a
 * step, and the helpers one file calls in another.  Not for other
 * modules: they see cuda_backend.h and backend.h.
 */
#ifndef BT_WORKER_CUDA_BACKEND_INT_H
#define BT_WORKER_CUDA_BACKEND_INT_H

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "backend_tp.h"
#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cuda_backend.h"
#include "cuda_int.h"
#include "cuda_sample.h"
#include "gemm.h"
#include "kernels/allreduce.h"
#include "kernels/attn_decode.h"
#include "kernels/attn_prefill.h"
#include "kernels/convert.h"
#include "kernels/embed.h"
#include "kernels/fp8.h"
#include "kernels/gemv.h"
#include "kernels/kv_copy.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_kv.h"
#include "kernels/swiglu.h"
#include "kernels/synth_fill.h"
#include "model/model_shard.h"
#include "model/model_synth.h"
#include "cuda_switches.h"
#include "nccl_dl.h"

#define CUDA_MAX_SPLITS 64        /* key splits per token, at most */
/* Decode steps up to this many tokens take RoPE inside the attention
 * kernel (one kernel a layer less; faster at batch 1 and 8, equal to
 * slower at batch 64, where RoPE already ran under the attention's start
 * with PDL: round 12 of docs/PERFORMANCE.md). */
#define CUDA_ROPE_FUSE_MAX_TOK 16
/* Steps of up to this many tokens fuse RMSNorm (and SwiGLU) into the rows
 * GEMV: at 2 tokens the tuner's picks beat the 2-token rows kernel, so
 * unfused wins (round 12). */
#define CUDA_FUSE_NORM_MAX_TOK 1
#define CUDA_MAX_GRAPHS 64        /* captured decode graphs kept */
#define CUDA_PREFILL_MIN 16       /* chunk length that takes tiled attn */
#define CUDA_WIDE_TOKENS 2        /* kv8: widened pages, x max_tok tokens */
#define CUDA_GEMM_WS (32u << 20)  /* cuBLASLt workspace */
#define CUDA_FP8_ACC_TOK 2048     /* fp8: tokens of one cuBLASLt FP8 call */

/* Precision fp8: the four GEMMs of a layer (the fused ones as one). */
enum { CUDA_F8_QKV = 0, CUDA_F8_O, CUDA_F8_GU, CUDA_F8_DOWN, CUDA_F8_N };

/* One linear in precision fp8 (kernels/fp8.h): E4M3 codes, rows padded
 * to cuda_fp8_ld(n_in) bytes, and a scale per output row. */
typedef struct {
    uint8_t *d_w;      /* (n_out, cuda_fp8_ld(n_in)) */
    float *d_ws;       /* (n_out) */
    float in_scale;    /* static input scale, 0: per token */
} cuda_fp8_lin_t;

/* Device copy of one layer's weights (activation dtype), one rank's
 * shard (nh, nkv, hid: the rank's heads and feed-forward rows).  In
 * precision fp8 the four linears are in f8[] instead (d_wqkv, d_wo,
 * d_wgu and d_wdown NULL), in the same row order. */
typedef struct {
    cuda_fp8_lin_t f8[CUDA_F8_N];
    void *d_wqkv;      /* ((nh + 2 nkv) hd, dim) q rows, k rows, v rows */
    void *d_bqkv;      /* ((nh + 2 nkv) hd) or NULL */
    void *d_wo;        /* (dim, nh hd) */
    void *d_wgu;       /* (2 hid, dim) gate rows, then up rows */
    void *d_wdown;     /* (dim, hid) */
    void *d_attn_norm; /* (dim) */
    void *d_ffn_norm;  /* (dim) */
} cuda_layer_t;

/* One captured decode step. */
typedef struct {
    int bucket;             /* padded batch size */
    int n_splits;           /* attention key splits */
    int split_len;          /* keys per split */
    bool hidden;            /* also gathers hidden rows */
    bool single;            /* captured for single-token unmasked steps
                               (RoPE fused into the attention) */
    cudaGraphExec_t exec;
} cuda_graph_t;

/* One forward's sizes, as the host planned them (cuda_step_t) and each
 * rank enqueues them (cuda_plan_t). */
typedef struct {
    int nt;                 /* tokens computed (bucket when padded) */
    int n_rows;             /* logits rows computed */
    int n_gen;              /* tokens for the per-token attention kernel */
    int n_tiles;            /* prefill tiles */
    int n_splits;
    int split_len;
    int n_pages;            /* kv8: pages the prefill widens (0: none) */
    bool want_hidden;
    bool single;            /* every token is one new, unmasked token of
                               its sequence: RoPE may be fused into the
                               decode attention */
} cuda_fwd_size_t;

/* One forward as the host planned it, shared by every rank: sizes and
 * where each index array lies in h_meta (ints). */
typedef struct {
    cuda_fwd_size_t sz;
    bool graph;             /* replay a decode graph */
    size_t o_tokens, o_pos, o_slot, o_kv_len, o_bt_off, o_ctx, o_mask_off,
        o_gen, o_rows, o_tiles, o_bt, o_pages, o_bt_wide;
    size_t meta_ints;       /* ints of h_meta to copy up */
    size_t mask_bytes;      /* bytes of h_mask to copy up */
    const backend_batch_t *batch;
    float *h_logits;        /* (rows, vocab) host destination or NULL */
    float *h_hidden;        /* (rows, dim) or NULL */
    bool no_sync;           /* leave the step running (device sampling
                             * enqueues behind it, then waits) */
} cuda_step_t;

/* Where one forward's device-side indices are (all inside a rank's
 * d_meta). */
typedef struct {
    cuda_fwd_size_t sz;     /* cuda_step_t.sz */
    const int *d_tokens;    /* (nt) */
    const int *d_pos;       /* (nt) */
    const int *d_slot;      /* (nt) */
    const int *d_kv_len;    /* (nt) */
    const int *d_bt_off;    /* (nt) */
    const int *d_ctx;       /* (nt) */
    const int *d_mask_off;  /* (nt) */
    const int *d_gen;       /* (n_gen) */
    const int *d_rows;      /* (n_rows) */
    const int *d_tiles;     /* (n_tiles, CUDA_PREFILL_TILE_INTS) */
    const int *d_bt;        /* block tables */
    const int *d_pages;     /* (n_pages) pool block of each widened page */
    const int *d_bt_wide;   /* block tables into the widened pages (the
                               prefill sequences' entries) */
    const backend_batch_t *batch; /* for on_layer_done, NULL in graphs */
    float *h_logits;        /* host destination when copied in-line */
    float *h_hidden;
} cuda_plan_t;

/* How x is all-reduced between ranks. */
typedef enum {
    CUDA_AR_AUTO = 0,  /* custom for small messages, NCCL for large */
    CUDA_AR_NCCL,
    CUDA_AR_CUSTOM,
    CUDA_AR_NONE       /* no reduction: wrong output, for timing */
} cuda_ar_mode_t;

typedef struct cuda_backend_s cuda_backend_t;

/* One GPU: its shard of the weights, its KV heads, activations, stream,
 * graphs and communicators. */
typedef struct {
    cuda_backend_t *b;
    int rank;
    int device;               /* CUDA ordinal */
    int n_sm;
    int attn_bps;             /* decode attention blocks an SM at once */
    model_shard_t sh;         /* this rank's heads / rows */
    cudaStream_t stream;
    worker_gemm_ctx_t *gemm;

    cuda_layer_t *layers;     /* (n_layers) */
    void *d_emb;              /* (vocab, dim) replicated */
    void *d_cls;              /* (n_vocab, dim), may point into d_emb */
    bool cls_alias;           /* d_cls points into d_emb */
    void *d_final_norm;       /* (dim) */
    float *d_inv_freq;        /* (hd / 2) */

    void *d_k;                /* (layers, blocks, block_size, nkv, hd) */
    void *d_v;                /* (layers, blocks, block_size, nkv, hd) */
    float *d_kv_scale;        /* kv8: (layers, 2, nkv) K then V scales */

    float *d_x;               /* (max_tok, dim) residual stream */
    void *d_xn;               /* (max_tok, dim) normed (not in fp8) */
    void *d_qkv;              /* (max_tok, qkv_dim) */
    void *d_q;                /* (max_tok, q_dim) rotated q */
    void *d_att;              /* (max_tok, q_dim) attention out */
    void *d_gu;               /* (max_tok, 2 hid) */
    void *d_h;                /* (max_tok, hid) (not in fp8) */
    void *d_xr;               /* (row_cap, dim) normed logits rows */
    float *d_logits;          /* (row_cap, n_vocab) this rank's columns */
    float *d_hidden;          /* (hid_cap, dim), rank 0 only */
    float *d_ws;              /* split-K partials */
    void *d_wide;             /* kv8: b->wide_pages bf16 pages of K, then
                                 of V (cuda_kv8_widen_pages) */
    /* precision fp8: a GEMM input quantized (kernels/fp8.h) and the f32
     * sums of the cuBLASLt FP8 GEMM */
    uint8_t *d_xq;            /* (max_tok, ld max) codes */
    void *d_xv;               /* (1, ld max) a token's values, bf16 */
    float *d_xs;              /* (max_tok) input scales */
    float *d_acc;             /* acc_floats */
    size_t acc_floats;

    int *d_meta;              /* b->meta_cap ints */
    uint8_t *d_mask;          /* b->mask_cap bytes */

    cudaEvent_t *layer_ev;    /* (n_layers) KV written, for callbacks */
    cudaEvent_t ev_fwd[2];    /* rank 0: around a forward's device work */
    bool fwd_timed;           /* ev_fwd[0] recorded, [1] not yet read */
    atomic_int ev_layer;      /* last layer whose event is recorded */
    cuda_graph_t graphs[CUDA_MAX_GRAPHS];
    int n_graphs;
    size_t mem_free;          /* cudaMemGetInfo before the KV pool */
    size_t mem_total;

    /* tensor parallelism */
    void *comm;               /* NCCL communicator */
    uint32_t *d_ar_flags;     /* CUDA_AR_FLAG_WORDS, peers write them */
    uint32_t *d_ar_epoch;     /* CUDA_AR_MAX_BLOCKS */
    float *d_ar_stage;        /* CUDA_AR_STAGE_FLOATS(grid cap), peers
                                 read it */
    cuda_ar_t ar;             /* the custom all-reduce's peer tables */
} cuda_rank_t;

struct cuda_backend_s {
    model_config_t mc;
    backend_config_t cfg;
    cuda_dtype_t dt;          /* activations, weights, KV */
    bool fp8;                 /* precision fp8: E4M3 linears (dt bf16) */
    bool kv8;                 /* --kv-dtype fp8: K/V cached as E4M3 codes
                                 of value / scale (kv.elem_size 1) */
    int tp;                   /* ranks (1 without TP) */
    /* Per-rank sizes (the whole model when tp == 1): */
    int nh;                   /* query heads */
    int nkv;                  /* KV heads */
    int hid;                  /* feed-forward rows */
    int vocab_shard;          /* most classifier rows of a rank */
    int q_dim;                /* nh * hd */
    int kv_dim;               /* nkv * hd */
    int qkv_dim;              /* q_dim + 2 kv_dim */
    int n_sm;                 /* rank 0's, for planning */
    int attn_bps;             /* rank 0's decode attention blocks an SM */
    bool use_graphs;
    /* BT_PROFILE_SKIP (timing experiments only: results are garbage):
     * CUDA_SKIP_* bits of the per-layer ops cuda_enqueue leaves out */
    unsigned skip;
    bool tree_graphs;         /* graphs for tree-verification steps too
                                 (BT_TREE_GRAPHS=0: off) */

    kv_layout_t kv;           /* one rank's pool */

    int max_tok;              /* rows of the activation buffers */
    int bucket_max;           /* largest decode graph bucket */
    int row_cap;              /* logits rows per classifier chunk */
    int hid_cap;              /* rows of d_hidden: every row of a step */
    size_t ws_floats;
    int wide_pages;           /* kv8: pages the prefill attention may widen
                                 to bf16 a step (0: it reads the codes;
                                 cuda_attn_prefill_widen_ok) */

    int *h_meta;              /* pinned (portable), meta_cap ints */
    size_t meta_cap;
    uint8_t *h_mask;          /* pinned (portable), mask_cap bytes */
    size_t mask_cap;

    cuda_rank_t *ranks;       /* (tp) */
    backend_tp_crew_t *crew;  /* tp > 1 */
    cuda_ar_mode_t ar_mode;
    bool ar_custom_ok;        /* every pair of GPUs has peer access */
    size_t ar_custom_max;     /* bytes: auto uses custom up to this */
    cuda_nccl_t *nccl;
    cuda_nccl_id_t nccl_id;

    /* what the current crew run works on */
    const model_t *op_model;
    bool op_custom;           /* all-reduce bench: the path */
    size_t op_n;              /* all-reduce bench: floats */
    double op_us;             /* all-reduce bench: result (rank 0) */
    long op_bad[CUDA_AR_MAX_RANKS]; /* all-reduce check: wrong elements */
    const cuda_step_t *op_step;
    int op_i0, op_i1;         /* kv copies: blocks or slot count */

    /* backend_forward_sample on one GPU (cuda_sample.h), made at first
     * use */
    cuda_sampling_t *samp;

    /* GPU time of the forwards (rank 0's stream, events from the
     * metadata upload to the last copy or sampling kernel) */
    uint64_t gpu_ns;

    /* where the last forward's rows are: row i of those it returns
     * (logits and hidden alike) is device row row_map[i] of d_logits and
     * d_hidden (graph steps compute a row per padded token, in sequence
     * order; other steps only the rows asked for, in batch order);
     * hid_kept: its hidden rows are on the device (cuda_backend_hidden) */
    int *row_map;             /* (hid_cap) */
    int n_rows;
    bool hid_kept;

    /* host tier of the prefix cache (cuda__kv_host_copy; tp == 1, rank
     * 0's device), made at first use */
    cudaStream_t copy_stream; /* saves and loads, off the compute stream */
    cudaEvent_t ev_queued;    /* compute-stream work so far: a load waits */
    cudaEvent_t ev_copied;    /* the last copies: the compute stream waits */
};

/* BT_PROFILE_SKIP=op,op,...: the per-layer ops a timing experiment
 * leaves out of every forward ("time variants that leave one stage out
 * and take differences"); the outputs are then meaningless.  Ops: norm
 * (the RMSNorms, fused or not: the GEMV reads x unnormalized), qkv,
 * rope, attn, o, gu, swiglu, down. */
enum {
    CUDA_SKIP_NORM = 1u << 0,
    CUDA_SKIP_QKV = 1u << 1,
    CUDA_SKIP_ROPE = 1u << 2,
    CUDA_SKIP_ATTN = 1u << 3,
    CUDA_SKIP_O = 1u << 4,
    CUDA_SKIP_GU = 1u << 5,
    CUDA_SKIP_SWIGLU = 1u << 6,
    CUDA_SKIP_DOWN = 1u << 7
};

/* cuda_backend.c: runs fn(b, r) on every rank (the caller's thread for one
 * rank, the crew for several); makes the rank's device current on this
 * thread; grows the pinned + device metadata buffers of a step (only
 * ever grows); the power of two at or above x. */
bt_status_t cuda__each_rank(cuda_backend_t *b, backend_tp_fn fn);
bt_status_t cuda__rank_enter(cuda_rank_t *r);
bt_status_t cuda__meta_reserve(cuda_backend_t *b, size_t ints,
                               size_t mask_bytes);
int cuda__pow2_ceil(int x);

/* cuda_weights.c: a rank's weights onto its device, and one layer's
 * weights freed. */
bt_status_t cuda__weights_load(cuda_rank_t *r, const model_t *model);
void cuda__layer_free(cuda_layer_t *cl);

/* cuda_forward.c: elements of one layer's K (or V) pool on a rank. */
size_t cuda__layer_kv_elems(const cuda_backend_t *b);
/* One in-place all-reduce of r->d_x's first n floats on the rank's
 * stream: the peer-memory kernel (custom; n % 4 == 0) or NCCL (an error
 * without it).  The forward picks the path; the start-up self-check and
 * cuda_allreduce_bench.c name it. */
bt_status_t cuda__allreduce_via(cuda_rank_t *r, size_t n, bool custom);

/* cuda_kv.c: the host tier's stream and events freed (waits for copies
 * in flight; NULL-safe). */
void cuda__host_tier_free(cuda_backend_t *b);

/* The backend_ops_t entries (backend.h says what each does; cuda_backend.c
 * holds the table). */
bt_status_t cuda__forward(void *impl, const backend_batch_t *batch,
                          float *logits, float *hidden);
bt_status_t cuda__forward_sample_begin(void *impl,
                                       const backend_batch_t *batch,
                                       sampler_t *const *samplers,
                                       int *ids, float *logits,
                                       float *hidden, bool *handled);
bt_status_t cuda__forward_sample_end(void *impl);
void *cuda__kv_data(void *impl, int layer, int kv);
void *cuda__kv_data_rank(void *impl, int rank, int layer, int kv);
bt_status_t cuda__kv_copy_block(void *impl, int src_block,
                                int dst_block);
bt_status_t cuda__kv_copy_slots_op(void *impl, int n,
                                   const int *src_slots,
                                   const int *dst_slots);
bt_status_t cuda__kv_copy_in(void *impl, const void *src, int n,
                             const int *blocks, backend_done_fn_t done,
                             void *done_arg);
bt_status_t cuda__kv_host_copy(void *impl, int n, const int *blocks,
                               void *const *host, bool to_host);
bt_status_t cuda__host_pin(void *impl, void *ptr, size_t bytes,
                           bool pin);

#endif /* BT_WORKER_CUDA_BACKEND_INT_H */
