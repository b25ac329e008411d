/*
 * cuda_backend.c - the "cuda" backend: a Llama-family forward pass on one
 * NVIDIA GPU, or on tp GPUs with tensor parallelism, over mixed batches
 * (prompt chunks and decode tokens).
 *
 * Weights live on the device in bf16 (f32 in BACKEND_PRECISION_F32),
 * converted on the device from the checkpoint's F32/F16/BF16, or, for
 * synthesized models, generated on the device from (seed, tensor, element
 * index) (kernels/synth_fill.cu: the host generator's bytes, without the
 * host copy); q|k|v and gate|up are fused into single matrices so each is
 * one GEMM.  The residual stream is f32: the o and down projections
 * accumulate into it straight from cuBLASLt (beta = 1).  The KV pool is
 * device memory laid out as kv.h says, in the activation dtype.
 *
 * One forward: the host writes every per-token index (ids, positions, KV
 * slots, key ranges, block tables, logits rows, prefill tiles) into one
 * pinned buffer, copies it up once, and enqueues per layer
 *   rmsnorm -> QKV GEMM -> RoPE + KV write -> attention -> O GEMM (+=x)
 *   -> rmsnorm -> gate|up GEMM -> SwiGLU -> down GEMM (+=x)
 * then the final norm of the logits rows, the classifier GEMM (f32 out)
 * and the copy of logits (and hidden rows) to the host.  Attention: long
 * prompt chunks (bf16) go to the tiled tensor-core kernel, every other
 * token to the split-K per-token kernel.
 *
 * Decode-only batches (every sequence one token, no layer callback) are
 * padded to a power-of-two bucket and replayed from a CUDA graph captured
 * once per (bucket, key split); the device buffers they read are fixed,
 * so a step allocates nothing.
 *
 * Tensor parallelism (cfg->tp_size > 1): a rank per GPU, each with its
 * shard of the weights (model/model_shard.h: heads, feed-forward rows and
 * vocab rows), its KV heads, its activations, stream and graphs, driven
 * by one host thread (backend_tp.h; rank 0 on the caller's thread).  The
 * host builds a step's indices once; every rank copies them to its device
 * and enqueues the same forward.  The o and down GEMMs of rank 0
 * accumulate into x (beta 1), those of the other ranks write their
 * partial into x (beta 0); an in-place all-reduce of x (f32, nt * dim)
 * then leaves x + the sum of the partials on every rank: two per layer.
 * Small all-reduces (decode) take the one-shot peer-memory kernel
 * (kernels/allreduce.cu), large ones NCCL (nccl_dl.h, loaded at run
 * time); BT_TP_ALLREDUCE=auto|nccl|custom|none picks (none: no reduction,
 * wrong output, for timing the rest).  Each rank computes the logits of
 * its vocab slice and copies them straight into the host rows (2D
 * copies); rank 0 copies the hidden rows.
 */
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

/* One forward as the host planned it, shared by every rank: sizes and
 * where each index array lies in h_meta (ints). */
typedef struct {
    int nt;                 /* tokens computed (bucket when padded) */
    int n_rows;             /* logits rows computed */
    int n_gen;              /* tokens for the per-token attention kernel */
    int n_tiles;            /* prefill tiles */
    int n_splits;
    int split_len;
    bool want_hidden;
    bool single;            /* every token is one new, unmasked token of
                               its sequence: RoPE may be fused into the
                               decode attention */
    bool graph;             /* replay a decode graph */
    int n_pages;            /* kv8: pages the prefill widens (0: none) */
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
    int nt;                 /* tokens computed (bucket when padded) */
    int n_rows;             /* logits rows computed */
    int n_gen;              /* tokens for the per-token attention kernel */
    int n_tiles;            /* prefill tiles */
    int n_splits;
    int split_len;
    bool want_hidden;
    bool single;            /* cuda_step_t.single */
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
    int n_pages;            /* cuda_step_t.n_pages */
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

    /* host tier of the prefix cache (cuda_kv_host_copy; tp == 1, rank
     * 0's device), made at first use */
    cudaStream_t copy_stream; /* saves and loads, off the compute stream */
    cudaEvent_t ev_queued;    /* compute-stream work so far: a load waits */
    cudaEvent_t ev_copied;    /* the last copies: the compute stream waits */
};

// ---------------------------------------------------------------------
// Running work on every rank

/* Runs fn(b, r) on every rank: the caller's thread for one rank (the
 * single-GPU path: no threads, no device switch), the crew for several. */
static bt_status_t cuda_each_rank(cuda_backend_t *b, backend_tp_fn fn)
{
    if (b->tp == 1 || b->crew == NULL) {
        bt_status_t status = BT_OK;

        for (int r = 0; r < b->tp && status == BT_OK; r++)
            status = fn(b, r);
        return status;
    }
    return backend_tp_crew_run(b->crew, fn, b);
}

/* Makes the rank's device current on this thread (ranks > 0 run on their
 * own thread, rank 0 on the caller's, which may have switched). */
static bt_status_t cuda_rank_enter(cuda_rank_t *r)
{
    if (r->b->tp == 1)
        return BT_OK;
    return BT_CUDA_STATUS(cudaSetDevice(r->device));
}

// ---------------------------------------------------------------------
// Weight upload

static size_t cuda_slice_raw_bytes(const model_tensor_t *t,
                                   const model_slice_t *s)
{
    return (size_t)(s->rows * s->cols) * model_dtype_size(t->dtype);
}

/* True when a and b are the same weights (tied classifier). */
static bool cuda_same_tensor(const model_t *model, const model_tensor_t *a,
                             const model_tensor_t *b)
{
    model_synth_src_t sa, sb;

    if (a->data != NULL)
        return a->data == b->data && a->dtype == b->dtype;
    return model_synth_tensor(model, a, &sa) &&
           model_synth_tensor(model, b, &sb) && sa.id == sb.id;
}

/* Puts the rank's slice of `t` into d_dst in dtype dt: generated on the
 * device for synthesized models, else copied (through d_stage, 2D when
 * the slice is a column range) and converted. */
static bt_status_t cuda_put_tensor_as(cuda_rank_t *r, const model_t *model,
                                      const model_tensor_t *t,
                                      model_part_t part, void *d_stage,
                                      void *d_dst, cuda_dtype_t dt)
{
    cuda_backend_t *b = r->b;
    model_slice_t s = model_shard_slice(&r->sh, &b->mc, t, part);
    size_t es = model_dtype_size(t->dtype);
    model_synth_src_t src;
    bt_status_t status;

    if (model_synth_tensor(model, t, &src)) {
        cuda_synth_args_t a;

        a.seed = src.seed;
        a.id = src.id;
        a.ones = src.ones;
        a.dtype = (cuda_src_dtype_t)t->dtype;
        a.full_cols = t->cols;
        a.row0 = s.row0;
        a.col0 = s.col0;
        a.rows = s.rows;
        a.cols = s.cols;
        return cuda_synth_fill(&a, d_dst, dt, r->stream);
    }
    if (t->data == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "a weight tensor has no data");
    if (s.col0 == 0 && s.cols == t->cols) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d_stage, (const char *)t->data + (size_t)(s.row0 * t->cols) * es,
            cuda_slice_raw_bytes(t, &s), cudaMemcpyHostToDevice, r->stream));
    } else {
        status = BT_CUDA_STATUS(cudaMemcpy2DAsync(
            d_stage, (size_t)s.cols * es,
            (const char *)t->data + (size_t)(s.row0 * t->cols + s.col0) * es,
            (size_t)t->cols * es, (size_t)s.cols * es, (size_t)s.rows,
            cudaMemcpyHostToDevice, r->stream));
    }
    if (status != BT_OK)
        return status;
    return cuda_convert(d_stage, (cuda_src_dtype_t)t->dtype,
                        (size_t)(s.rows * s.cols), d_dst, dt, r->stream);
}

/* cuda_put_tensor_as in the backend's dtype. */
static bt_status_t cuda_put_tensor(cuda_rank_t *r, const model_t *model,
                                   const model_tensor_t *t, model_part_t part,
                                   void *d_stage, void *d_dst)
{
    return cuda_put_tensor_as(r, model, t, part, d_stage, d_dst, r->b->dt);
}

/* Precision fp8: rows [row0, row0 + rows of t) of the fused linear f
 * (rows of ld bytes): the checkpoint's E4M3 codes and scales when it has
 * them (a per-tensor scale broadcast to the rows), else t in f32 (through
 * d_f32) quantized on the device per row (absmax / 448) -- both exactly
 * what the cpu's precision fp8 holds (cpu_backend.c cpu_fp8_row). */
static bt_status_t cuda_put_fp8(cuda_rank_t *r, const model_t *model,
                                const model_tensor_t *t,
                                const model_fp8_t *f8, model_part_t part,
                                void *d_stage, float *d_f32,
                                const cuda_fp8_lin_t *f, int row0, int ld)
{
    const int rows = (int)t->rows, cols = (int)t->cols;
    uint8_t *d_w = f->d_w + (size_t)row0 * ld;
    float *h_ws;
    bt_status_t status;

    if (f8->codes == NULL) {
        status = cuda_put_tensor_as(r, model, t, part, d_stage, d_f32,
                                    CUDA_DT_F32);
        if (status != BT_OK)
            return status;
        return cuda_fp8_quant_weight(d_f32, rows, cols, ld, d_w,
                                     f->d_ws + row0, r->stream);
    }
    if (f8->n_w_scale != 1 && f8->n_w_scale != rows)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "an FP8 weight of %d rows has %lld scales", rows,
                        (long long)f8->n_w_scale);
    h_ws = bt_malloc(sizeof(float) * (size_t)rows, "fp8_scales");
    if (h_ws == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < rows; i++)
        h_ws[i] = f8->w_scale[f8->n_w_scale == 1 ? 0 : i];
    status = BT_CUDA_STATUS(cudaMemcpy2DAsync(
        d_w, (size_t)ld, f8->codes, (size_t)cols, (size_t)cols,
        (size_t)rows, cudaMemcpyHostToDevice, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            f->d_ws + row0, h_ws, sizeof(float) * (size_t)rows,
            cudaMemcpyHostToDevice, r->stream));
    /* h_ws is pageable and freed now: the copies must be done */
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    bt_free(h_ws);
    return status;
}

/* fp8: one fused linear of n_out rows and n_in columns from its parts
 * (linears [first, first + n_parts) of the layer, stacked in order). */
static bt_status_t cuda_layer_load_fp8(cuda_rank_t *r, const model_t *model,
                                       const model_layer_t *ml, int first,
                                       int n_parts, const model_part_t *parts,
                                       int n_in, void *d_stage, float *d_f32,
                                       cuda_fp8_lin_t *f)
{
    const int ld = cuda_fp8_ld(n_in);
    int n_out = 0, row = 0;
    bt_status_t status;

    for (int p = 0; p < n_parts; p++)
        n_out += (int)model_layer_linear(ml, (model_linear_t)(first + p))
                     ->rows;
    status = cuda__dev_malloc((void **)&f->d_w, (size_t)n_out * ld,
                              "w_fp8");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&f->d_ws,
                                  sizeof(float) * (size_t)n_out, "w_fp8_scale");
    if (status == BT_OK) /* the padding columns stay zero */
        status = BT_CUDA_STATUS(cudaMemsetAsync(f->d_w, 0,
                                                (size_t)n_out * ld,
                                                r->stream));
    for (int p = 0; p < n_parts && status == BT_OK; p++) {
        const model_linear_t which = (model_linear_t)(first + p);
        const model_tensor_t *t = model_layer_linear(ml, which);

        if ((int)t->cols != n_in)
            return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                            "linear %d has %lld columns, not %d", (int)which,
                            (long long)t->cols, n_in);
        status = cuda_put_fp8(r, model, t, &ml->fp8[which], parts[p],
                              d_stage, d_f32, f, row, ld);
        row += (int)t->rows;
    }
    f->in_scale = model_fp8_in_scale(ml, first, n_parts);
    return status;
}

/* Allocates and fills one layer's fused weights (the rank's shard);
 * d_f32: fp8's f32 staging of one linear (NULL otherwise). */
static bt_status_t cuda_layer_load(cuda_rank_t *r, const model_t *model,
                                   const model_layer_t *ml, void *d_stage,
                                   float *d_f32, cuda_layer_t *cl)
{
    cuda_backend_t *b = r->b;
    size_t es = cuda_dtype_size(b->dt);
    size_t dim = b->mc.dim, hid = b->hid;
    bt_status_t status;

#define CUDA_ALLOC(_p, _n, _name)                                          \
    do {                                                                    \
        status = cuda__dev_malloc(&(_p), (size_t)(_n) * es, _name);         \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)
#define CUDA_UP(_t, _part, _dst)                                            \
    do {                                                                    \
        status = cuda_put_tensor(r, model, (_t), (_part), d_stage, (_dst)); \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)

    if (b->fp8) {
        static const model_part_t qkv[] = {MODEL_PART_WQ, MODEL_PART_WK,
                                           MODEL_PART_WV};
        static const model_part_t gu[] = {MODEL_PART_GATE, MODEL_PART_UP};
        static const model_part_t o[] = {MODEL_PART_WO};
        static const model_part_t down[] = {MODEL_PART_DOWN};

        if ((status = cuda_layer_load_fp8(r, model, ml, MODEL_LIN_Q, 3, qkv,
                                          (int)dim, d_stage, d_f32,
                                          &cl->f8[CUDA_F8_QKV])) ||
            (status = cuda_layer_load_fp8(r, model, ml, MODEL_LIN_O, 1, o,
                                          b->q_dim, d_stage, d_f32,
                                          &cl->f8[CUDA_F8_O])) ||
            (status = cuda_layer_load_fp8(r, model, ml, MODEL_LIN_GATE, 2,
                                          gu, (int)dim, d_stage, d_f32,
                                          &cl->f8[CUDA_F8_GU])) ||
            (status = cuda_layer_load_fp8(r, model, ml, MODEL_LIN_DOWN, 1,
                                          down, (int)hid, d_stage, d_f32,
                                          &cl->f8[CUDA_F8_DOWN])))
            return status;
    } else {
        CUDA_ALLOC(cl->d_wqkv, (size_t)b->qkv_dim * dim, "w_qkv");
        CUDA_UP(&ml->wq, MODEL_PART_WQ, cl->d_wqkv);
        CUDA_UP(&ml->wk, MODEL_PART_WK,
                (char *)cl->d_wqkv + (size_t)b->q_dim * dim * es);
        CUDA_UP(&ml->wv, MODEL_PART_WV,
                (char *)cl->d_wqkv +
                    (size_t)(b->q_dim + b->kv_dim) * dim * es);
        CUDA_ALLOC(cl->d_wo, dim * b->q_dim, "w_o");
        CUDA_UP(&ml->wo, MODEL_PART_WO, cl->d_wo);
        CUDA_ALLOC(cl->d_wgu, 2 * hid * dim, "w_gate_up");
        CUDA_UP(&ml->w_gate, MODEL_PART_GATE, cl->d_wgu);
        CUDA_UP(&ml->w_up, MODEL_PART_UP,
                (char *)cl->d_wgu + hid * dim * es);
        CUDA_ALLOC(cl->d_wdown, dim * hid, "w_down");
        CUDA_UP(&ml->w_down, MODEL_PART_DOWN, cl->d_wdown);
    }
    if (b->mc.qkv_bias && (ml->bq.data != NULL || model_is_lazy(model))) {
        CUDA_ALLOC(cl->d_bqkv, b->qkv_dim, "b_qkv");
        CUDA_UP(&ml->bq, MODEL_PART_BQ, cl->d_bqkv);
        CUDA_UP(&ml->bk, MODEL_PART_BK,
                (char *)cl->d_bqkv + (size_t)b->q_dim * es);
        CUDA_UP(&ml->bv, MODEL_PART_BV,
                (char *)cl->d_bqkv + (size_t)(b->q_dim + b->kv_dim) * es);
    }
    CUDA_ALLOC(cl->d_attn_norm, dim, "attn_norm");
    CUDA_UP(&ml->attn_norm, MODEL_PART_WHOLE, cl->d_attn_norm);
    CUDA_ALLOC(cl->d_ffn_norm, dim, "ffn_norm");
    CUDA_UP(&ml->ffn_norm, MODEL_PART_WHOLE, cl->d_ffn_norm);
#undef CUDA_ALLOC
#undef CUDA_UP
    return BT_OK;
}

static void cuda_layer_free(cuda_layer_t *cl)
{
    for (int i = 0; i < CUDA_F8_N; i++) {
        cuda__dev_free((void **)&cl->f8[i].d_w);
        cuda__dev_free((void **)&cl->f8[i].d_ws);
    }
    cuda__dev_free(&cl->d_wqkv);
    cuda__dev_free(&cl->d_bqkv);
    cuda__dev_free(&cl->d_wo);
    cuda__dev_free(&cl->d_wgu);
    cuda__dev_free(&cl->d_wdown);
    cuda__dev_free(&cl->d_attn_norm);
    cuda__dev_free(&cl->d_ffn_norm);
}

static bt_status_t cuda_weights_load(cuda_rank_t *r, const model_t *model)
{
    cuda_backend_t *b = r->b;
    const model_tensor_t *emb = model_tok_embedding(model);
    const model_tensor_t *cls = model_classifier(model);
    const model_tensor_t *fin = model_final_norm(model);
    size_t es = cuda_dtype_size(b->dt);
    size_t stage_bytes = 0;
    void *d_stage = NULL;
    float *d_f32 = NULL;
    model_slice_t s;
    bt_status_t status;

    /* The staging buffer holds the largest slice as stored (nothing for
     * synthesized weights: they are generated in place). */
    if (model_format(model) != MODEL_FORMAT_SYNTH) {
        s = model_shard_slice(&r->sh, &b->mc, emb, MODEL_PART_WHOLE);
        stage_bytes = cuda_slice_raw_bytes(emb, &s);
        s = model_shard_slice(&r->sh, &b->mc, cls, MODEL_PART_CLS);
        stage_bytes = BT_MAX(stage_bytes, cuda_slice_raw_bytes(cls, &s));
        for (int l = 0; l < b->mc.n_layers; l++) {
            const model_layer_t *ml = model_layer(model, l);
            const model_tensor_t *ts[] = {&ml->wq, &ml->wk, &ml->wv,
                                          &ml->wo, &ml->w_gate, &ml->w_up,
                                          &ml->w_down};
            const model_part_t ps[] = {MODEL_PART_WQ, MODEL_PART_WK,
                                       MODEL_PART_WV, MODEL_PART_WO,
                                       MODEL_PART_GATE, MODEL_PART_UP,
                                       MODEL_PART_DOWN};
            for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
                if (ts[i]->data == NULL)
                    continue;
                s = model_shard_slice(&r->sh, &b->mc, ts[i], ps[i]);
                stage_bytes = BT_MAX(stage_bytes,
                                     cuda_slice_raw_bytes(ts[i], &s));
            }
        }
    }
    status = cuda__dev_malloc(&d_stage, stage_bytes, "weight_stage");
    if (status != BT_OK)
        return status;
    /* fp8: the largest linear in f32, quantized from there (tp 1: whole
     * tensors) */
    if (b->fp8) {
        status = cuda__dev_malloc(
            (void **)&d_f32,
            sizeof(float) * (size_t)BT_MAX(BT_MAX(b->q_dim, b->kv_dim),
                                           b->hid) * b->mc.dim,
            "weight_stage_f32");
        if (status != BT_OK)
            goto out;
    }

    r->layers = bt_calloc(b->mc.n_layers, sizeof(*r->layers), "cuda_layers");
    if (r->layers == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    status = cuda__dev_malloc(&r->d_emb,
                              (size_t)b->mc.vocab_size * b->mc.dim * es,
                              "tok_embedding");
    if (status != BT_OK)
        goto out;
    status = cuda_put_tensor(r, model, emb, MODEL_PART_WHOLE, d_stage,
                             r->d_emb);
    if (status != BT_OK)
        goto out;
    if (cuda_same_tensor(model, cls, emb)) {
        /* tied: the rank's vocab rows of the (replicated) embedding */
        r->d_cls = (char *)r->d_emb + (size_t)r->sh.vocab0 * b->mc.dim * es;
        r->cls_alias = true;
    } else {
        status = cuda__dev_malloc(&r->d_cls,
                                  (size_t)r->sh.n_vocab * b->mc.dim * es,
                                  "classifier");
        if (status != BT_OK)
            goto out;
        status = cuda_put_tensor(r, model, cls, MODEL_PART_CLS, d_stage,
                                 r->d_cls);
        if (status != BT_OK)
            goto out;
    }
    status = cuda__dev_malloc(&r->d_final_norm, (size_t)b->mc.dim * es,
                              "final_norm");
    if (status != BT_OK)
        goto out;
    status = cuda_put_tensor(r, model, fin, MODEL_PART_WHOLE, d_stage,
                             r->d_final_norm);
    if (status != BT_OK)
        goto out;
    for (int l = 0; l < b->mc.n_layers; l++) {
        status = cuda_layer_load(r, model, model_layer(model, l), d_stage,
                                 d_f32, &r->layers[l]);
        if (status != BT_OK)
            goto out;
    }
    status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
out:
    if (status != BT_OK) /* in-flight conversions still read the stages */
        (void)cudaStreamSynchronize(r->stream);
    cuda__dev_free((void **)&d_f32);
    cuda__dev_free(&d_stage);
    return status;
}

// ---------------------------------------------------------------------
// Create / destroy

static bool cuda_is_available(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

static int cuda_pow2_ceil(int x)
{
    int p = 1;

    while (p < x)
        p <<= 1;
    return p;
}

static void cuda_destroy(void *impl);
static void cuda_host_tier_free(cuda_backend_t *b);

/* Drops every captured graph of the rank (they hold pointers to buffers
 * that are about to move). */
static void cuda_graphs_drop(cuda_rank_t *r)
{
    for (int i = 0; i < r->n_graphs; i++)
        cudaGraphExecDestroy(r->graphs[i].exec);
    r->n_graphs = 0;
}

/* Rank op: (re)allocates the device metadata buffers to the backend's
 * current capacities (after cuda_meta_reserve grew them). */
static bt_status_t cuda_rank_meta_alloc(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    cuda_graphs_drop(r);
    cuda__dev_free((void **)&r->d_meta);
    cuda__dev_free((void **)&r->d_mask);
    if (b->meta_cap) {
        status = cuda__dev_malloc((void **)&r->d_meta,
                                  b->meta_cap * sizeof(int), "batch_meta");
        if (status != BT_OK)
            return status;
    }
    if (b->mask_cap)
        status = cuda__dev_malloc((void **)&r->d_mask, b->mask_cap,
                                  "batch_masks");
    return status;
}

/* Grows the pinned + device metadata buffers to hold `ints` ints and
 * `mask_bytes` mask bytes (only ever grows; a steady state allocates
 * nothing).  Pinned memory is portable: every rank copies from it. */
static bt_status_t cuda_meta_reserve(cuda_backend_t *b, size_t ints,
                                     size_t mask_bytes)
{
    bt_status_t status;

    if (ints <= b->meta_cap && mask_bytes <= b->mask_cap)
        return BT_OK;
    if (ints > b->meta_cap) {
        size_t cap = BT_MAX(ints, 2 * b->meta_cap);

        if (b->h_meta)
            cudaFreeHost(b->h_meta);
        b->h_meta = NULL;
        b->meta_cap = 0;
        status = BT_CUDA_STATUS(cudaHostAlloc((void **)&b->h_meta,
                                              cap * sizeof(int),
                                              cudaHostAllocPortable));
        if (status == BT_OK)
            b->meta_cap = cap;
    }
    if (mask_bytes > b->mask_cap) {
        size_t cap = BT_MAX(mask_bytes, 2 * b->mask_cap);

        if (b->h_mask)
            cudaFreeHost(b->h_mask);
        b->h_mask = NULL;
        b->mask_cap = 0;
        status = BT_CUDA_STATUS(cudaHostAlloc((void **)&b->h_mask, cap,
                                              cudaHostAllocPortable));
        if (status == BT_OK)
            b->mask_cap = cap;
    }
    /* device buffers follow the host capacities (freed when a host
     * allocation failed, so nothing runs on a short buffer) */
    status = cuda_each_rank(b, cuda_rank_meta_alloc);
    if (status == BT_OK && (b->meta_cap < ints || b->mask_cap < mask_bytes))
        status = BT_ERROR(BT_ERR_NO_MEMORY, "CUDA",
                          "cannot allocate %zu bytes of batch metadata",
                          ints * sizeof(int) + mask_bytes);
    return status;
}

/* Rank op: device, stream, cuBLASLt, the weight shard, RoPE table, KV
 * heads, activations and events. */
/* kv8: every layer's K and V scales (backend_kv8_scales, as the cpu
 * backend takes them) to r->d_kv_scale.  tp == 1: the rank holds every
 * KV head. */
static bt_status_t cuda_kv_scales_load(cuda_rank_t *r, const model_t *model)
{
    cuda_backend_t *b = r->b;
    size_t n = (size_t)b->mc.n_layers * 2 * b->nkv;
    float *h = bt_malloc(sizeof(float) * n, "kv_scale");
    bool any = false;
    bt_status_t status;

    if (h == NULL)
        return BT_ERR_NO_MEMORY;
    for (int l = 0; l < b->mc.n_layers; l++) {
        backend_kv8_scales(model_layer(model, l), b->nkv,
                           h + (size_t)l * 2 * b->nkv);
        any |= model_layer(model, l)->k_scale != NULL;
    }
    if (!any && r->rank == 0)
        BT_LOG_WARN("CUDA", "--kv-dtype fp8: the model has no k_scale / "
                    "v_scale; using 1.0 (calibrate with baton model "
                    "quantize --fp8 --kv-scales)");
    status = cuda__dev_malloc((void **)&r->d_kv_scale, sizeof(float) * n,
                              "kv_scale");
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpy(r->d_kv_scale, h,
                                           sizeof(float) * n,
                                           cudaMemcpyHostToDevice));
    bt_free(h);
    return status;
}

static bt_status_t cuda_rank_init(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    size_t es = cuda_dtype_size(b->dt);
    int hd = b->mc.head_dim;
    bt_status_t status;

    status = BT_CUDA_STATUS(cudaSetDevice(r->device));
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaDeviceGetAttribute(
        &r->n_sm, cudaDevAttrMultiProcessorCount, r->device));
    if (status != BT_OK)
        return status;
    r->attn_bps = cuda_attn_decode_blocks_per_sm(hd, b->kv8);
    status = BT_CUDA_STATUS(cudaStreamCreateWithFlags(&r->stream,
                                                      cudaStreamNonBlocking));
    if (status != BT_OK)
        return status;
    status = worker_gemm_ctx_create(CUDA_GEMM_WS, &r->gemm);
    if (status == BT_OK && b->fp8) /* before any graph capture */
        status = cuda_gemv_fp8_fused_prepare();
    if (status != BT_OK)
        return status;

    status = cuda_weights_load(r, b->op_model);
    if (status != BT_OK)
        return status;
    if (b->tp == 1)
        BT_LOG_INFO("CUDA", "weights: %zu MiB on device (%s)",
                    cuda__dev_live_bytes() >> 20,
                    b->dt == CUDA_DT_F32 ? "f32"
                    : b->fp8             ? "fp8 e4m3 linears, bf16 rest"
                                         : "bf16");

    {
        float *inv = bt_malloc(sizeof(float) * (hd / 2), "inv_freq");
        if (inv == NULL)
            return BT_ERR_NO_MEMORY;
        cuda__rope_inv_freq(&b->mc, inv);
        status = cuda__dev_malloc((void **)&r->d_inv_freq,
                                  sizeof(float) * (hd / 2), "inv_freq");
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpy(r->d_inv_freq, inv,
                                               sizeof(float) * (hd / 2),
                                               cudaMemcpyHostToDevice));
        bt_free(inv);
        if (status != BT_OK)
            return status;
    }
    if (b->kv8) {
        status = cuda_kv_scales_load(r, b->op_model);
        if (status != BT_OK)
            return status;
    }

    /* Activations for the largest forward (the KV pool comes last,
     * cuda_rank_kv_alloc, so that it can be sized from what is left). */
#define CUDA_ACT(_p, _bytes, _name)                                         \
    do {                                                                    \
        status = cuda__dev_malloc((void **)&(_p), (_bytes), _name);         \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)
    CUDA_ACT(r->d_x, (size_t)b->max_tok * b->mc.dim * 4, "act_x");
    /* (fp8 makes the normed and SwiGLU rows inside its input
     * quantization: no d_xn, no d_h) */
    if (!b->fp8)
        CUDA_ACT(r->d_xn, (size_t)b->max_tok * b->mc.dim * es, "act_xn");
    CUDA_ACT(r->d_qkv, (size_t)b->max_tok * b->qkv_dim * es, "act_qkv");
    CUDA_ACT(r->d_q, (size_t)b->max_tok * b->q_dim * es, "act_q");
    CUDA_ACT(r->d_att, (size_t)b->max_tok * b->q_dim * es, "act_att");
    CUDA_ACT(r->d_gu, (size_t)b->max_tok * 2 * b->hid * es, "act_gate_up");
    if (!b->fp8)
        CUDA_ACT(r->d_h, (size_t)b->max_tok * b->hid * es, "act_h");
    CUDA_ACT(r->d_xr, (size_t)b->row_cap * b->mc.dim * es, "act_rows");
    CUDA_ACT(r->d_logits, (size_t)b->row_cap * r->sh.n_vocab * 4, "logits");
    if (rank == 0)
        CUDA_ACT(r->d_hidden, (size_t)b->hid_cap * b->mc.dim * 4, "hidden");
    CUDA_ACT(r->d_ws, b->ws_floats * 4, "attn_splits");
    /* kv8 (one rank): the prefill attention's widened pages, room for
     * CUDA_WIDE_TOKENS x max_tok tokens of context (a step that reads
     * more reads the codes) */
    if (b->kv8 && b->tp == 1 &&
        cuda_attn_prefill_widen_ok(b->mc.head_dim, b->nh, b->nkv,
                                   b->kv.block_size))
        b->wide_pages = (int)BT_DIV_UP((size_t)CUDA_WIDE_TOKENS * b->max_tok,
                                       b->kv.block_size);
    if (b->wide_pages > 0)
        CUDA_ACT(r->d_wide,
                 (size_t)b->wide_pages * b->kv.block_size * b->kv_dim * 2 *
                     2,
                 "kv8_widened");
    if (b->fp8) {
        /* a GEMM input of up to max_tok rows of the widest K, and f32
         * sums of up to CUDA_FP8_ACC_TOK rows of the widest product (a
         * longer chunk is done in pieces: worker_gemm_fp8) */
        size_t ld = (size_t)cuda_fp8_ld(BT_MAX(BT_MAX(b->mc.dim, b->q_dim),
                                               b->hid));
        size_t ldd = (size_t)cuda_fp8_ld(BT_MAX(BT_MAX(b->qkv_dim,
                                                       2 * b->hid),
                                                b->mc.dim));

        /* (cuBLASLt's FP8 calls read token counts rounded up to 16) */
        size_t tok16 = (size_t)BT_DIV_UP(b->max_tok, 16) * 16;

        r->acc_floats = BT_MIN(tok16, (size_t)CUDA_FP8_ACC_TOK) * ldd;
        CUDA_ACT(r->d_xq, tok16 * ld, "act_fp8_codes");
        status = BT_CUDA_STATUS(cudaMemset(r->d_xq, 0, tok16 * ld));
        if (status != BT_OK)
            return status;
        CUDA_ACT(r->d_xv, ld * 2, "act_fp8_values");
        CUDA_ACT(r->d_xs, (size_t)b->max_tok * 4, "act_fp8_scales");
        CUDA_ACT(r->d_acc, r->acc_floats * 4, "act_fp8_sums");
    }
#undef CUDA_ACT

    for (int i = 0; i < 2; i++) {
        status = BT_CUDA_STATUS(cudaEventCreate(&r->ev_fwd[i]));
        if (status != BT_OK)
            return status;
    }
    r->layer_ev = bt_calloc(b->mc.n_layers, sizeof(*r->layer_ev),
                            "layer_events");
    if (r->layer_ev == NULL)
        return BT_ERR_NO_MEMORY;
    for (int l = 0; l < b->mc.n_layers; l++) {
        status = BT_CUDA_STATUS(cudaEventCreateWithFlags(
            &r->layer_ev[l], cudaEventDisableTiming));
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

/* Rank op: the device memory free now (cudaMemGetInfo), into
 * r->mem_free. */
static bt_status_t cuda_rank_mem_probe(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    size_t free_b = 0, total_b = 0;
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaMemGetInfo(&free_b, &total_b));
    r->mem_free = free_b;
    r->mem_total = total_b;
    return status;
}

/* Rank op: the KV pool, this rank's KV heads (b->cfg.n_kv_blocks). */
static bt_status_t cuda_rank_kv_alloc(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    size_t bytes = (size_t)b->mc.n_layers * b->cfg.n_kv_blocks *
                   b->cfg.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    status = cuda__dev_malloc(&r->d_k, bytes, "kv_cache_k");
    if (status != BT_OK)
        return status;
    status = cuda__dev_malloc(&r->d_v, bytes, "kv_cache_v");
    if (status != BT_OK)
        return status;
    /* Zeros, so every slot holds finite values: kernels that load
     * whole pages (the TMA prefill attention) read slots past a
     * sequence's end, where P = 0 must not meet a NaN in V. */
    status = BT_CUDA_STATUS(cudaMemset(r->d_k, 0, bytes));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemset(r->d_v, 0, bytes));
    if (status != BT_OK)
        return status;
    if (rank == 0)
        BT_LOG_INFO("CUDA", "KV pool: %d blocks of %d tokens = %lld "
                    "tokens, %zu MiB%s%s", b->cfg.n_kv_blocks,
                    b->cfg.block_size,
                    (long long)b->cfg.n_kv_blocks * b->cfg.block_size,
                    (2 * bytes) >> 20, b->tp > 1 ? " per rank" : "",
                    b->kv8 ? " (fp8 e4m3)" : "");
    return BT_OK;
}

/* Sizes the KV pool when cfg->n_kv_blocks is 0: kv_memory_bytes, or
 * kv_memory_fraction of the device memory free now (after weights,
 * activations and batch metadata; the least over the ranks, since every
 * rank holds the same blocks).  The (1 - fraction) left over is for the
 * CUDA graphs, cuBLASLt's tuning, device sampling and any other process
 * on the GPU; the warm-up logs what is still free after it. */
static bt_status_t cuda_size_kv(cuda_backend_t *b)
{
    size_t token_bytes = 2 * (size_t)b->mc.n_layers * b->kv_dim *
                         b->kv.elem_size;
    size_t free_min = SIZE_MAX, total = 0, budget;
    char what[160];
    bt_status_t status;

    if (b->cfg.n_kv_blocks > 0)
        return BT_OK;
    status = cuda_each_rank(b, cuda_rank_mem_probe);
    if (status != BT_OK)
        return status;
    for (int r = 0; r < b->tp; r++) {
        free_min = BT_MIN(free_min, b->ranks[r].mem_free);
        total = b->ranks[r].mem_total;
    }
    if (b->cfg.kv_memory_bytes > 0) {
        budget = b->cfg.kv_memory_bytes;
        snprintf(what, sizeof(what), "the --kv-memory-gb budget (%zu MiB "
                 "free on the GPU)", free_min >> 20);
    } else {
        budget = (size_t)((double)free_min * b->cfg.kv_memory_fraction);
        snprintf(what, sizeof(what), "%.2f of the %zu MiB free on the GPU "
                 "after weights and activations (of %zu MiB)",
                 b->cfg.kv_memory_fraction, free_min >> 20, total >> 20);
    }
    status = backend__kv_blocks_auto(&b->cfg, &b->mc, token_bytes, budget,
                                     0, what, &b->cfg.n_kv_blocks);
    if (status != BT_OK)
        return status;
    b->kv.n_blocks = b->cfg.n_kv_blocks;
    BT_LOG_INFO("CUDA", "KV pool sized from %s: %d blocks of %d tokens = "
                "%lld tokens (%zu bytes a token%s)", what,
                b->cfg.n_kv_blocks, b->cfg.block_size,
                (long long)b->cfg.n_kv_blocks * b->cfg.block_size,
                token_bytes, b->tp > 1 ? " per rank" : "");
    return BT_OK;
}

/* In-process exchange of the NCCL unique id: rank 0 makes it and every
 * rank reads it from the backend.  A multi-process TP (one process per
 * GPU) would replace only this: rank 0 sends the 128 bytes to the others
 * in a control message (ZeroMQ) before they join. */
static bt_status_t cuda_tp_share_nccl_id(cuda_backend_t *b)
{
    return cuda_nccl_unique_id(b->nccl, &b->nccl_id);
}

/* Rank op: peer access to every other rank's GPU, the custom all-reduce
 * flags, and the NCCL communicator. */
static bt_status_t cuda_rank_comm_init(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    for (int p = 0; p < b->tp && b->ar_custom_ok; p++) {
        cudaError_t err;

        if (p == rank)
            continue;
        err = cudaDeviceEnablePeerAccess(b->ranks[p].device, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else if (err != cudaSuccess)
            return BT_CUDA_STATUS(err);
    }
    status = cuda__dev_malloc((void **)&r->d_ar_flags,
                              CUDA_AR_FLAG_WORDS * sizeof(uint32_t),
                              "ar_flags");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&r->d_ar_epoch,
                                  CUDA_AR_MAX_BLOCKS * sizeof(uint32_t),
                                  "ar_epoch");
    if (status == BT_OK) /* the grid is at most this rank's SMs */
        status = cuda__dev_malloc(
            (void **)&r->d_ar_stage,
            CUDA_AR_STAGE_FLOATS(BT_MIN(r->n_sm, CUDA_AR_MAX_BLOCKS)) *
                sizeof(float),
            "ar_stage");
    /* zeroed before this op returns: no rank writes a peer's flags
     * before every rank is past this point */
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemsetAsync(
            r->d_ar_flags, 0, CUDA_AR_FLAG_WORDS * sizeof(uint32_t),
            r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemsetAsync(
            r->d_ar_epoch, 0, CUDA_AR_MAX_BLOCKS * sizeof(uint32_t),
            r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    if (status != BT_OK)
        return status;
    if (b->nccl != NULL)
        status = cuda_nccl_comm_init(b->nccl, &r->comm, b->tp, &b->nccl_id,
                                     rank);
    return status;
}

/* Rank op: one all-reduce of `dim` floats through each enabled path on
 * every rank (x = rank + 1, so the sum is tp (tp + 1) / 2), checking both
 * paths end to end; then NCCL all-reduces of the decode and prefill sizes
 * so that its connections exist before any graph capture. */
static bt_status_t cuda_rank_comm_check(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    const int n = b->mc.dim;
    const float want = (float)(b->tp * (b->tp + 1) / 2);
    float *h = NULL;
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    h = bt_malloc((size_t)n * sizeof(float), "ar_check");
    if (h == NULL)
        return BT_ERR_NO_MEMORY;
    for (int path = 0; path < 2 && status == BT_OK; path++) {
        if ((path == 0 && b->nccl == NULL) ||
            (path == 1 && (!b->ar_custom_ok || n % 4 != 0)))
            continue;
        for (int i = 0; i < n; i++)
            h[i] = (float)(rank + 1);
        status = BT_CUDA_STATUS(cudaMemcpyAsync(r->d_x, h, n * sizeof(float),
                                                cudaMemcpyHostToDevice,
                                                r->stream));
        if (status != BT_OK)
            break;
        status = path == 0 ? cuda_nccl_allreduce_f32(b->nccl, r->comm,
                                                     r->d_x, (size_t)n,
                                                     r->stream)
                           : cuda_allreduce_custom(&r->ar, (size_t)n,
                                                   r->stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                h, r->d_x, n * sizeof(float), cudaMemcpyDeviceToHost,
                r->stream));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
        for (int i = 0; i < n && status == BT_OK; i++) {
            if (h[i] != want)
                status = BT_ERROR(BT_ERR_CUDA, "CUDA",
                                  "%s all-reduce self-check on GPU %d: "
                                  "element %d is %g, want %g",
                                  path == 0 ? "NCCL" : "peer-memory",
                                  r->device, i, h[i], want);
        }
    }
    bt_free(h);
    if (status == BT_OK && b->nccl != NULL) {
        const size_t sizes[] = { (size_t)8 * n, (size_t)b->bucket_max * n,
                                 (size_t)b->max_tok * n };

        status = BT_CUDA_STATUS(cudaMemsetAsync(
            r->d_x, 0, (size_t)b->max_tok * n * sizeof(float), r->stream));
        for (size_t i = 0; i < BT_ARRAY_SIZE(sizes) && status == BT_OK; i++)
            status = cuda_nccl_allreduce_f32(b->nccl, r->comm, r->d_x,
                                             sizes[i], r->stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    }
    return status;
}

/* Tensor parallelism: NCCL, communicators, peer tables, self-check. */
static bt_status_t cuda_tp_setup(cuda_backend_t *b)
{
    const char *env = cuda_switches()->tp_allreduce;
    bt_status_t status;

    b->ar_mode = CUDA_AR_AUTO;
    if (env != NULL && env[0] != '\0') {
        if (strcmp(env, "nccl") == 0)
            b->ar_mode = CUDA_AR_NCCL;
        else if (strcmp(env, "custom") == 0)
            b->ar_mode = CUDA_AR_CUSTOM;
        else if (strcmp(env, "none") == 0)
            b->ar_mode = CUDA_AR_NONE;
        else if (strcmp(env, "auto") != 0)
            return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                            "BT_TP_ALLREDUCE=%s: use auto, nccl, custom "
                            "or none", env);
    }
    b->ar_custom_max = b->tp == 2 ? (4u << 20) : (1u << 20);
    env = cuda_switches()->tp_ar_custom_max;
    if (env != NULL && env[0] != '\0') {
        uint64_t v;

        if (bt_parse_u64(env, &v) != BT_OK)
            return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                            "BT_TP_AR_CUSTOM_MAX=%s is not a byte count",
                            env);
        b->ar_custom_max = (size_t)v;
    }
    b->ar_custom_ok = true;
    for (int i = 0; i < b->tp; i++) {
        for (int j = 0; j < b->tp; j++) {
            int can = 0;

            if (i == j)
                continue;
            status = BT_CUDA_STATUS(cudaDeviceCanAccessPeer(
                &can, b->ranks[i].device, b->ranks[j].device));
            if (status != BT_OK)
                return status;
            if (!can)
                b->ar_custom_ok = false;
        }
    }
    if (b->ar_mode == CUDA_AR_CUSTOM && !b->ar_custom_ok)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "BT_TP_ALLREDUCE=custom needs peer access between "
                        "every pair of GPUs %d..%d",
                        b->cfg.device_index, b->cfg.device_index + b->tp - 1);
    if (b->ar_mode != CUDA_AR_CUSTOM && b->ar_mode != CUDA_AR_NONE) {
        status = cuda_nccl_open(&b->nccl);
        if (status != BT_OK)
            return status;
        status = cuda_tp_share_nccl_id(b);
        if (status != BT_OK)
            return status;
    }
    status = backend_tp_crew_run(b->crew, cuda_rank_comm_init, b);
    if (status != BT_OK)
        return status;
    for (int r = 0; r < b->tp; r++) {
        cuda_ar_t *ar = &b->ranks[r].ar;

        memset(ar, 0, sizeof(*ar));
        ar->n_ranks = b->tp;
        ar->rank = r;
        ar->n_blocks = BT_MIN(b->ranks[r].n_sm, CUDA_AR_MAX_BLOCKS);
        ar->d_epoch = b->ranks[r].d_ar_epoch;
        ar->d_buf = b->ranks[r].d_x;
        for (int p = 0; p < b->tp; p++) {
            ar->d_stage[p] = b->ranks[p].d_ar_stage;
            ar->d_flags[p] = b->ranks[p].d_ar_flags;
        }
    }
    /* every rank's grid must be the same: the smallest SM count */
    for (int r = 1; r < b->tp; r++)
        b->ranks[0].ar.n_blocks = BT_MIN(b->ranks[0].ar.n_blocks,
                                         b->ranks[r].ar.n_blocks);
    for (int r = 1; r < b->tp; r++)
        b->ranks[r].ar.n_blocks = b->ranks[0].ar.n_blocks;
    status = backend_tp_crew_run(b->crew, cuda_rank_comm_check, b);
    if (status != BT_OK)
        return status;
    BT_LOG_INFO("CUDA", "tensor parallelism %d on GPUs %d..%d: all-reduce "
                "%s (peer-memory kernel %s up to %zu KiB, NCCL %s)", b->tp,
                b->cfg.device_index, b->cfg.device_index + b->tp - 1,
                b->ar_mode == CUDA_AR_AUTO     ? "auto"
                : b->ar_mode == CUDA_AR_NCCL   ? "nccl"
                : b->ar_mode == CUDA_AR_CUSTOM ? "custom"
                                               : "NONE (wrong output)",
                b->ar_custom_ok ? "on" : "off", b->ar_custom_max >> 10,
                b->nccl ? "loaded" : "not loaded");
    return BT_OK;
}

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

static unsigned cuda_skip_parse(const char *env)
{
    const char *env0 = env;
    static const char *const names[] = {"norm", "qkv", "rope", "attn",
                                        "o", "gu", "swiglu", "down"};
    unsigned mask = 0;

    while (env != NULL && *env) {
        size_t n = strcspn(env, ",");
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (strlen(names[i]) == n && strncmp(env, names[i], n) == 0)
                mask |= 1u << i;
        env += n + (env[n] == ',');
    }
    if (mask != 0)
        BT_LOG_WARN("CUDA", "BT_PROFILE_SKIP=%s: forwards leave ops out "
                    "(timing only, outputs are meaningless)",
                    env0);
    return mask;
}


static bt_status_t cuda_create(const model_t *model, backend_config_t *cfg,
                               void **impl_p)
{
    /* every switch read here, once (cuda_switches.h) */
    const cuda_switches_t *sw = cuda_switches();
    cuda_backend_t *b;
    const char *env;
    model_shard_t sh0;
    int hd, n_dev = 0;
    bool auto_seqs;
    bt_status_t status;

    b = bt_calloc(1, sizeof(*b), "cuda_backend");
    if (b == NULL)
        return BT_ERR_NO_MEMORY;
    b->mc = *model_config(model);
    b->cfg = *cfg;
    b->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    b->dt = cfg->precision == BACKEND_PRECISION_F32 ? CUDA_DT_F32
                                                     : CUDA_DT_BF16;
    b->fp8 = cfg->precision == BACKEND_PRECISION_FP8;
    b->kv8 = cfg->kv_dtype == BACKEND_KV_DTYPE_FP8;
    hd = b->mc.head_dim;
    if (b->fp8 && b->tp > 1) {
        bt_free(b);
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "precision fp8 runs on one GPU for now (tensor "
                        "parallelism %d)", b->tp);
    }
    /* The FP8 cache holds E4M3 codes of bf16-precision K/V; an f32 model
     * asks for exactness, which the codes would throw away.  Per-rank
     * scales under TP are not wired yet. */
    if (b->kv8 && (b->dt == CUDA_DT_F32 || b->tp > 1)) {
        bt_free(b);
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "--kv-dtype fp8 needs precision bf16 or fp8 on one "
                        "GPU (precision %s, tensor parallelism %d)",
                        b->dt == CUDA_DT_F32 ? "f32" : "bf16/fp8",
                        b->tp > 1 ? b->tp : 1);
    }
    if (!cuda_attn_head_dim_ok(hd) ||
        b->mc.n_heads % b->mc.n_kv_heads != 0) {
        bt_free(b);
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "head_dim %d (heads %d, kv heads %d) is not "
                        "supported by the CUDA kernels (8..256, powers "
                        "of two)", hd, b->mc.n_heads, b->mc.n_kv_heads);
    }
    if (b->tp > CUDA_AR_MAX_RANKS) {
        bt_free(b);
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "tensor parallelism %d: the cuda backend runs at "
                        "most %d ranks", b->tp, CUDA_AR_MAX_RANKS);
    }
    status = model_shard_plan(&b->mc, b->tp, 0, &sh0);
    if (status != BT_OK) {
        bt_free(b);
        return status;
    }
    if (b->tp > 1) {
        status = BT_CUDA_STATUS(cudaGetDeviceCount(&n_dev));
        if (status == BT_OK && cfg->device_index + b->tp > n_dev)
            status = BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                              "tensor parallelism %d from GPU %d needs GPUs "
                              "%d..%d; this machine has %d", b->tp,
                              cfg->device_index, cfg->device_index,
                              cfg->device_index + b->tp - 1, n_dev);
        if (status != BT_OK) {
            bt_free(b);
            return status;
        }
    }
    b->nh = sh0.n_heads;
    b->nkv = sh0.n_kv_heads;
    b->hid = sh0.n_hidden;
    b->vocab_shard = sh0.vocab_shard;
    b->q_dim = b->nh * hd;
    b->kv_dim = b->nkv * hd;
    b->qkv_dim = b->q_dim + 2 * b->kv_dim;
    env = sw->cuda_graphs;
    b->use_graphs = env == NULL || strcmp(env, "0") != 0;
    env = sw->tree_graphs;
    b->tree_graphs = env == NULL || strcmp(env, "0") != 0;
    b->skip = cuda_skip_parse(sw->profile_skip);

    /* The KV pool layout: one rank's heads (n_blocks set again when the
     * pool is sized from memory). */
    b->kv.n_layers = b->mc.n_layers;
    b->kv.n_blocks = cfg->n_kv_blocks;
    b->kv.block_size = cfg->block_size;
    b->kv.n_kv_heads = b->nkv;
    b->kv.head_dim = hd;
    b->kv.elem_size = b->kv8 ? 1 : cuda_dtype_size(b->dt);

    /* Auto max_seqs: from the batch limits now (the activations are
     * sized for it), clamped to the KV blocks once the pool is sized. */
    auto_seqs = b->cfg.max_seqs == 0;
    if (auto_seqs)
        b->cfg.max_seqs = backend__max_seqs_auto(&b->cfg, b->cfg.n_kv_blocks,
                                                 BACKEND_MAX_SEQS_AUTO);
    /* Activation sizes for the largest forward. */
    b->bucket_max = cuda_pow2_ceil(b->cfg.max_seqs);
    b->max_tok = BT_MAX(cfg->max_batch_tokens, b->bucket_max);
    b->row_cap = BT_MAX(256, b->bucket_max);
    /* every row of a step stays on the device (a draft head reads them
     * there, cuda_backend_hidden), not only one classifier chunk's */
    b->hid_cap = BT_MAX(b->row_cap, b->max_tok);
    b->row_map = bt_malloc(sizeof(int) * (size_t)b->hid_cap, "row_map");
    if (b->row_map == NULL) {
        bt_free(b);
        return BT_ERR_NO_MEMORY;
    }
    b->ws_floats = cuda_attn_decode_ws_floats(b->bucket_max, b->nh, hd,
                                              CUDA_MAX_SPLITS);

    b->ranks = bt_calloc((size_t)b->tp, sizeof(*b->ranks), "cuda_ranks");
    if (b->ranks == NULL) {
        bt_free(b->row_map);
        bt_free(b);
        return BT_ERR_NO_MEMORY;
    }
    for (int r = 0; r < b->tp; r++) {
        b->ranks[r].b = b;
        b->ranks[r].rank = r;
        b->ranks[r].device = cfg->device_index + r;
        atomic_init(&b->ranks[r].ev_layer, -1);
        status = model_shard_plan(&b->mc, b->tp, r, &b->ranks[r].sh);
        if (status != BT_OK)
            goto err;
    }
    if (b->tp > 1) {
        status = backend_tp_crew_create(b->tp, &b->crew);
        if (status != BT_OK)
            goto err;
    }

    b->op_model = model;
    status = cuda_each_rank(b, cuda_rank_init);
    b->op_model = NULL;
    if (status != BT_OK)
        goto err;
    b->n_sm = b->ranks[0].n_sm;
    b->attn_bps = b->ranks[0].attn_bps;
    if (b->tp > 1) {
        BT_LOG_INFO("CUDA", "weights, KV and activations of %d ranks: %zu "
                    "MiB on %d GPUs (%s)", b->tp,
                    cuda__dev_live_bytes() >> 20, b->tp,
                    b->dt == CUDA_DT_F32 ? "f32" : "bf16");
        status = cuda_tp_setup(b);
        if (status != BT_OK)
            goto err;
    } else {
        BT_LOG_INFO("CUDA", "activations: %d batch tokens", b->max_tok);
    }
    status = cuda_meta_reserve(b, (size_t)16 * b->max_tok + 4096, 4096);
    if (status != BT_OK)
        goto err;
    status = cuda_size_kv(b);
    if (status != BT_OK)
        goto err;
    status = cuda_each_rank(b, cuda_rank_kv_alloc);
    if (status != BT_OK)
        goto err;
    if (auto_seqs)
        b->cfg.max_seqs = BT_MIN(b->cfg.max_seqs, b->cfg.n_kv_blocks);
    BT_LOG_INFO("CUDA", "device memory in use: %zu MiB; at most %d "
                "sequences a step", cuda__dev_live_bytes() >> 20,
                b->cfg.max_seqs);
    cfg->n_kv_blocks = b->cfg.n_kv_blocks;
    cfg->max_seqs = b->cfg.max_seqs;
    *impl_p = b;
    return BT_OK;

err:
    cuda_destroy(b);
    return status;
}

/* Rank op: frees everything of the rank (NULL-safe: also after a failed
 * init). */
static bt_status_t cuda_rank_free(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];

    if (b->tp > 1)
        (void)cudaSetDevice(r->device);
    if (r->stream)
        (void)cudaStreamSynchronize(r->stream);
    cuda_graphs_drop(r);
    for (int i = 0; i < 2; i++)
        if (r->ev_fwd[i])
            cudaEventDestroy(r->ev_fwd[i]);
    if (r->layer_ev) {
        for (int l = 0; l < b->mc.n_layers; l++)
            if (r->layer_ev[l])
                cudaEventDestroy(r->layer_ev[l]);
        bt_free(r->layer_ev);
        r->layer_ev = NULL;
    }
    if (r->comm)
        cuda_nccl_comm_destroy(b->nccl, &r->comm);
    cuda__dev_free((void **)&r->d_ar_flags);
    cuda__dev_free((void **)&r->d_ar_epoch);
    cuda__dev_free((void **)&r->d_ar_stage);
    cuda__dev_free((void **)&r->d_meta);
    cuda__dev_free((void **)&r->d_mask);
    cuda__dev_free((void **)&r->d_x);
    cuda__dev_free(&r->d_xn);
    cuda__dev_free(&r->d_qkv);
    cuda__dev_free(&r->d_q);
    cuda__dev_free(&r->d_att);
    cuda__dev_free(&r->d_gu);
    cuda__dev_free(&r->d_h);
    cuda__dev_free(&r->d_xr);
    cuda__dev_free((void **)&r->d_logits);
    cuda__dev_free((void **)&r->d_hidden);
    cuda__dev_free((void **)&r->d_ws);
    cuda__dev_free(&r->d_wide);
    cuda__dev_free((void **)&r->d_xq);
    cuda__dev_free(&r->d_xv);
    cuda__dev_free((void **)&r->d_xs);
    cuda__dev_free((void **)&r->d_acc);
    cuda__dev_free(&r->d_k);
    cuda__dev_free(&r->d_v);
    cuda__dev_free((void **)&r->d_inv_freq);
    cuda__dev_free((void **)&r->d_kv_scale);
    if (r->layers) {
        for (int l = 0; l < b->mc.n_layers; l++)
            cuda_layer_free(&r->layers[l]);
        bt_free(r->layers);
        r->layers = NULL;
    }
    if (r->cls_alias)
        r->d_cls = NULL;
    cuda__dev_free(&r->d_cls);
    cuda__dev_free(&r->d_emb);
    cuda__dev_free(&r->d_final_norm);
    worker_gemm_ctx_destroy(&r->gemm);
    if (r->stream)
        cudaStreamDestroy(r->stream);
    r->stream = NULL;
    return BT_OK;
}

static void cuda_destroy(void *impl)
{
    cuda_backend_t *b = impl;

    if (b == NULL)
        return;
    cuda_sampling_destroy(&b->samp); /* tp == 1: rank 0's device */
    cuda_host_tier_free(b);          /* tp == 1 too */
    if (b->ranks) /* by the crew, or from here when it never started */
        (void)cuda_each_rank(b, cuda_rank_free);
    backend_tp_crew_destroy(&b->crew);
    if (b->tp > 1)
        (void)cudaSetDevice(b->cfg.device_index);
    cuda_nccl_close(&b->nccl);
    if (b->h_meta)
        cudaFreeHost(b->h_meta);
    if (b->h_mask)
        cudaFreeHost(b->h_mask);
    bt_free(b->ranks);
    bt_free(b->row_map);
    bt_free(b);
}

// ---------------------------------------------------------------------
// The forward pass

static size_t cuda_layer_kv_elems(const cuda_backend_t *b)
{
    return (size_t)b->kv.n_blocks * b->kv.block_size * b->kv_dim;
}

/* In-place sum of x (n floats) over the ranks. */
static bt_status_t cuda_tp_allreduce(cuda_rank_t *r, size_t n)
{
    cuda_backend_t *b = r->b;
    bool custom;

    switch (b->ar_mode) {
    case CUDA_AR_NONE:
        return BT_OK;
    case CUDA_AR_CUSTOM:
        custom = true;
        break;
    case CUDA_AR_NCCL:
        custom = false;
        break;
    default:
        custom = b->ar_custom_ok && n * sizeof(float) <= b->ar_custom_max;
        break;
    }
    if (custom && n % 4 == 0)
        return cuda_allreduce_custom(&r->ar, n, r->stream);
    if (b->nccl == NULL)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "all-reduce of %zu floats needs NCCL", n);
    return cuda_nccl_allreduce_f32(b->nccl, r->comm, r->d_x, n, r->stream);
}

/* Copies n logits rows of this rank (its vocab columns, row stride
 * n_vocab on the device) into host rows h_row0.. (stride vocab). */
static bt_status_t cuda_copy_logits(cuda_rank_t *r, float *h_row0,
                                    const float *d_row0, int n)
{
    cuda_backend_t *b = r->b;
    size_t vocab = (size_t)b->mc.vocab_size, nv = (size_t)r->sh.n_vocab;

    if (b->tp == 1)
        return BT_CUDA_STATUS(cudaMemcpyAsync(
            h_row0, d_row0, (size_t)n * vocab * sizeof(float),
            cudaMemcpyDeviceToHost, r->stream));
    return BT_CUDA_STATUS(cudaMemcpy2DAsync(
        h_row0 + r->sh.vocab0, vocab * sizeof(float), d_row0,
        nv * sizeof(float), nv * sizeof(float), (size_t)n,
        cudaMemcpyDeviceToHost, r->stream));
}

/* Waits for rank r's stream; on rank 0 adds the forward's GPU time (its
 * ev_fwd pair) to the backend's sum. */
static bt_status_t cuda_rank_sync_timed(cuda_rank_t *r)
{
    bt_status_t status;

    if (r->fwd_timed &&
        cudaEventRecord(r->ev_fwd[1], r->stream) != cudaSuccess)
        r->fwd_timed = false;
    status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    if (status == BT_OK && r->fwd_timed) {
        float ms = 0.0f;

        if (cudaEventElapsedTime(&ms, r->ev_fwd[0], r->ev_fwd[1]) ==
            cudaSuccess) {
            r->b->gpu_ns += (uint64_t)((double)ms * 1e6);
        }
        (void)cudaGetLastError();
    }
    r->fwd_timed = false;
    return status;
}

/* Enqueues logits (and hidden) rows [r0, r0 + n) of the plan. */
static bt_status_t cuda_enqueue_rows(cuda_rank_t *r, const cuda_plan_t *p,
                                     int r0, int n)
{
    cuda_backend_t *b = r->b;
    bt_status_t status;

    status = cuda_rmsnorm(r->d_x, NULL, r->d_final_norm, p->d_rows + r0, n,
                          b->mc.dim, b->mc.rms_eps, r->d_xr, b->dt,
                          r->stream);
    if (status != BT_OK)
        return status;
    status = worker_gemm(r->gemm, n, r->sh.n_vocab, b->mc.dim, r->d_xr,
                         r->d_cls, b->dt, r->d_logits, CUDA_DT_F32, false,
                         r->stream);
    if (status != BT_OK)
        return status;
    if (p->want_hidden && r->rank == 0)
        status = cuda_embed(r->d_x, CUDA_DT_F32, p->d_rows + r0, n,
                            b->mc.dim, r->d_hidden + (size_t)r0 * b->mc.dim,
                            r->stream);
    return status;
}

/* Layer l's K/V are written on every rank (rank 0, before the callback):
 * each rank records its event and then publishes l. */
static bt_status_t cuda_layer_wait_all(cuda_rank_t *r, int l)
{
    cuda_backend_t *b = r->b;
    bt_status_t status;

    for (int k = 0; k < b->tp; k++) {
        cuda_rank_t *o = &b->ranks[k];

        while (atomic_load(&o->ev_layer) < l) {
        }
        status = BT_CUDA_STATUS(cudaEventSynchronize(o->layer_ev[l]));
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

/* Precision fp8: out (nt, n_out) [+]= in (nt, n_in) . f^T, the input
 * (kernels/fp8.h cuda_fp8_in_t: the bf16 rows d_in, the RMSNorm of the
 * f32 rows d_in with weights d_g, or the SwiGLU of the gate|up rows
 * d_in) made and quantized into the form the product reads, then
 * worker_gemm_fp8; a 1-token GEMV makes its input itself (one kernel,
 * the same numbers: cuda_gemv_fp8_fused; the two-kernel form stays for
 * the shapes it does not take and for test_cuda_fp8's A/B). */
static bt_status_t cuda_fp8_linear(cuda_rank_t *r, int nt, cuda_fp8_in_t in,
                                   const void *d_in, const void *d_g,
                                   int n_in, const cuda_fp8_lin_t *f,
                                   int n_out, void *d_out,
                                   cuda_dtype_t out_dt, bool accumulate)
{
    const int ld = cuda_fp8_ld(n_in);
    const bool gemv = worker_gemm_fp8_gemv(r->gemm, nt, n_out, ld,
                                           r->acc_floats);
    /* the 1-token GEMV reads the bf16 values, every other product codes */
    void *d_v = gemv && nt == 1 ? r->d_xv : NULL;
    uint8_t *d_q = d_v != NULL ? NULL : r->d_xq;
    const worker_gemm_fp8_t a = { d_q, d_v, r->d_xs, f->d_w, f->d_ws,
                                  r->d_acc, r->acc_floats, gemv };
    bt_status_t status;

    if (d_v != NULL && cuda_gemv_fp8_fused_ok(in, d_in, d_g, n_in, ld))
        return cuda_gemv_fp8_fused(in, d_in, d_g, r->b->mc.rms_eps, n_in,
                                   ld, f->in_scale, f->d_w, f->d_ws, n_out,
                                   d_out, out_dt, accumulate, r->stream);
    if (in == CUDA_FP8_IN_NORM)
        status = cuda_fp8_norm_quant(d_in, d_g, r->b->mc.rms_eps, nt, n_in,
                                     ld, f->in_scale, d_q, d_v, r->d_xs,
                                     r->stream);
    else if (in == CUDA_FP8_IN_GLU)
        status = cuda_fp8_glu_quant(d_in, nt, n_in, ld, f->in_scale, d_q,
                                    d_v, r->d_xs, r->stream);
    else
        status = cuda_fp8_quant_act(d_in, r->b->dt, nt, n_in, ld,
                                    f->in_scale, d_q, d_v, r->d_xs,
                                    r->stream);
    if (status != BT_OK)
        return status;
    return worker_gemm_fp8(r->gemm, nt, n_out, ld, &a, d_out, out_dt,
                           accumulate, r->stream);
}

/* out (nt, n_out) = rmsnorm(x) . w^T for the layer's input norm g: one
 * kernel (the norm inside the GEMV) when fuse_norm, else the norm into
 * d_xn and worker_gemm; fp8: the fp8 linear f8 instead of w, the norm
 * made inside its input quantization.
 * BT_PROFILE_SKIP=norm leaves the norm out. */
static bt_status_t cuda_enqueue_norm_gemm(cuda_rank_t *r, int nt,
                                          bool fuse_norm, const void *d_g,
                                          const void *d_w,
                                          const cuda_fp8_lin_t *f8,
                                          int n_out, void *d_out)
{
    const cuda_backend_t *b = r->b;
    const model_config_t *mc = &b->mc;
    const bool norm = !(b->skip & CUDA_SKIP_NORM);
    bt_status_t status;

    if (b->fp8) /* the norm inside the input quantization */
        return cuda_fp8_linear(r, nt, CUDA_FP8_IN_NORM, r->d_x, d_g,
                               mc->dim, f8, n_out, d_out, b->dt, false);
    if (fuse_norm && norm)
        return cuda_gemv_norm(nt, n_out, mc->dim, r->d_x, d_g, mc->rms_eps,
                              d_w, d_out, b->dt, r->stream);
    if (norm) {
        status = cuda_rmsnorm(r->d_x, NULL, d_g, NULL, nt, mc->dim,
                              mc->rms_eps, r->d_xn, b->dt, r->stream);
        if (status != BT_OK)
            return status;
    }
    return worker_gemm(r->gemm, nt, n_out, mc->dim, r->d_xn, d_w, b->dt,
                       d_out, b->dt, false, r->stream);
}

/* The residual add of the o and down projections: x (nt, dim) f32 [+]=
 * in (nt, n_in) . w^T, rank 0 accumulating into x and the other ranks
 * writing their partial there, then (tensor parallelism) the all-reduce
 * of x over the ranks.  skip (BT_PROFILE_SKIP): no product, the
 * all-reduce still runs.  fp8: f8 instead of w, fed by f8_in (the
 * SwiGLU of d_in for the down projection). */
static bt_status_t cuda_enqueue_residual_gemm(cuda_rank_t *r, int nt,
                                              const void *d_in, int n_in,
                                              const void *d_w,
                                              const cuda_fp8_lin_t *f8,
                                              cuda_fp8_in_t f8_in, bool skip)
{
    const cuda_backend_t *b = r->b;
    const int dim = b->mc.dim;
    bt_status_t status = BT_OK;

    if (!skip && b->fp8) /* one rank (fp8 refuses tp > 1): accumulate */
        status = cuda_fp8_linear(r, nt, f8_in, d_in, NULL, n_in, f8, dim,
                                 r->d_x, CUDA_DT_F32, true);
    else if (!skip)
        status = worker_gemm(r->gemm, nt, dim, n_in, d_in, d_w, b->dt,
                             r->d_x, CUDA_DT_F32, r->rank == 0, r->stream);
    if (status == BT_OK && b->tp > 1)
        status = cuda_tp_allreduce(r, (size_t)nt * dim);
    return status;
}

/* FP8 KV prefill attention through the bf16 ping-pong kernel
 * (cuda_attn_prefill_widen_ok): this layer's pages of the prefill
 * sequences (p->d_pages) widened to bf16 (exact) in r->d_wide, read
 * through the block tables into them with the codes' scales. */
static bt_status_t cuda_prefill_widened(cuda_rank_t *r, const cuda_plan_t *p,
                                        const cuda_attn_args_t *aa,
                                        const void *d_kl, const void *d_vl)
{
    cuda_backend_t *b = r->b;
    const size_t page = (size_t)b->kv.block_size * b->kv_dim; /* elements */
    cuda_attn_args_t wa = *aa;
    bt_status_t status;

    wa.d_k_cache = r->d_wide;
    wa.d_v_cache = (char *)r->d_wide + (size_t)b->wide_pages * page * 2;
    wa.d_block_tables = p->d_bt_wide;
    wa.kv_slots = (long long)p->n_pages * b->kv.block_size;
    wa.kv_widened = true;
    status = cuda_kv8_widen_pages(d_kl, d_vl, page, p->d_pages, p->n_pages,
                                  (void *)wa.d_k_cache, (void *)wa.d_v_cache,
                                  r->stream);
    if (status != BT_OK)
        return status;
    return cuda_attn_prefill(&wa, p->d_tiles, p->n_tiles, b->dt, r->stream);
}

/* Enqueues the whole forward described by `p` on the rank's stream
 * (graph capture records exactly this).  With p->h_logits set (no graph)
 * the logits rows are copied to the host chunk by chunk as they are
 * made. */
static bt_status_t cuda_enqueue_forward(cuda_rank_t *r,
                                        const cuda_plan_t *p)
{
    cuda_backend_t *b = r->b;
    const model_config_t *mc = &b->mc;
    size_t layer_kv_bytes = cuda_layer_kv_elems(b) * b->kv.elem_size;
    int nt = p->nt;
    const bool tp = b->tp > 1;
    bt_status_t status;
    cuda_rope_kv_args_t ra;
    cuda_attn_args_t aa;

    status = cuda_embed(r->d_emb, b->dt, p->d_tokens, nt, mc->dim, r->d_x,
                        r->stream);
    if (status != BT_OK)
        return status;

    memset(&ra, 0, sizeof(ra));
    ra.n_tokens = nt;
    ra.n_heads = b->nh;
    ra.n_kv_heads = b->nkv;
    ra.head_dim = mc->head_dim;
    ra.rope_half = mc->rope_layout == MODEL_ROPE_HALF;
    ra.d_qkv = r->d_qkv;
    ra.d_inv_freq = r->d_inv_freq;
    ra.d_pos = p->d_pos;
    ra.d_slot = p->d_slot;
    ra.d_q = r->d_q;

    memset(&aa, 0, sizeof(aa));
    aa.n_heads = b->nh;
    aa.n_kv_heads = b->nkv;
    aa.head_dim = mc->head_dim;
    aa.block_size = b->kv.block_size;
    aa.kv_slots = (long long)b->kv.n_blocks * b->kv.block_size;
    aa.scale = 1.0f / sqrtf((float)mc->head_dim);
    aa.d_q = r->d_q;
    aa.d_block_tables = p->d_bt;
    aa.d_masks = r->d_mask;
    aa.d_kv_len = p->d_kv_len;
    aa.d_bt_off = p->d_bt_off;
    aa.d_ctx_len = p->d_ctx;
    aa.d_mask_off = p->d_mask_off;
    aa.d_out = r->d_att;
    /* Single-token unmasked steps of up to CUDA_ROPE_FUSE_MAX_TOK tokens:
     * RoPE and the new keys' K/V write run inside the decode attention
     * kernel (one kernel a layer less; the per-layer events of
     * on_layer_done are never wanted then).  FP8 KV too: its codes bit for
     * bit rope_kv's (test_cuda_kv8), batch 1 -2% (H100, PERFORMANCE.md). */
    const bool fuse_rope = p->single &&
                           p->n_gen <= CUDA_ROPE_FUSE_MAX_TOK &&
                           !(b->skip & (CUDA_SKIP_ROPE | CUDA_SKIP_ATTN)) &&
                           cuda_attn_decode_rope_ok(&aa, p->n_gen, b->dt);
    if (fuse_rope) {
        aa.d_qkv = r->d_qkv;
        aa.d_inv_freq = r->d_inv_freq;
        aa.d_pos = p->d_pos;
        aa.d_slot = p->d_slot;
        aa.rope_half = ra.rope_half;
    }

    /* Steps of up to CUDA_FUSE_NORM_MAX_TOK tokens in bf16 whose GEMMs
     * may take the GEMV kernels: RMSNorm inside the rows GEMV that
     * consumes it (one kernel less per norm; BT_GEMV_NORM=0: off). */
    const bool fuse_norm = b->dt == CUDA_DT_BF16 && !b->fp8 &&
                           nt <= CUDA_FUSE_NORM_MAX_TOK &&
                           worker_gemm_gemv_enabled(r->gemm) &&
                           cuda_gemv_norm_ok(nt, mc->dim);
    /* ... and there SwiGLU inside the gate|up GEMV's output (one kernel a
     * layer less; BT_GEMV_GLU=0: off) */
    const bool fuse_glu = fuse_norm &&
                          !(b->skip & (CUDA_SKIP_GU | CUDA_SKIP_SWIGLU |
                                       CUDA_SKIP_NORM)) &&
                          cuda_gemv_norm_glu_ok(nt, mc->dim);

    for (int l = 0; l < mc->n_layers; l++) {
        const cuda_layer_t *w = &r->layers[l];
        void *d_kl = (char *)r->d_k + (size_t)l * layer_kv_bytes;
        void *d_vl = (char *)r->d_v + (size_t)l * layer_kv_bytes;

        status = b->skip & CUDA_SKIP_QKV
                     ? BT_OK
                     : cuda_enqueue_norm_gemm(r, nt, fuse_norm,
                                              w->d_attn_norm, w->d_wqkv,
                                              &w->f8[CUDA_F8_QKV],
                                              b->qkv_dim, r->d_qkv);
        if (status != BT_OK)
            return status;
        ra.d_bias = w->d_bqkv;
        ra.d_k_cache = d_kl;
        ra.d_v_cache = d_vl;
        ra.d_kv_scale = r->d_kv_scale
                            ? r->d_kv_scale + (size_t)l * 2 * b->nkv
                            : NULL;
        if (!(b->skip & CUDA_SKIP_ROPE) && !fuse_rope)
            status = cuda_rope_kv(&ra, b->dt, r->stream);
        if (status != BT_OK)
            return status;
        if (p->batch && p->batch->on_layer_done) {
            status = BT_CUDA_STATUS(cudaEventRecord(r->layer_ev[l],
                                                    r->stream));
            if (status != BT_OK)
                return status;
            if (tp)
                atomic_store(&r->ev_layer, l);
        }
        aa.d_k_cache = d_kl;
        aa.d_v_cache = d_vl;
        aa.d_kv_scale = ra.d_kv_scale;
        if (fuse_rope)
            aa.d_qkv_bias = w->d_bqkv;
        if (!(b->skip & CUDA_SKIP_ATTN)) {
            status = cuda_attn_decode(&aa, p->d_gen, p->n_gen, p->n_splits,
                                      p->split_len, r->d_ws, b->dt,
                                      r->stream);
            if (status != BT_OK)
                return status;
            status = p->n_pages > 0
                         ? cuda_prefill_widened(r, p, &aa, d_kl, d_vl)
                         : cuda_attn_prefill(&aa, p->d_tiles, p->n_tiles,
                                             b->dt, r->stream);
            if (status != BT_OK)
                return status;
        }
        status = cuda_enqueue_residual_gemm(r, nt, r->d_att, b->q_dim,
                                            w->d_wo, &w->f8[CUDA_F8_O],
                                            CUDA_FP8_IN_ROWS,
                                            b->skip & CUDA_SKIP_O);
        if (status != BT_OK)
            return status;
        if (fuse_glu) {
            status = cuda_gemv_norm_glu(nt, b->hid, mc->dim, r->d_x,
                                        w->d_ffn_norm, mc->rms_eps,
                                        w->d_wgu, r->d_h, r->stream);
        } else {
            status = b->skip & CUDA_SKIP_GU
                         ? BT_OK
                         : cuda_enqueue_norm_gemm(r, nt, fuse_norm,
                                                  w->d_ffn_norm, w->d_wgu,
                                                  &w->f8[CUDA_F8_GU],
                                                  2 * b->hid, r->d_gu);
            /* (fp8: the SwiGLU is made inside the down projection's
             * input quantization) */
            if (status == BT_OK && !(b->skip & CUDA_SKIP_SWIGLU) && !b->fp8)
                status = cuda_swiglu(r->d_gu, nt, b->hid, r->d_h, b->dt,
                                     r->stream);
        }
        if (status != BT_OK)
            return status;
        status = cuda_enqueue_residual_gemm(r, nt, b->fp8 ? r->d_gu : r->d_h,
                                            b->hid, w->d_wdown,
                                            &w->f8[CUDA_F8_DOWN],
                                            CUDA_FP8_IN_GLU,
                                            b->skip & CUDA_SKIP_DOWN);
        if (status != BT_OK)
            return status;
        if (p->batch && p->batch->on_layer_done && r->rank == 0) {
            /* Layer l's K/V are written once its event fires (on every
             * rank); the GPUs keep working on the rest of layer l. */
            if (tp)
                status = cuda_layer_wait_all(r, l);
            else
                status = BT_CUDA_STATUS(cudaEventSynchronize(r->layer_ev[l]));
            if (status != BT_OK)
                return status;
            p->batch->on_layer_done(p->batch->on_layer_arg, l);
        }
    }

    for (int r0 = 0; r0 < p->n_rows; r0 += b->row_cap) {
        int n = BT_MIN(b->row_cap, p->n_rows - r0);

        status = cuda_enqueue_rows(r, p, r0, n);
        if (status != BT_OK)
            return status;
        if (p->h_logits) {
            status = cuda_copy_logits(
                r, p->h_logits + (size_t)r0 * mc->vocab_size, r->d_logits, n);
            if (status != BT_OK)
                return status;
        }
        if (p->h_hidden && r->rank == 0) {
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                p->h_hidden + (size_t)r0 * mc->dim,
                r->d_hidden + (size_t)r0 * mc->dim,
                (size_t)n * mc->dim * sizeof(float), cudaMemcpyDeviceToHost,
                r->stream));
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
}

/* cuda_enqueue_forward, with late programmatic-dependent-launch
 * triggers on steps of <= 2 tokens (cuda__pdl_late, cuda_int.h: faster
 * there than no PDL or early triggers). */
static bt_status_t cuda_enqueue(cuda_rank_t *r, const cuda_plan_t *p)
{
    const int saved_late = cuda__pdl_late;
    bt_status_t status;

    if (p->nt <= 2)
        cuda__pdl_late = 1;
    status = cuda_enqueue_forward(r, p);
    cuda__pdl_late = saved_late;
    return status;
}

/* Finds or captures the rank's graph for this decode plan. */
static bt_status_t cuda_graph_get(cuda_rank_t *r, const cuda_plan_t *p,
                                  cudaGraphExec_t *exec_p)
{
    cuda_graph_t *g;
    cudaGraph_t graph = NULL;
    bt_status_t status, st2;

    for (int i = 0; i < r->n_graphs; i++) {
        g = &r->graphs[i];
        if (g->bucket == p->nt && g->n_splits == p->n_splits &&
            g->split_len == p->split_len && g->hidden == p->want_hidden &&
            g->single == p->single) {
            *exec_p = g->exec;
            return BT_OK;
        }
    }
    if (r->n_graphs == CUDA_MAX_GRAPHS) {
        cudaGraphExecDestroy(r->graphs[0].exec);
        memmove(&r->graphs[0], &r->graphs[1],
                (CUDA_MAX_GRAPHS - 1) * sizeof(r->graphs[0]));
        r->n_graphs--;
    }
    g = &r->graphs[r->n_graphs];
    memset(g, 0, sizeof(*g));
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        r->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        return status;
    status = cuda_enqueue(r, p);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(r->stream, &graph));
    if (status == BT_OK)
        status = st2;
    if (status != BT_OK)
        goto out;
    status = BT_CUDA_STATUS(cudaGraphInstantiate(&g->exec, graph, 0));
    if (status != BT_OK)
        goto out;
    g->bucket = p->nt;
    g->n_splits = p->n_splits;
    g->split_len = p->split_len;
    g->hidden = p->want_hidden;
    g->single = p->single;
    r->n_graphs++;
    BT_LOG_DEBUG("CUDA", "captured decode graph: bucket %d, %d splits of %d",
                 p->nt, p->n_splits, p->split_len);
    *exec_p = g->exec;
out:
    if (graph)
        cudaGraphDestroy(graph);
    return status;
}

/* Runs one planned forward on one rank: indices up, the graph or the
 * enqueued forward, logits (and hidden) rows down, then waits. */
static bt_status_t cuda_rank_step(cuda_rank_t *r, const cuda_step_t *st)
{
    cuda_backend_t *b = r->b;
    const backend_batch_t *batch = st->batch;
    const int *d = r->d_meta;
    cuda_plan_t p;
    bt_status_t status;

    status = cuda_rank_enter(r);
    if (status != BT_OK)
        return status;
    memset(&p, 0, sizeof(p));
    p.nt = st->nt;
    p.n_rows = st->n_rows;
    p.n_gen = st->n_gen;
    p.n_tiles = st->n_tiles;
    p.n_splits = st->n_splits;
    p.split_len = st->split_len;
    p.want_hidden = st->want_hidden;
    p.single = st->single;
    p.d_tokens = d + st->o_tokens;
    p.d_pos = d + st->o_pos;
    p.d_slot = d + st->o_slot;
    p.d_kv_len = d + st->o_kv_len;
    p.d_bt_off = d + st->o_bt_off;
    p.d_ctx = d + st->o_ctx;
    p.d_mask_off = d + st->o_mask_off;
    p.d_gen = d + st->o_gen;
    p.d_rows = d + st->o_rows;
    p.d_tiles = d + st->o_tiles;
    p.d_bt = d + st->o_bt;
    p.n_pages = st->n_pages;
    p.d_pages = d + st->o_pages;
    p.d_bt_wide = d + st->o_bt_wide;
    p.batch = st->graph ? NULL : batch;

    if (r->rank == 0)
        r->fwd_timed = cudaEventRecord(r->ev_fwd[0], r->stream) ==
                       cudaSuccess;
    status = BT_CUDA_STATUS(cudaMemcpyAsync(r->d_meta, b->h_meta,
                                            st->meta_ints * sizeof(int),
                                            cudaMemcpyHostToDevice,
                                            r->stream));
    if (status != BT_OK)
        return status;
    if (st->mask_bytes) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(r->d_mask, b->h_mask,
                                                st->mask_bytes,
                                                cudaMemcpyHostToDevice,
                                                r->stream));
        if (status != BT_OK)
            return status;
    }

    if (st->graph) {
        cudaGraphExec_t exec;
        float *logits = st->h_logits, *hidden = st->h_hidden;
        int row = 0;

        status = cuda_graph_get(r, &p, &exec);
        if (status != BT_OK)
            return status;
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, r->stream));
        if (status != BT_OK)
            return status;
        /* Copy back the rows of tokens that asked for logits (a
         * sequence's last n_logits tokens), in runs of adjacent rows. */
        for (int s = 0, t = 0; s < batch->n_seqs && (logits || hidden); ) {
            const backend_seq_t *sq = &batch->seqs[s++];
            int d0 = t + sq->n_tokens - sq->n_logits, cnt = sq->n_logits;

            t += sq->n_tokens;
            while (s < batch->n_seqs &&
                   batch->seqs[s].n_logits == batch->seqs[s].n_tokens) {
                cnt += batch->seqs[s].n_tokens;
                t += batch->seqs[s++].n_tokens;
            }
            if (cnt == 0)
                continue;
            if (logits)
                status = cuda_copy_logits(
                    r, logits + (size_t)row * b->mc.vocab_size,
                    r->d_logits + (size_t)d0 * r->sh.n_vocab, cnt);
            if (status != BT_OK)
                return status;
            if (hidden && r->rank == 0) {
                status = BT_CUDA_STATUS(cudaMemcpyAsync(
                    hidden + (size_t)row * b->mc.dim,
                    r->d_hidden + (size_t)d0 * b->mc.dim,
                    (size_t)cnt * b->mc.dim * sizeof(float),
                    cudaMemcpyDeviceToHost, r->stream));
                if (status != BT_OK)
                    return status;
            }
            row += cnt;
        }
    } else {
        p.h_logits = st->h_logits; /* NULL: logits stay on the device */
        p.h_hidden = st->h_hidden;
        status = cuda_enqueue(r, &p);
        if (status != BT_OK) {
            (void)cudaStreamSynchronize(r->stream);
            return status;
        }
    }
    if (st->no_sync)
        return BT_OK;
    return cuda_rank_sync_timed(r);
}

static bt_status_t cuda_rank_step_op(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    bt_status_t status = cuda_rank_step(&b->ranks[rank], b->op_step);

    /* a failed rank records no more layer events: let rank 0 stop
     * waiting for them (cuda_layer_wait_all) */
    if (status != BT_OK)
        atomic_store(&b->ranks[rank].ev_layer, INT_MAX);
    return status;
}

/* The forward; no_sync (one GPU only) leaves it running on rank 0's
 * stream. */
static bt_status_t cuda_forward_ex(void *impl, const backend_batch_t *batch,
                                   float *logits, float *hidden, bool no_sync)
{
    cuda_backend_t *b = impl;
    const int bs = b->kv.block_size;
    const bool bf16_tiles = cuda_attn_prefill_ok(b->mc.head_dim, b->dt);
    int nt = 0, n_rows = 0, n_gen = 0, n_tiles = 0, max_kv = 1, nt_pad;
    size_t bt_total = 0, mask_total = 0, ints, off;
    size_t n_pages = 0; /* kv8: blocks the prefill tiles read, widened */
    bool graph = b->use_graphs && batch->on_layer_done == NULL;
    bool tree = false; /* a speculative verification step (masked) */
    bool single = true; /* one new unmasked token per sequence */
    int *h;
    int *tok, *pos, *slot, *kvl, *bto, *ctxa, *mo, *gen, *rows, *tiles, *bt;
    size_t mask_at = 0, bt_at = 0;
    cuda_step_t st;
    bt_status_t status;

    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *sq = &batch->seqs[s];
        nt += sq->n_tokens;
        n_rows += sq->n_logits;
        bt_total += BT_DIV_UP(sq->ctx_len + sq->n_tokens, bs);
        if (sq->mask)
            mask_total += (size_t)sq->n_tokens * sq->n_tokens;
        if (sq->n_tokens != 1 || sq->mask)
            single = false;
        /* graphs: decode tokens, or tree-verification chunks (a mask,
         * a logits row per token) */
        if (sq->n_tokens != 1) {
            if (b->tree_graphs && sq->mask != NULL &&
                sq->n_logits == sq->n_tokens)
                tree = true;
            else
                graph = false;
        }
        if (bf16_tiles && sq->n_tokens >= CUDA_PREFILL_MIN) {
            n_tiles += (int)BT_DIV_UP(sq->n_tokens, CUDA_PREFILL_BQ);
            n_pages += BT_DIV_UP(sq->ctx_len + sq->n_tokens, bs);
        }
    }
    if (nt > b->max_tok)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "batch of %d tokens exceeds the backend's %d", nt,
                        b->max_tok);
    nt_pad = graph ? cuda_pow2_ceil(nt) : nt;
    /* Tree graphs: every token takes the per-token attention kernel (no
     * prefill tiles) and every padded row's logits fit one classifier
     * chunk. */
    if (nt_pad > (tree ? BT_MIN(b->row_cap, b->max_tok) : b->bucket_max))
        graph = false, nt_pad = nt;
    if (graph)
        n_tiles = 0;
    if (n_tiles == 0 || n_pages > (size_t)b->wide_pages)
        n_pages = 0; /* the codes are read (or there is no prefill) */
    /* Graph steps compute a logits row for every (padded) token. */
    int rows_c = graph ? nt_pad : n_rows;
    ints = (size_t)7 * nt_pad + nt_pad + rows_c +
           (size_t)n_tiles * CUDA_PREFILL_TILE_INTS + bt_total +
           (n_pages > 0 ? n_pages + bt_total : 0);
    status = cuda_meta_reserve(b, ints, BT_MAX(mask_total, (size_t)1));
    if (status != BT_OK)
        return status;

    h = b->h_meta;
    off = 0;
    memset(&st, 0, sizeof(st));
    st.o_tokens = off, tok = h + off, off += nt_pad;
    st.o_pos = off, pos = h + off, off += nt_pad;
    st.o_slot = off, slot = h + off, off += nt_pad;
    st.o_kv_len = off, kvl = h + off, off += nt_pad;
    st.o_bt_off = off, bto = h + off, off += nt_pad;
    st.o_ctx = off, ctxa = h + off, off += nt_pad;
    st.o_mask_off = off, mo = h + off, off += nt_pad;
    st.o_gen = off, gen = h + off, off += nt_pad;
    st.o_rows = off, rows = h + off, off += rows_c;
    st.o_tiles = off, tiles = h + off;
    off += (size_t)n_tiles * CUDA_PREFILL_TILE_INTS;
    st.o_bt = off, bt = h + off;
    /* kv8 widened: the pages' pool blocks, then block tables into them */
    int *pages = h + off + bt_total, *bt_wide = pages + n_pages;
    int pg = 0;
    st.o_pages = off + bt_total;
    st.o_bt_wide = st.o_pages + n_pages;
    st.n_pages = (int)n_pages;

    int t = 0, r = 0, ti = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *sq = &batch->seqs[s];
        int n = sq->n_tokens, ctx = sq->ctx_len;
        int nb = (int)BT_DIV_UP(ctx + n, bs);
        bool tiled = bf16_tiles && n >= CUDA_PREFILL_MIN && !graph;
        int moff = -1;

        memcpy(bt + bt_at, sq->block_table, sizeof(int) * nb);
        if (n_pages > 0) /* a prefill's blocks as pages, others unread */
            for (int j = 0; j < nb; j++) {
                bt_wide[bt_at + j] = tiled ? pg : 0;
                if (tiled)
                    pages[pg++] = sq->block_table[j];
            }
        if (sq->mask) {
            memcpy(b->h_mask + mask_at, sq->mask, (size_t)n * n);
            moff = (int)mask_at;
            mask_at += (size_t)n * n;
        }
        if (tiled) {
            for (int i0 = 0; i0 < n; i0 += CUDA_PREFILL_BQ) {
                int *tp = tiles + (size_t)ti++ * CUDA_PREFILL_TILE_INTS;
                tp[CUDA_PT_TOK0] = t;
                tp[CUDA_PT_I0] = i0;
                tp[CUDA_PT_NQ] = BT_MIN(CUDA_PREFILL_BQ, n - i0);
                tp[CUDA_PT_NTOK] = n;
                tp[CUDA_PT_CTX] = ctx;
                tp[CUDA_PT_BT_OFF] = (int)bt_at;
                tp[CUDA_PT_MASK_OFF] = moff;
                tp[CUDA_PT_PAD] = 0;
            }
        }
        for (int i = 0; i < n; i++, t++) {
            int sl = ctx + i;
            tok[t] = sq->tokens[i];
            pos[t] = sq->positions ? sq->positions[i] : ctx + i;
            slot[t] = sq->block_table[sl / bs] * bs + sl % bs;
            kvl[t] = sq->mask ? ctx + n : ctx + i + 1;
            bto[t] = (int)bt_at;
            ctxa[t] = ctx;
            mo[t] = sq->mask ? moff + i * n : -1;
            if (!tiled) {
                gen[n_gen++] = t;
                max_kv = BT_MAX(max_kv, kvl[t]);
            }
            if (!graph && i >= n - sq->n_logits)
                rows[r++] = t;
        }
        bt_at += nb;
    }
    for (; t < nt_pad; t++) { /* graph padding: no KV write, no keys */
        tok[t] = 0;
        pos[t] = 0;
        slot[t] = -1;
        kvl[t] = 0;
        bto[t] = 0;
        ctxa[t] = 0;
        mo[t] = -1;
        gen[n_gen++] = t;
    }
    if (graph)
        for (r = 0; r < nt_pad; r++)
            rows[r] = r;

    st.nt = nt_pad;
    st.n_rows = rows_c;
    st.n_gen = n_gen;
    st.n_tiles = n_tiles;
    st.want_hidden = hidden != NULL || batch->keep_hidden;
    st.single = single && batch->on_layer_done == NULL;
    st.graph = graph;
    {
        int max_splits = (int)BT_MIN(
            (size_t)CUDA_MAX_SPLITS,
            b->ws_floats / ((size_t)BT_MAX(n_gen, 1) * b->nh *
                            (b->mc.head_dim + 2)));
        if (max_splits < 1)
            max_splits = 1;
        cuda_attn_decode_plan(BT_MAX(n_gen, 1), max_kv, b->nh, b->nkv,
                              b->n_sm, b->attn_bps, max_splits,
                              &st.n_splits, &st.split_len);
        if (graph && st.n_splits > 1) {
            /* Round splits up to a power of two so few graphs cover every
             * context length (the extra splits find no keys). */
            int ns = cuda_pow2_ceil(st.n_splits);
            if (ns <= max_splits)
                st.n_splits = ns;
        }
    }
    BT_ASSERT((size_t)pg == n_pages);
    st.meta_ints = off + bt_total + (n_pages > 0 ? n_pages + bt_total : 0);
    st.mask_bytes = mask_total;
    st.batch = batch;
    st.h_logits = logits;
    st.h_hidden = hidden;
    st.no_sync = no_sync && b->tp == 1;
    b->hid_kept = st.want_hidden;
    b->n_rows = 0;
    for (int s = 0, t2 = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *sq = &batch->seqs[s];

        for (int i = 0; i < sq->n_logits; i++, b->n_rows++)
            b->row_map[b->n_rows] =
                graph ? t2 + sq->n_tokens - sq->n_logits + i : b->n_rows;
        t2 += sq->n_tokens;
    }

    if (b->tp == 1)
        return cuda_rank_step(&b->ranks[0], &st);
    for (int k = 0; k < b->tp; k++)
        atomic_store(&b->ranks[k].ev_layer, -1);
    b->op_step = &st;
    status = backend_tp_crew_run(b->crew, cuda_rank_step_op, b);
    b->op_step = NULL;
    return status;
}

static bt_status_t cuda_forward(void *impl, const backend_batch_t *batch,
                                float *logits, float *hidden)
{
    return cuda_forward_ex(impl, batch, logits, hidden, false);
}

// ---------------------------------------------------------------------
// Sampling on the device (backend_forward_sample; cuda_sample.h)

/* One GPU: the forward leaves its logits rows on the device and the
 * sampling work is enqueued behind it.  tp > 1 (each rank holds a vocab
 * slice) and batches with more logits rows than one classifier chunk
 * take the host path (not handled). */
static bt_status_t cuda_forward_sample_begin(void *impl,
                                             const backend_batch_t *batch,
                                             sampler_t *const *samplers,
                                             int *ids, float *logits,
                                             float *hidden, bool *handled)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[0];
    int n_rows = 0;
    bt_status_t status;

    *handled = false;
    if (b->tp > 1 || cuda_switches()->host_sample != NULL)
        return BT_OK;
    for (int s = 0; s < batch->n_seqs; s++)
        n_rows += batch->seqs[s].n_logits;
    if (n_rows == 0 || n_rows > b->row_cap)
        return BT_OK;
    if (b->samp == NULL) {
        status = cuda_sampling_create(b->mc.vocab_size, b->row_cap, &b->samp);
        if (status != BT_OK)
            return status;
    }
    status = cuda_forward_ex(b, batch, NULL, hidden, true);
    if (status != BT_OK)
        return status;
    status = cuda_sampling_enqueue(b->samp, r->d_logits,
                                   (size_t)r->sh.n_vocab, n_rows, b->row_map,
                                   samplers, ids, logits, r->stream);
    if (status == BT_OK)
        *handled = true;
    return status;
}

static bt_status_t cuda_forward_sample_end(void *impl)
{
    cuda_backend_t *b = impl;
    bt_status_t status = cuda_rank_sync_timed(&b->ranks[0]);
    bt_status_t st2 = cuda_sampling_finish(b->samp, b->ranks[0].stream);

    return status != BT_OK ? status : st2;
}

uint64_t cuda_backend_gpu_ns(backend_t *backend)
{
    if (strcmp(backend_name(backend), "cuda") != 0)
        return 0;
    return ((cuda_backend_t *)backend__impl(backend))->gpu_ns;
}

const float *cuda_backend_hidden(backend_t *backend, const int **map_p,
                                 int *n_p)
{
    cuda_backend_t *b;

    *map_p = NULL;
    *n_p = 0;
    if (strcmp(backend_name(backend), "cuda") != 0)
        return NULL;
    b = backend__impl(backend);
    if (!b->hid_kept || b->n_rows == 0)
        return NULL;
    *map_p = b->row_map;
    *n_p = b->n_rows;
    return b->ranks[0].d_hidden;
}

bt_status_t cuda_backend_sample_stats(backend_t *backend, uint64_t *argmax,
                                      uint64_t *top, uint64_t *top_miss,
                                      uint64_t *row)
{
    cuda_backend_t *b = backend__impl(backend);
    cuda_sampling_stats_t st;

    if (strcmp(backend_name(backend), "cuda") != 0)
        return BT_ERR_UNSUPPORTED;
    memset(&st, 0, sizeof(st));
    if (b->samp)
        cuda_sampling_stats(b->samp, &st);
    *argmax = st.argmax;
    *top = st.top;
    *top_miss = st.top_miss;
    *row = st.row;
    return BT_OK;
}

// ---------------------------------------------------------------------
// KV pool access

static void *cuda_kv_data_rank(void *impl, int rank, int layer, int kv)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[rank];
    size_t bytes = cuda_layer_kv_elems(b) * b->kv.elem_size;

    return (char *)(kv ? r->d_v : r->d_k) + (size_t)layer * bytes;
}

static void *cuda_kv_data(void *impl, int layer, int kv)
{
    return cuda_kv_data_rank(impl, 0, layer, kv);
}

/* Rank op: copies block op_i0 to block op_i1 in every layer. */
static bt_status_t cuda_rank_kv_copy_block(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    for (int l = 0; l < b->kv.n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            char *base = cuda_kv_data_rank(b, rank, l, kv);
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                base + (size_t)b->op_i1 * blk, base + (size_t)b->op_i0 * blk,
                blk, cudaMemcpyDeviceToDevice, r->stream));
            if (status != BT_OK)
                return status;
        }
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
}

static bt_status_t cuda_kv_copy_block(void *impl, int src_block,
                                      int dst_block)
{
    cuda_backend_t *b = impl;

    if (src_block == dst_block)
        return BT_OK;
    b->op_i0 = src_block;
    b->op_i1 = dst_block;
    return cuda_each_rank(b, cuda_rank_kv_copy_block);
}

/* Rank op: op_i0 slot pairs (sources, then destinations, in h_meta) up
 * through the rank's metadata buffer, one kernel for K and V of every
 * layer. */
static bt_status_t cuda_rank_kv_copy_slots(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    int n = b->op_i0;
    bt_status_t status = cuda_rank_enter(r);

    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaMemcpyAsync(r->d_meta, b->h_meta,
                                            2 * (size_t)n * sizeof(int),
                                            cudaMemcpyHostToDevice,
                                            r->stream));
    if (status == BT_OK)
        status = cuda_kv_copy_slots(
            r->d_k, r->d_v, b->kv.n_layers,
            cuda_layer_kv_elems(b) * b->kv.elem_size,
            (size_t)b->kv_dim * b->kv.elem_size, r->d_meta, r->d_meta + n, n,
            r->stream);
    if (status != BT_OK) {
        (void)cudaStreamSynchronize(r->stream);
        return status;
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
}

/* backend_kv_copy_slots: slots up through the metadata buffer (free
 * between forwards), on every rank's pool. */
static bt_status_t cuda_kv_copy_slots_op(void *impl, int n,
                                         const int *src_slots,
                                         const int *dst_slots)
{
    cuda_backend_t *b = impl;
    bt_status_t status = cuda_meta_reserve(b, 2 * (size_t)n, 1);

    if (status != BT_OK)
        return status;
    memcpy(b->h_meta, src_slots, (size_t)n * sizeof(int));
    memcpy(b->h_meta + n, dst_slots, (size_t)n * sizeof(int));
    b->op_i0 = n;
    return cuda_each_rank(b, cuda_rank_kv_copy_slots);
}

// ---------------------------------------------------------------------
// Host tier of the prefix cache (backend_kv_save / backend_kv_load)

/* The copy stream and its events, made at the first host-tier copy
 * (after cuda_rank_enter: rank 0's device). */
static bt_status_t cuda_host_tier_init(cuda_backend_t *b)
{
    bt_status_t status;

    if (b->copy_stream != NULL)
        return BT_OK;
    status = BT_CUDA_STATUS(cudaStreamCreateWithFlags(&b->copy_stream,
                                                      cudaStreamNonBlocking));
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaEventCreateWithFlags(&b->ev_queued,
                                                     cudaEventDisableTiming));
    if (status != BT_OK)
        goto err_stream;
    status = BT_CUDA_STATUS(cudaEventCreateWithFlags(&b->ev_copied,
                                                     cudaEventDisableTiming));
    if (status != BT_OK)
        goto err_queued;
    return BT_OK;

err_queued:
    (void)cudaEventDestroy(b->ev_queued);
    b->ev_queued = NULL;
err_stream:
    (void)cudaStreamDestroy(b->copy_stream);
    b->copy_stream = NULL;
    return status;
}

/* Waits for copies in flight (a load reads host memory the caller is
 * about to free), then frees the stream and events.  NULL-safe. */
static void cuda_host_tier_free(cuda_backend_t *b)
{
    if (b->copy_stream == NULL)
        return;
    (void)cudaStreamSynchronize(b->copy_stream);
    (void)cudaEventDestroy(b->ev_copied);
    (void)cudaEventDestroy(b->ev_queued);
    (void)cudaStreamDestroy(b->copy_stream);
    b->copy_stream = NULL;
    b->ev_copied = NULL;
    b->ev_queued = NULL;
}

/* The copy stream's work after what the compute stream has queued
 * (ev_queued), and the compute stream's next work after the copies
 * (ev_copied): the two fences of cuda_kv_host_copy and cuda_kv_copy_in. */
static bt_status_t copy_after_compute(cuda_backend_t *b, cuda_rank_t *r)
{
    bt_status_t status =
        BT_CUDA_STATUS(cudaEventRecord(b->ev_queued, r->stream));

    if (status == BT_OK)
        status = BT_CUDA_STATUS(
            cudaStreamWaitEvent(b->copy_stream, b->ev_queued, 0));
    return status;
}

static bt_status_t compute_after_copy(cuda_backend_t *b, cuda_rank_t *r)
{
    bt_status_t status =
        BT_CUDA_STATUS(cudaEventRecord(b->ev_copied, b->copy_stream));

    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamWaitEvent(r->stream, b->ev_copied,
                                                    0));
    return status;
}

/* One copy per layer, K and V, per run of blocks whose ids and host
 * slots are both consecutive (a 2D copy: device rows of one block, host
 * rows a slot apart), on the copy stream, so that neither waits for the
 * step in flight on the compute stream nor holds up the next one:
 *   - a save reads a cached block: complete (inserted only after the
 *     step or the verified hand-off that wrote it) and never written
 *     while cached, so it waits for nothing.  It returns complete: the
 *     evicted block may be handed at once to a peer that writes it
 *     outside these streams (CUDA IPC, UCX).
 *   - a load writes a block just taken from the allocator, which work
 *     queued on the compute stream may still read (its last owner's
 *     step): it waits for that work on the device (ev_queued), and is
 *     left in flight.  The host memory it reads is written only by later
 *     saves (this stream, so after it) and freed after host_pin(false)
 *     or destroy, which wait for it.
 * Either way the compute stream waits for the copies (ev_copied) before
 * its next work: no kernel writes a saved slot before the save read it,
 * none reads a loaded block before it landed, and every other use of the
 * pool (hand-off reads, block copies) runs on the compute stream or
 * after a step it finished.  tp == 1 (backend.c refuses more). */
static bt_status_t cuda_kv_host_copy(void *impl, int n, const int *blocks,
                                     void *const *host, bool to_host)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[0];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    size_t slot = 2 * (size_t)b->kv.n_layers * blk;
    bt_status_t status = cuda_rank_enter(r);

    if (status == BT_OK)
        status = cuda_host_tier_init(b);
    if (status != BT_OK)
        return status;
    if (!to_host)
        status = copy_after_compute(b, r);
    for (int i = 0, run; i < n && status == BT_OK; i += run) {
        for (run = 1; i + run < n && blocks[i + run] == blocks[i] + run &&
                      (char *)host[i + run] == (char *)host[i] + run * slot;
             run++)
            ;
        for (int l = 0; l < b->kv.n_layers && status == BT_OK; l++) {
            for (int kv = 0; kv < 2 && status == BT_OK; kv++) {
                char *dev = (char *)cuda_kv_data_rank(b, 0, l, kv) +
                            (size_t)blocks[i] * blk;
                char *h = (char *)host[i] + (2 * (size_t)l + kv) * blk;

                status = BT_CUDA_STATUS(
                    to_host ? cudaMemcpy2DAsync(h, slot, dev, blk, blk,
                                                (size_t)run,
                                                cudaMemcpyDeviceToHost,
                                                b->copy_stream)
                            : cudaMemcpy2DAsync(dev, blk, h, slot, blk,
                                                (size_t)run,
                                                cudaMemcpyHostToDevice,
                                                b->copy_stream));
            }
        }
    }
    if (status == BT_OK)
        status = compute_after_copy(b, r);
    if (status != BT_OK) {
        /* nothing half-done left behind: the caller drops the entry */
        (void)cudaStreamSynchronize(b->copy_stream);
        return status;
    }
    if (to_host)
        return BT_CUDA_STATUS(cudaEventSynchronize(b->ev_copied));
    return BT_OK;
}

/* backend_kv_copy_in: a CUDA IPC window (device memory of this GPU) into
 * the pool, one kernel for all of it (cuda_kv_window_to_pool: a
 * cudaMemcpyAsync per run of consecutive blocks, layer and K|V was up to
 * 64 calls a block of a fragmented pool on the loop), on the copy stream
 * after the work already queued
 * (the blocks' last owner may still be read: as a host-tier load), the
 * compute stream waiting for it.  Left in flight: waiting here would
 * hold the decode loop for the step in flight (~5 ms a hand-off at 16
 * req/s of 2,048-token prompts, H200); a host function behind the copies
 * says done, and the window's release waits for that on its own thread.
 * On an error nothing is left in flight (done not called).  tp == 1
 * (backend.c refuses more). */
static bt_status_t cuda_kv_copy_in(void *impl, const void *src, int n,
                                   const int *blocks, backend_done_fn_t done,
                                   void *done_arg)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[0];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status = cuda_rank_enter(r);

    if (status == BT_OK)
        status = cuda_host_tier_init(b);
    if (status == BT_OK)
        status = copy_after_compute(b, r);
    if (status == BT_OK)
        status = cuda_kv_window_to_pool(
            r->d_k, r->d_v, b->kv.n_layers,
            cuda_layer_kv_elems(b) * b->kv.elem_size, blk, src, blocks, n,
            b->copy_stream);
    if (status == BT_OK)
        status = compute_after_copy(b, r);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(
            cudaLaunchHostFunc(b->copy_stream, done, done_arg));
    /* an error: nothing reads the window after return */
    if (status != BT_OK && b->copy_stream != NULL)
        (void)cudaStreamSynchronize(b->copy_stream);
    return status;
}

/* Page-locks the host tier (cudaHostRegister) so its copies are DMA at
 * PCIe speed instead of staged through a driver buffer. */
static bt_status_t cuda_host_pin(void *impl, void *ptr, size_t bytes,
                                 bool pin)
{
    cuda_backend_t *b = impl;

    /* a load in flight may still read it */
    if (!pin && b->copy_stream != NULL) {
        bt_status_t status = BT_CUDA_STATUS(
            cudaStreamSynchronize(b->copy_stream));
        if (status != BT_OK)
            return status;
    }
    if (!pin)
        return BT_CUDA_STATUS(cudaHostUnregister(ptr));
    return BT_CUDA_STATUS(
        cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
}

// ---------------------------------------------------------------------
// All-reduce benchmark (cuda_backend.h)

/* Rank op: a graph of op_i0 all-reduces, replayed; rank 0 times it. */
static bt_status_t cuda_rank_bench_ar(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    const int reps = 5;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    bt_status_t status, st2;
    float ms = 0;

    status = cuda_rank_enter(r);
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaMemsetAsync(r->d_x, 0, b->op_n * 4,
                                            r->stream));
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        r->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        return status;
    for (int i = 0; i < b->op_i0 && status == BT_OK; i++)
        status = b->op_custom
                     ? cuda_allreduce_custom(&r->ar, b->op_n, r->stream)
                     : cuda_nccl_allreduce_f32(b->nccl, r->comm, r->d_x,
                                               b->op_n, r->stream);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(r->stream, &graph));
    if (status == BT_OK)
        status = st2;
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (status == BT_OK) /* warm-up */
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&ev[0]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&ev[1]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(ev[0], r->stream));
    for (int i = 0; i < reps && status == BT_OK; i++)
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(ev[1], r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventSynchronize(ev[1]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (status == BT_OK && rank == 0)
        b->op_us = 1e3 * ms / ((double)reps * b->op_i0);
    (void)cudaStreamSynchronize(r->stream);
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    return status;
}

/* Shared by the all-reduce benchmark and check: the backend must be a
 * tensor-parallel cuda one, and `path` ("custom" or "nccl") available
 * for n_floats; sets b->op_custom for the rank functions. */
static bt_status_t cuda_ar_select(backend_t *backend, const char *what,
                                  const char *path, size_t n_floats)
{
    cuda_backend_t *b = backend__impl(backend);

    if (strcmp(backend_name(backend), "cuda") != 0 || b->tp < 2)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "the all-reduce %s needs the cuda backend with "
                        "tp > 1", what);
    b->op_custom = strcmp(path, "custom") == 0;
    if ((b->op_custom && (!b->ar_custom_ok || n_floats % 4 != 0)) ||
        (!b->op_custom && b->nccl == NULL))
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "all-reduce path %s is not available here", path);
    return BT_OK;
}

bt_status_t cuda_backend_bench_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int iters,
                                         double *us_p)
{
    cuda_backend_t *b = backend__impl(backend);
    bt_status_t status = cuda_ar_select(backend, "benchmark", path, n_floats);

    if (status != BT_OK)
        return status;
    if (n_floats == 0 || n_floats > (size_t)b->max_tok * b->mc.dim ||
        iters < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "all-reduce bench of %zu floats x %d", n_floats,
                        iters);
    b->op_n = n_floats;
    b->op_i0 = iters;
    status = backend_tp_crew_run(b->crew, cuda_rank_bench_ar, b);
    if (status == BT_OK)
        *us_p = b->op_us;
    return status;
}

/* The pattern rank r contributes to element i of call k of the
 * all-reduce check: small integers, so every sum is exact in f32. */
static float cuda_ar_pattern(int r, size_t i, int k)
{
    return (float)((int)((i * 7 + (size_t)k * 13 + (size_t)r * 5) % 61) -
                   30);
}

/* Rank op: op_i0 all-reduces of varying sizes (up to op_n floats) on the
 * rank's stream with no host wait between them: each call's input copied
 * from a device pattern, its result saved; then every result is checked
 * on the host.  op_us gets the number of wrong elements (rank 0 first). */
static bt_status_t cuda_rank_check_ar(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    const int calls = b->op_i0;
    const size_t n = b->op_n;
    float *h = NULL, *d_pat = NULL, *d_res = NULL;
    size_t *sizes = NULL;
    long bad = 0;
    bt_status_t status;

    status = cuda_rank_enter(r);
    if (status != BT_OK)
        return status;
    h = bt_malloc((size_t)calls * n * sizeof(float), "ar_check");
    sizes = bt_malloc((size_t)calls * sizeof(size_t), "ar_check");
    if (h == NULL || sizes == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int k = 0; k < calls; k++) {
        /* whole, halves, a few tokens, one float4 more than a grid row */
        const size_t pick[] = { n, n / 2, n / 8, 4 * CUDA_AR_THREADS + 4,
                                n / 3, 4 };
        sizes[k] = BT_MAX((size_t)4, pick[k % 6] / 4 * 4);
        for (size_t i = 0; i < sizes[k]; i++)
            h[(size_t)k * n + i] = cuda_ar_pattern(rank, i, k);
    }
    status = cuda__dev_malloc((void **)&d_pat,
                              (size_t)calls * n * sizeof(float), "ar_check");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&d_res,
                                  (size_t)calls * n * sizeof(float),
                                  "ar_check");
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d_pat, h, (size_t)calls * n * sizeof(float),
            cudaMemcpyHostToDevice, r->stream));
    for (int k = 0; k < calls && status == BT_OK; k++) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            r->d_x, d_pat + (size_t)k * n, sizes[k] * sizeof(float),
            cudaMemcpyDeviceToDevice, r->stream));
        if (status == BT_OK)
            status = b->op_custom
                         ? cuda_allreduce_custom(&r->ar, sizes[k], r->stream)
                         : cuda_nccl_allreduce_f32(b->nccl, r->comm, r->d_x,
                                                   sizes[k], r->stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                d_res + (size_t)k * n, r->d_x, sizes[k] * sizeof(float),
                cudaMemcpyDeviceToDevice, r->stream));
    }
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            h, d_res, (size_t)calls * n * sizeof(float),
            cudaMemcpyDeviceToHost, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    for (int k = 0; k < calls && status == BT_OK; k++) {
        for (size_t i = 0; i < sizes[k]; i++) {
            float want = 0;
            for (int p = 0; p < b->tp; p++)
                want += cuda_ar_pattern(p, i, k);
            bad += h[(size_t)k * n + i] != want;
        }
    }
    b->op_bad[rank] = bad;
out:
    (void)cudaStreamSynchronize(r->stream);
    cuda__dev_free((void **)&d_pat);
    cuda__dev_free((void **)&d_res);
    bt_free(h);
    bt_free(sizes);
    return status;
}

bt_status_t cuda_backend_check_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int calls,
                                         long *bad_p)
{
    cuda_backend_t *b = backend__impl(backend);
    bt_status_t status = cuda_ar_select(backend, "check", path, n_floats);

    if (status != BT_OK)
        return status;
    if (n_floats < 8 || n_floats % 4 != 0 ||
        n_floats > (size_t)b->max_tok * b->mc.dim || calls < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "all-reduce check of %zu floats x %d", n_floats,
                        calls);
    b->op_n = n_floats;
    b->op_i0 = calls;
    status = backend_tp_crew_run(b->crew, cuda_rank_check_ar, b);
    *bad_p = 0;
    for (int r = 0; r < b->tp && status == BT_OK; r++)
        *bad_p += b->op_bad[r];
    return status;
}

static bt_status_t cuda_mem_info(void *impl, size_t *free_p,
                                 size_t *total_p)
{
    cuda_backend_t *b = impl;
    bt_status_t status = cuda_rank_mem_probe(b, 0);

    if (status != BT_OK)
        return status;
    *free_p = b->ranks[0].mem_free;
    *total_p = b->ranks[0].mem_total;
    return BT_OK;
}

static const kv_layout_t *cuda_kv_layout(void *impl)
{
    return &((cuda_backend_t *)impl)->kv;
}

/* cuBLASLt's tiles cut a step's tokens in 128s: on an H100 (2026-12-06,
 * bench_cuda --mixed, synth:llama3-8b) 124 decode rows + a 1,924-token
 * chunk (2,048 tokens) ran 36.0 ms in fp8, 58.1 in bf16, and 32 tokens
 * more 39.6 / 63.4 ms, what 2,176 cost (39.7 / 67.0). */
static int cuda_step_quantum(void *impl)
{
    (void)impl;
    return 128;
}

const backend_ops_t cuda_backend_ops = {
    .name = "cuda",
    .is_available = cuda_is_available,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .kv_data = cuda_kv_data,
    .kv_copy_block = cuda_kv_copy_block,
    .kv_layout = cuda_kv_layout,
    .kv_copy_slots = cuda_kv_copy_slots_op,
    .kv_data_rank = cuda_kv_data_rank,
    .forward_sample_begin = cuda_forward_sample_begin,
    .forward_sample_end = cuda_forward_sample_end,
    .mem_info = cuda_mem_info,
    .kv_host_copy = cuda_kv_host_copy,
    .host_pin = cuda_host_pin,
    .kv_copy_in = cuda_kv_copy_in,
    .step_quantum = cuda_step_quantum,
};
