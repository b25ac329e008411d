/*
 * cuda_backend.c - the "cuda" backend: a Llama-family forward pass on one
 * NVIDIA GPU over mixed batches (prompt chunks and decode tokens).
 *
 * Weights live on the device in bf16 (f32 in BACKEND_PRECISION_F32),
 * converted on the device from the checkpoint's F32/F16/BF16; q|k|v and
 * gate|up are fused into single matrices so each is one GEMM.  The
 * residual stream is f32: the o and down projections accumulate into it
 * straight from cuBLASLt (beta = 1).  The KV pool is device memory laid
 * out as kv.h says, in the activation dtype.
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
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cuda_backend.h"
#include "cuda_int.h"
#include "gemm.h"
#include "kernels/attn_decode.h"
#include "kernels/attn_prefill.h"
#include "kernels/convert.h"
#include "kernels/embed.h"
#include "kernels/gemv.h"
#include "kernels/kv_copy.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_kv.h"
#include "kernels/swiglu.h"

#define CUDA_MAX_SPLITS 64        /* key splits per token, at most */
#define CUDA_MAX_GRAPHS 64        /* captured decode graphs kept */
#define CUDA_PREFILL_MIN 16       /* chunk length that takes tiled attn */
#define CUDA_GEMM_WS (32u << 20)  /* cuBLASLt workspace */

/* Device copy of one layer's weights (activation dtype). */
typedef struct {
    void *d_wqkv;      /* ((nh + 2 nkv) hd, dim) q rows, k rows, v rows */
    void *d_bqkv;      /* ((nh + 2 nkv) hd) or NULL */
    void *d_wo;        /* (dim, nh hd) */
    void *d_wgu;       /* (2 hidden, dim) gate rows, then up rows */
    void *d_wdown;     /* (dim, hidden) */
    void *d_attn_norm; /* (dim) */
    void *d_ffn_norm;  /* (dim) */
} cuda_layer_t;

/* One captured decode step. */
typedef struct {
    int bucket;             /* padded batch size */
    int n_splits;           /* attention key splits */
    int split_len;          /* keys per split */
    bool hidden;            /* also gathers hidden rows */
    cudaGraphExec_t exec;
} cuda_graph_t;

/* Where one forward's device-side indices are (all inside d_meta). */
typedef struct {
    int nt;                 /* tokens computed (bucket when padded) */
    int n_rows;             /* logits rows computed */
    int n_gen;              /* tokens for the per-token attention kernel */
    int n_tiles;            /* prefill tiles */
    int n_splits;
    int split_len;
    bool want_hidden;
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
    const backend_batch_t *batch; /* for on_layer_done, NULL in graphs */
    float *h_logits;        /* host destination when copied in-line */
    float *h_hidden;
} cuda_plan_t;

typedef struct {
    model_config_t mc;
    backend_config_t cfg;
    cuda_dtype_t dt;          /* activations, weights, KV */
    int q_dim;                /* nh * hd */
    int kv_dim;               /* nkv * hd */
    int qkv_dim;              /* q_dim + 2 kv_dim */
    int n_sm;
    bool use_graphs;
    cudaStream_t stream;
    worker_gemm_ctx_t *gemm;

    cuda_layer_t *layers;     /* (n_layers) */
    void *d_emb;              /* (vocab, dim) */
    void *d_cls;              /* (vocab, dim), may alias d_emb */
    void *d_final_norm;       /* (dim) */
    float *d_inv_freq;        /* (hd / 2) */

    kv_layout_t kv;
    void *d_k;                /* (layers, blocks, block_size, nkv, hd) */
    void *d_v;                /* (layers, blocks, block_size, nkv, hd) */

    int max_tok;              /* rows of the activation buffers */
    int bucket_max;           /* largest decode graph bucket */
    int row_cap;              /* logits rows per classifier chunk */
    float *d_x;               /* (max_tok, dim) residual stream */
    void *d_xn;               /* (max_tok, dim) normed */
    void *d_qkv;              /* (max_tok, qkv_dim) */
    void *d_q;                /* (max_tok, q_dim) rotated q */
    void *d_att;              /* (max_tok, q_dim) attention out */
    void *d_gu;               /* (max_tok, 2 hidden) */
    void *d_h;                /* (max_tok, hidden) */
    void *d_xr;               /* (row_cap, dim) normed logits rows */
    float *d_logits;          /* (row_cap, vocab) */
    float *d_hidden;          /* (row_cap, dim) */
    float *d_ws;              /* split-K partials */
    size_t ws_floats;

    int *h_meta;              /* pinned, meta_cap ints */
    int *d_meta;              /* meta_cap ints */
    size_t meta_cap;
    uint8_t *h_mask;          /* pinned, mask_cap bytes */
    uint8_t *d_mask;
    size_t mask_cap;

    cudaEvent_t *layer_ev;    /* (n_layers) KV written, for callbacks */
    cuda_graph_t graphs[CUDA_MAX_GRAPHS];
    int n_graphs;
} cuda_backend_t;

// ---------------------------------------------------------------------
// Weight upload

/* Copies `t` to the device (raw, through d_stage) and converts it into
 * d_dst in the backend's dtype. */
static bt_status_t cuda_upload(cuda_backend_t *b, const model_tensor_t *t,
                               void *d_stage, void *d_dst)
{
    size_t n = (size_t)t->rows * t->cols;
    size_t bytes = n * model_dtype_size(t->dtype);
    bt_status_t status;

    status = BT_CUDA_STATUS(cudaMemcpyAsync(d_stage, t->data, bytes,
                                            cudaMemcpyHostToDevice,
                                            b->stream));
    if (status != BT_OK)
        return status;
    return cuda_convert(d_stage, (cuda_src_dtype_t)t->dtype, n, d_dst, b->dt,
                        b->stream);
}

static size_t cuda_tensor_raw_bytes(const model_tensor_t *t)
{
    if (t->data == NULL)
        return 0;
    return (size_t)t->rows * t->cols * model_dtype_size(t->dtype);
}

/* Allocates and fills one layer's fused weights. */
static bt_status_t cuda_layer_load(cuda_backend_t *b, const model_layer_t *ml,
                                   void *d_stage, cuda_layer_t *cl)
{
    size_t es = cuda_dtype_size(b->dt);
    size_t dim = b->mc.dim, hid = b->mc.hidden_dim;
    bt_status_t status;

#define CUDA_ALLOC(_p, _n, _name)                                          \
    do {                                                                    \
        status = cuda__dev_malloc(&(_p), (size_t)(_n) * es, _name);         \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)
#define CUDA_UP(_t, _dst)                                                   \
    do {                                                                    \
        status = cuda_upload(b, (_t), d_stage, (_dst));                     \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)

    CUDA_ALLOC(cl->d_wqkv, (size_t)b->qkv_dim * dim, "w_qkv");
    CUDA_UP(&ml->wq, cl->d_wqkv);
    CUDA_UP(&ml->wk, (char *)cl->d_wqkv + (size_t)b->q_dim * dim * es);
    CUDA_UP(&ml->wv, (char *)cl->d_wqkv +
                         (size_t)(b->q_dim + b->kv_dim) * dim * es);
    if (b->mc.qkv_bias && ml->bq.data != NULL) {
        CUDA_ALLOC(cl->d_bqkv, b->qkv_dim, "b_qkv");
        CUDA_UP(&ml->bq, cl->d_bqkv);
        CUDA_UP(&ml->bk, (char *)cl->d_bqkv + (size_t)b->q_dim * es);
        CUDA_UP(&ml->bv, (char *)cl->d_bqkv +
                             (size_t)(b->q_dim + b->kv_dim) * es);
    }
    CUDA_ALLOC(cl->d_wo, dim * b->q_dim, "w_o");
    CUDA_UP(&ml->wo, cl->d_wo);
    CUDA_ALLOC(cl->d_wgu, 2 * hid * dim, "w_gate_up");
    CUDA_UP(&ml->w_gate, cl->d_wgu);
    CUDA_UP(&ml->w_up, (char *)cl->d_wgu + hid * dim * es);
    CUDA_ALLOC(cl->d_wdown, dim * hid, "w_down");
    CUDA_UP(&ml->w_down, cl->d_wdown);
    CUDA_ALLOC(cl->d_attn_norm, dim, "attn_norm");
    CUDA_UP(&ml->attn_norm, cl->d_attn_norm);
    CUDA_ALLOC(cl->d_ffn_norm, dim, "ffn_norm");
    CUDA_UP(&ml->ffn_norm, cl->d_ffn_norm);
#undef CUDA_ALLOC
#undef CUDA_UP
    return BT_OK;
}

static void cuda_layer_free(cuda_layer_t *cl)
{
    cuda__dev_free(&cl->d_wqkv);
    cuda__dev_free(&cl->d_bqkv);
    cuda__dev_free(&cl->d_wo);
    cuda__dev_free(&cl->d_wgu);
    cuda__dev_free(&cl->d_wdown);
    cuda__dev_free(&cl->d_attn_norm);
    cuda__dev_free(&cl->d_ffn_norm);
}

static bt_status_t cuda_weights_load(cuda_backend_t *b, const model_t *model)
{
    const model_tensor_t *emb = model_tok_embedding(model);
    const model_tensor_t *cls = model_classifier(model);
    const model_tensor_t *fin = model_final_norm(model);
    size_t es = cuda_dtype_size(b->dt);
    size_t stage_bytes = 0;
    void *d_stage = NULL;
    bt_status_t status;

    /* The staging buffer holds the largest tensor as stored. */
    stage_bytes = BT_MAX(cuda_tensor_raw_bytes(emb),
                         cuda_tensor_raw_bytes(cls));
    for (int l = 0; l < b->mc.n_layers; l++) {
        const model_layer_t *ml = model_layer(model, l);
        const model_tensor_t *ts[] = {&ml->wq, &ml->wk, &ml->wv, &ml->wo,
                                      &ml->w_gate, &ml->w_up, &ml->w_down};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
            stage_bytes = BT_MAX(stage_bytes, cuda_tensor_raw_bytes(ts[i]));
    }
    status = cuda__dev_malloc(&d_stage, stage_bytes, "weight_stage");
    if (status != BT_OK)
        return status;

    b->layers = bt_calloc(b->mc.n_layers, sizeof(*b->layers), "cuda_layers");
    if (b->layers == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    status = cuda__dev_malloc(&b->d_emb,
                              (size_t)b->mc.vocab_size * b->mc.dim * es,
                              "tok_embedding");
    if (status != BT_OK)
        goto out;
    status = cuda_upload(b, emb, d_stage, b->d_emb);
    if (status != BT_OK)
        goto out;
    if (cls->data == emb->data && cls->dtype == emb->dtype) {
        b->d_cls = b->d_emb;
    } else {
        status = cuda__dev_malloc(&b->d_cls,
                                  (size_t)b->mc.vocab_size * b->mc.dim * es,
                                  "classifier");
        if (status != BT_OK)
            goto out;
        status = cuda_upload(b, cls, d_stage, b->d_cls);
        if (status != BT_OK)
            goto out;
    }
    status = cuda__dev_malloc(&b->d_final_norm, (size_t)b->mc.dim * es,
                              "final_norm");
    if (status != BT_OK)
        goto out;
    status = cuda_upload(b, fin, d_stage, b->d_final_norm);
    if (status != BT_OK)
        goto out;
    for (int l = 0; l < b->mc.n_layers; l++) {
        status = cuda_layer_load(b, model_layer(model, l), d_stage,
                                 &b->layers[l]);
        if (status != BT_OK)
            goto out;
    }
    status = BT_CUDA_STATUS(cudaStreamSynchronize(b->stream));
out:
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

/* Drops every captured graph (they hold pointers to buffers that are
 * about to move). */
static void cuda_graphs_drop(cuda_backend_t *b)
{
    for (int i = 0; i < b->n_graphs; i++)
        cudaGraphExecDestroy(b->graphs[i].exec);
    b->n_graphs = 0;
}

/* Grows the pinned + device metadata buffers to hold `ints` ints and
 * `mask_bytes` mask bytes (only ever grows; a steady state allocates
 * nothing). */
static bt_status_t cuda_meta_reserve(cuda_backend_t *b, size_t ints,
                                     size_t mask_bytes)
{
    bt_status_t status;

    if (ints > b->meta_cap) {
        size_t cap = BT_MAX(ints, 2 * b->meta_cap);

        cuda_graphs_drop(b);
        if (b->h_meta)
            cudaFreeHost(b->h_meta);
        b->h_meta = NULL;
        cuda__dev_free((void **)&b->d_meta);
        b->meta_cap = 0;
        status = BT_CUDA_STATUS(cudaMallocHost((void **)&b->h_meta,
                                               cap * sizeof(int)));
        if (status != BT_OK)
            return status;
        status = cuda__dev_malloc((void **)&b->d_meta, cap * sizeof(int),
                                  "batch_meta");
        if (status != BT_OK)
            return status;
        b->meta_cap = cap;
    }
    if (mask_bytes > b->mask_cap) {
        size_t cap = BT_MAX(mask_bytes, 2 * b->mask_cap);

        cuda_graphs_drop(b);
        if (b->h_mask)
            cudaFreeHost(b->h_mask);
        b->h_mask = NULL;
        cuda__dev_free((void **)&b->d_mask);
        b->mask_cap = 0;
        status = BT_CUDA_STATUS(cudaMallocHost((void **)&b->h_mask, cap));
        if (status != BT_OK)
            return status;
        status = cuda__dev_malloc((void **)&b->d_mask, cap, "batch_masks");
        if (status != BT_OK)
            return status;
        b->mask_cap = cap;
    }
    return BT_OK;
}

static bt_status_t cuda_create(const model_t *model,
                               const backend_config_t *cfg, void **impl_p)
{
    cuda_backend_t *b;
    const char *env;
    size_t es, act_bytes;
    bt_status_t status;
    int hd;

    b = bt_calloc(1, sizeof(*b), "cuda_backend");
    if (b == NULL)
        return BT_ERR_NO_MEMORY;
    b->mc = *model_config(model);
    b->cfg = *cfg;
    b->dt = cfg->precision == BACKEND_PRECISION_F32 ? CUDA_DT_F32
                                                     : CUDA_DT_BF16;
    es = cuda_dtype_size(b->dt);
    hd = b->mc.head_dim;
    if (!cuda_attn_head_dim_ok(hd) ||
        b->mc.n_heads % b->mc.n_kv_heads != 0) {
        bt_free(b);
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "head_dim %d (heads %d, kv heads %d) is not "
                        "supported by the CUDA kernels (8..256, powers "
                        "of two)", hd, b->mc.n_heads, b->mc.n_kv_heads);
    }
    b->q_dim = b->mc.n_heads * hd;
    b->kv_dim = b->mc.n_kv_heads * hd;
    b->qkv_dim = b->q_dim + 2 * b->kv_dim;
    env = getenv("BT_CUDA_GRAPHS");
    b->use_graphs = env == NULL || strcmp(env, "0") != 0;

    status = BT_CUDA_STATUS(cudaSetDevice(cfg->device_index));
    if (status != BT_OK)
        goto err;
    status = BT_CUDA_STATUS(cudaDeviceGetAttribute(
        &b->n_sm, cudaDevAttrMultiProcessorCount, cfg->device_index));
    if (status != BT_OK)
        goto err;
    status = BT_CUDA_STATUS(cudaStreamCreateWithFlags(&b->stream,
                                                      cudaStreamNonBlocking));
    if (status != BT_OK)
        goto err;
    status = worker_gemm_ctx_create(CUDA_GEMM_WS, &b->gemm);
    if (status != BT_OK)
        goto err;

    status = cuda_weights_load(b, model);
    if (status != BT_OK)
        goto err;
    BT_LOG_INFO("CUDA", "weights: %zu MiB on device (%s)",
                cuda__dev_live_bytes() >> 20,
                b->dt == CUDA_DT_F32 ? "f32" : "bf16");

    {
        float *inv = bt_malloc(sizeof(float) * (hd / 2), "inv_freq");
        if (inv == NULL) {
            status = BT_ERR_NO_MEMORY;
            goto err;
        }
        cuda__rope_inv_freq(&b->mc, inv);
        status = cuda__dev_malloc((void **)&b->d_inv_freq,
                                  sizeof(float) * (hd / 2), "inv_freq");
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpy(b->d_inv_freq, inv,
                                               sizeof(float) * (hd / 2),
                                               cudaMemcpyHostToDevice));
        bt_free(inv);
        if (status != BT_OK)
            goto err;
    }

    /* The KV pool. */
    b->kv.n_layers = b->mc.n_layers;
    b->kv.n_blocks = cfg->n_kv_blocks;
    b->kv.block_size = cfg->block_size;
    b->kv.n_kv_heads = b->mc.n_kv_heads;
    b->kv.head_dim = hd;
    b->kv.elem_size = es;
    {
        size_t bytes = (size_t)b->mc.n_layers * cfg->n_kv_blocks *
                       cfg->block_size * b->kv_dim * es;
        status = cuda__dev_malloc(&b->d_k, bytes, "kv_cache_k");
        if (status != BT_OK)
            goto err;
        status = cuda__dev_malloc(&b->d_v, bytes, "kv_cache_v");
        if (status != BT_OK)
            goto err;
        BT_LOG_INFO("CUDA", "KV pool: %d blocks of %d tokens, %zu MiB",
                    cfg->n_kv_blocks, cfg->block_size, (2 * bytes) >> 20);
    }

    /* Activations for the largest forward. */
    b->bucket_max = cuda_pow2_ceil(cfg->max_seqs);
    b->max_tok = BT_MAX(cfg->max_batch_tokens, b->bucket_max);
    b->row_cap = BT_MAX(256, b->bucket_max);
    act_bytes = cuda__dev_live_bytes();
#define CUDA_ACT(_p, _bytes, _name)                                         \
    do {                                                                    \
        status = cuda__dev_malloc((void **)&(_p), (_bytes), _name);         \
        if (status != BT_OK)                                                \
            goto err;                                                       \
    } while (0)
    CUDA_ACT(b->d_x, (size_t)b->max_tok * b->mc.dim * 4, "act_x");
    CUDA_ACT(b->d_xn, (size_t)b->max_tok * b->mc.dim * es, "act_xn");
    CUDA_ACT(b->d_qkv, (size_t)b->max_tok * b->qkv_dim * es, "act_qkv");
    CUDA_ACT(b->d_q, (size_t)b->max_tok * b->q_dim * es, "act_q");
    CUDA_ACT(b->d_att, (size_t)b->max_tok * b->q_dim * es, "act_att");
    CUDA_ACT(b->d_gu, (size_t)b->max_tok * 2 * b->mc.hidden_dim * es,
             "act_gate_up");
    CUDA_ACT(b->d_h, (size_t)b->max_tok * b->mc.hidden_dim * es, "act_h");
    CUDA_ACT(b->d_xr, (size_t)b->row_cap * b->mc.dim * es, "act_rows");
    CUDA_ACT(b->d_logits, (size_t)b->row_cap * b->mc.vocab_size * 4,
             "logits");
    CUDA_ACT(b->d_hidden, (size_t)b->row_cap * b->mc.dim * 4, "hidden");
    b->ws_floats = cuda_attn_decode_ws_floats(b->bucket_max, b->mc.n_heads,
                                              hd, CUDA_MAX_SPLITS);
    CUDA_ACT(b->d_ws, b->ws_floats * 4, "attn_splits");
#undef CUDA_ACT
    BT_LOG_INFO("CUDA", "activations: %zu MiB for %d batch tokens",
                (cuda__dev_live_bytes() - act_bytes) >> 20, b->max_tok);

    b->layer_ev = bt_calloc(b->mc.n_layers, sizeof(*b->layer_ev),
                            "layer_events");
    if (b->layer_ev == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err;
    }
    for (int l = 0; l < b->mc.n_layers; l++) {
        status = BT_CUDA_STATUS(cudaEventCreateWithFlags(
            &b->layer_ev[l], cudaEventDisableTiming));
        if (status != BT_OK)
            goto err;
    }
    status = cuda_meta_reserve(b, (size_t)16 * b->max_tok + 4096, 4096);
    if (status != BT_OK)
        goto err;
    BT_LOG_INFO("CUDA", "device memory in use: %zu MiB",
                cuda__dev_live_bytes() >> 20);
    *impl_p = b;
    return BT_OK;

err:
    cuda_destroy(b);
    return status;
}

static void cuda_destroy(void *impl)
{
    cuda_backend_t *b = impl;

    if (b == NULL)
        return;
    if (b->stream)
        (void)cudaStreamSynchronize(b->stream);
    cuda_graphs_drop(b);
    if (b->layer_ev) {
        for (int l = 0; l < b->mc.n_layers; l++)
            if (b->layer_ev[l])
                cudaEventDestroy(b->layer_ev[l]);
        bt_free(b->layer_ev);
    }
    if (b->h_meta)
        cudaFreeHost(b->h_meta);
    if (b->h_mask)
        cudaFreeHost(b->h_mask);
    cuda__dev_free((void **)&b->d_meta);
    cuda__dev_free((void **)&b->d_mask);
    cuda__dev_free((void **)&b->d_x);
    cuda__dev_free(&b->d_xn);
    cuda__dev_free(&b->d_qkv);
    cuda__dev_free(&b->d_q);
    cuda__dev_free(&b->d_att);
    cuda__dev_free(&b->d_gu);
    cuda__dev_free(&b->d_h);
    cuda__dev_free(&b->d_xr);
    cuda__dev_free((void **)&b->d_logits);
    cuda__dev_free((void **)&b->d_hidden);
    cuda__dev_free((void **)&b->d_ws);
    cuda__dev_free(&b->d_k);
    cuda__dev_free(&b->d_v);
    cuda__dev_free((void **)&b->d_inv_freq);
    if (b->layers) {
        for (int l = 0; l < b->mc.n_layers; l++)
            cuda_layer_free(&b->layers[l]);
        bt_free(b->layers);
    }
    if (b->d_cls == b->d_emb)
        b->d_cls = NULL;
    cuda__dev_free(&b->d_cls);
    cuda__dev_free(&b->d_emb);
    cuda__dev_free(&b->d_final_norm);
    worker_gemm_ctx_destroy(&b->gemm);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    bt_free(b);
}

// ---------------------------------------------------------------------
// The forward pass

static size_t cuda_layer_kv_elems(const cuda_backend_t *b)
{
    return (size_t)b->kv.n_blocks * b->kv.block_size * b->kv_dim;
}

/* Enqueues logits (and hidden) rows [r0, r0 + n) of the plan. */
static bt_status_t cuda_enqueue_rows(cuda_backend_t *b, const cuda_plan_t *p,
                                     int r0, int n)
{
    bt_status_t status;

    status = cuda_rmsnorm(b->d_x, NULL, b->d_final_norm, p->d_rows + r0, n,
                          b->mc.dim, b->mc.rms_eps, b->d_xr, b->dt,
                          b->stream);
    if (status != BT_OK)
        return status;
    status = worker_gemm(b->gemm, n, b->mc.vocab_size, b->mc.dim, b->d_xr,
                         b->d_cls, b->dt, b->d_logits, CUDA_DT_F32, false,
                         b->stream);
    if (status != BT_OK)
        return status;
    if (p->want_hidden)
        status = cuda_embed(b->d_x, CUDA_DT_F32, p->d_rows + r0, n,
                            b->mc.dim, b->d_hidden, b->stream);
    return status;
}

/* Enqueues the whole forward described by `p` on the stream (graph
 * capture records exactly this).  With p->h_logits set (no graph) the
 * logits rows are copied to the host chunk by chunk as they are made. */
static bt_status_t cuda_enqueue(cuda_backend_t *b, const cuda_plan_t *p)
{
    const model_config_t *mc = &b->mc;
    size_t es = cuda_dtype_size(b->dt);
    size_t layer_kv = cuda_layer_kv_elems(b);
    int nt = p->nt;
    bt_status_t status;
    cuda_rope_kv_args_t ra;
    cuda_attn_args_t aa;

    status = cuda_embed(b->d_emb, b->dt, p->d_tokens, nt, mc->dim, b->d_x,
                        b->stream);
    if (status != BT_OK)
        return status;

    memset(&ra, 0, sizeof(ra));
    ra.n_tokens = nt;
    ra.n_heads = mc->n_heads;
    ra.n_kv_heads = mc->n_kv_heads;
    ra.head_dim = mc->head_dim;
    ra.rope_half = mc->rope_layout == MODEL_ROPE_HALF;
    ra.d_qkv = b->d_qkv;
    ra.d_inv_freq = b->d_inv_freq;
    ra.d_pos = p->d_pos;
    ra.d_slot = p->d_slot;
    ra.d_q = b->d_q;

    memset(&aa, 0, sizeof(aa));
    aa.n_heads = mc->n_heads;
    aa.n_kv_heads = mc->n_kv_heads;
    aa.head_dim = mc->head_dim;
    aa.block_size = b->kv.block_size;
    aa.scale = 1.0f / sqrtf((float)mc->head_dim);
    aa.d_q = b->d_q;
    aa.d_block_tables = p->d_bt;
    aa.d_masks = b->d_mask;
    aa.d_kv_len = p->d_kv_len;
    aa.d_bt_off = p->d_bt_off;
    aa.d_ctx_len = p->d_ctx;
    aa.d_mask_off = p->d_mask_off;
    aa.d_out = b->d_att;

    /* Decode steps of <= 2 tokens in bf16 with the streaming GEMV
     * (BT_GEMV_KERNEL=stream, not the default: see kernels/gemv.cu):
     * RMSNorm inside the GEMV that consumes it (one kernel less per norm). */
    const bool fuse_norm = b->dt == CUDA_DT_BF16 &&
                           worker_gemm_gemv_enabled(b->gemm) &&
                           cuda_gemv_norm_ok(nt, mc->dim);

    for (int l = 0; l < mc->n_layers; l++) {
        const cuda_layer_t *w = &b->layers[l];
        void *d_kl = (char *)b->d_k + (size_t)l * layer_kv * es;
        void *d_vl = (char *)b->d_v + (size_t)l * layer_kv * es;

        if (fuse_norm) {
            status = cuda_gemv_norm(nt, b->qkv_dim, mc->dim, b->d_x,
                                    w->d_attn_norm, mc->rms_eps, w->d_wqkv,
                                    b->d_qkv, b->dt, b->stream);
        } else {
            status = cuda_rmsnorm(b->d_x, NULL, w->d_attn_norm, NULL, nt,
                                  mc->dim, mc->rms_eps, b->d_xn, b->dt,
                                  b->stream);
            if (status != BT_OK)
                return status;
            status = worker_gemm(b->gemm, nt, b->qkv_dim, mc->dim, b->d_xn,
                                 w->d_wqkv, b->dt, b->d_qkv, b->dt, false,
                                 b->stream);
        }
        if (status != BT_OK)
            return status;
        ra.d_bias = w->d_bqkv;
        ra.d_k_cache = d_kl;
        ra.d_v_cache = d_vl;
        status = cuda_rope_kv(&ra, b->dt, b->stream);
        if (status != BT_OK)
            return status;
        if (p->batch && p->batch->on_layer_done) {
            status = BT_CUDA_STATUS(cudaEventRecord(b->layer_ev[l],
                                                    b->stream));
            if (status != BT_OK)
                return status;
        }
        aa.d_k_cache = d_kl;
        aa.d_v_cache = d_vl;
        status = cuda_attn_decode(&aa, p->d_gen, p->n_gen, p->n_splits,
                                  p->split_len, b->d_ws, b->dt, b->stream);
        if (status != BT_OK)
            return status;
        status = cuda_attn_prefill(&aa, p->d_tiles, p->n_tiles, b->dt,
                                   b->stream);
        if (status != BT_OK)
            return status;
        status = worker_gemm(b->gemm, nt, mc->dim, b->q_dim, b->d_att,
                             w->d_wo, b->dt, b->d_x, CUDA_DT_F32, true,
                             b->stream);
        if (status != BT_OK)
            return status;
        if (fuse_norm) {
            status = cuda_gemv_norm(nt, 2 * mc->hidden_dim, mc->dim, b->d_x,
                                    w->d_ffn_norm, mc->rms_eps, w->d_wgu,
                                    b->d_gu, b->dt, b->stream);
        } else {
            status = cuda_rmsnorm(b->d_x, NULL, w->d_ffn_norm, NULL, nt,
                                  mc->dim, mc->rms_eps, b->d_xn, b->dt,
                                  b->stream);
            if (status != BT_OK)
                return status;
            status = worker_gemm(b->gemm, nt, 2 * mc->hidden_dim, mc->dim,
                                 b->d_xn, w->d_wgu, b->dt, b->d_gu, b->dt,
                                 false, b->stream);
        }
        if (status != BT_OK)
            return status;
        status = cuda_swiglu(b->d_gu, nt, mc->hidden_dim, b->d_h, b->dt,
                             b->stream);
        if (status != BT_OK)
            return status;
        status = worker_gemm(b->gemm, nt, mc->dim, mc->hidden_dim, b->d_h,
                             w->d_wdown, b->dt, b->d_x, CUDA_DT_F32, true,
                             b->stream);
        if (status != BT_OK)
            return status;
        if (p->batch && p->batch->on_layer_done) {
            /* Layer l's K/V are written once its event fires; the GPU
             * keeps working on the rest of layer l meanwhile. */
            status = BT_CUDA_STATUS(cudaEventSynchronize(b->layer_ev[l]));
            if (status != BT_OK)
                return status;
            p->batch->on_layer_done(p->batch->on_layer_arg, l);
        }
    }

    for (int r0 = 0; r0 < p->n_rows; r0 += b->row_cap) {
        int n = BT_MIN(b->row_cap, p->n_rows - r0);

        status = cuda_enqueue_rows(b, p, r0, n);
        if (status != BT_OK)
            return status;
        if (p->h_logits) {
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                p->h_logits + (size_t)r0 * mc->vocab_size, b->d_logits,
                (size_t)n * mc->vocab_size * sizeof(float),
                cudaMemcpyDeviceToHost, b->stream));
            if (status != BT_OK)
                return status;
        }
        if (p->h_hidden) {
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                p->h_hidden + (size_t)r0 * mc->dim, b->d_hidden,
                (size_t)n * mc->dim * sizeof(float), cudaMemcpyDeviceToHost,
                b->stream));
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
}

/* Finds or captures the graph for this decode plan. */
static bt_status_t cuda_graph_get(cuda_backend_t *b, const cuda_plan_t *p,
                                  cudaGraphExec_t *exec_p)
{
    cuda_graph_t *g;
    cudaGraph_t graph = NULL;
    bt_status_t status, st2;

    for (int i = 0; i < b->n_graphs; i++) {
        g = &b->graphs[i];
        if (g->bucket == p->nt && g->n_splits == p->n_splits &&
            g->split_len == p->split_len && g->hidden == p->want_hidden) {
            *exec_p = g->exec;
            return BT_OK;
        }
    }
    if (b->n_graphs == CUDA_MAX_GRAPHS) {
        cudaGraphExecDestroy(b->graphs[0].exec);
        memmove(&b->graphs[0], &b->graphs[1],
                (CUDA_MAX_GRAPHS - 1) * sizeof(b->graphs[0]));
        b->n_graphs--;
    }
    g = &b->graphs[b->n_graphs];
    memset(g, 0, sizeof(*g));
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        b->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        return status;
    status = cuda_enqueue(b, p);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(b->stream, &graph));
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
    b->n_graphs++;
    BT_LOG_DEBUG("CUDA", "captured decode graph: bucket %d, %d splits of %d",
                 p->nt, p->n_splits, p->split_len);
    *exec_p = g->exec;
out:
    if (graph)
        cudaGraphDestroy(graph);
    return status;
}

static bt_status_t cuda_forward(void *impl, const backend_batch_t *batch,
                                float *logits, float *hidden)
{
    cuda_backend_t *b = impl;
    const int bs = b->kv.block_size;
    const bool bf16_tiles = cuda_attn_prefill_ok(b->mc.head_dim, b->dt);
    int nt = 0, n_rows = 0, n_gen = 0, n_tiles = 0, max_kv = 1, nt_pad;
    size_t bt_total = 0, mask_total = 0, ints, off;
    bool graph = b->use_graphs && batch->on_layer_done == NULL;
    int *h;
    int *tok, *pos, *slot, *kvl, *bto, *ctxa, *mo, *gen, *rows, *tiles, *bt;
    size_t mask_at = 0, bt_at = 0;
    cuda_plan_t p;
    bt_status_t status;

    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *sq = &batch->seqs[s];
        nt += sq->n_tokens;
        n_rows += sq->n_logits;
        bt_total += BT_DIV_UP(sq->ctx_len + sq->n_tokens, bs);
        if (sq->mask)
            mask_total += (size_t)sq->n_tokens * sq->n_tokens;
        if (sq->n_tokens != 1)
            graph = false;
        if (bf16_tiles && sq->n_tokens >= CUDA_PREFILL_MIN)
            n_tiles += (int)BT_DIV_UP(sq->n_tokens, CUDA_PREFILL_BQ);
    }
    if (nt > b->max_tok)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "batch of %d tokens exceeds the backend's %d", nt,
                        b->max_tok);
    nt_pad = graph ? cuda_pow2_ceil(nt) : nt;
    if (nt_pad > b->bucket_max)
        graph = false, nt_pad = nt;
    /* Graph steps compute a logits row for every (padded) token. */
    int rows_c = graph ? nt_pad : n_rows;
    ints = (size_t)7 * nt_pad + nt_pad + rows_c +
           (size_t)n_tiles * CUDA_PREFILL_TILE_INTS + bt_total;
    status = cuda_meta_reserve(b, ints, BT_MAX(mask_total, (size_t)1));
    if (status != BT_OK)
        return status;

    h = b->h_meta;
    off = 0;
    tok = h + off, off += nt_pad;
    pos = h + off, off += nt_pad;
    slot = h + off, off += nt_pad;
    kvl = h + off, off += nt_pad;
    bto = h + off, off += nt_pad;
    ctxa = h + off, off += nt_pad;
    mo = h + off, off += nt_pad;
    gen = h + off, off += nt_pad;
    rows = h + off, off += rows_c;
    tiles = h + off, off += (size_t)n_tiles * CUDA_PREFILL_TILE_INTS;
    bt = h + off;

    int t = 0, r = 0, ti = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *sq = &batch->seqs[s];
        int n = sq->n_tokens, ctx = sq->ctx_len;
        int nb = (int)BT_DIV_UP(ctx + n, bs);
        bool tiled = bf16_tiles && n >= CUDA_PREFILL_MIN;
        int moff = -1;

        memcpy(bt + bt_at, sq->block_table, sizeof(int) * nb);
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

    memset(&p, 0, sizeof(p));
    p.nt = nt_pad;
    p.n_rows = rows_c;
    p.n_gen = n_gen;
    p.n_tiles = n_tiles;
    p.want_hidden = hidden != NULL;
    {
        int max_splits = (int)BT_MIN(
            (size_t)CUDA_MAX_SPLITS,
            b->ws_floats / ((size_t)BT_MAX(n_gen, 1) * b->mc.n_heads *
                            (b->mc.head_dim + 2)));
        if (max_splits < 1)
            max_splits = 1;
        cuda_attn_decode_plan(BT_MAX(n_gen, 1), max_kv, b->mc.n_heads,
                              b->mc.n_kv_heads, b->n_sm, max_splits,
                              &p.n_splits, &p.split_len);
        if (graph && p.n_splits > 1) {
            /* Round splits up to a power of two so few graphs cover every
             * context length (the extra splits find no keys). */
            int ns = cuda_pow2_ceil(p.n_splits);
            if (ns <= max_splits)
                p.n_splits = ns;
        }
    }
    {
        const int *d = b->d_meta;
        size_t o = 0;
        p.d_tokens = d + o, o += nt_pad;
        p.d_pos = d + o, o += nt_pad;
        p.d_slot = d + o, o += nt_pad;
        p.d_kv_len = d + o, o += nt_pad;
        p.d_bt_off = d + o, o += nt_pad;
        p.d_ctx = d + o, o += nt_pad;
        p.d_mask_off = d + o, o += nt_pad;
        p.d_gen = d + o, o += nt_pad;
        p.d_rows = d + o, o += rows_c;
        p.d_tiles = d + o, o += (size_t)n_tiles * CUDA_PREFILL_TILE_INTS;
        p.d_bt = d + o;
    }
    p.batch = graph ? NULL : batch;

    status = BT_CUDA_STATUS(cudaMemcpyAsync(b->d_meta, b->h_meta,
                                            (off + bt_total) * sizeof(int),
                                            cudaMemcpyHostToDevice,
                                            b->stream));
    if (status != BT_OK)
        return status;
    if (mask_total) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(b->d_mask, b->h_mask,
                                                mask_total,
                                                cudaMemcpyHostToDevice,
                                                b->stream));
        if (status != BT_OK)
            return status;
    }

    if (graph) {
        cudaGraphExec_t exec;
        int row = 0;

        status = cuda_graph_get(b, &p, &exec);
        if (status != BT_OK)
            return status;
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, b->stream));
        if (status != BT_OK)
            return status;
        /* Copy back the rows of tokens that asked for logits, in runs. */
        for (int s = 0; s < batch->n_seqs && logits; ) {
            int s1 = s;
            while (s1 < batch->n_seqs && batch->seqs[s1].n_logits == 1)
                s1++;
            if (s1 > s) {
                status = BT_CUDA_STATUS(cudaMemcpyAsync(
                    logits + (size_t)row * b->mc.vocab_size,
                    b->d_logits + (size_t)s * b->mc.vocab_size,
                    (size_t)(s1 - s) * b->mc.vocab_size * sizeof(float),
                    cudaMemcpyDeviceToHost, b->stream));
                if (status != BT_OK)
                    return status;
                if (hidden) {
                    status = BT_CUDA_STATUS(cudaMemcpyAsync(
                        hidden + (size_t)row * b->mc.dim,
                        b->d_hidden + (size_t)s * b->mc.dim,
                        (size_t)(s1 - s) * b->mc.dim * sizeof(float),
                        cudaMemcpyDeviceToHost, b->stream));
                    if (status != BT_OK)
                        return status;
                }
                row += s1 - s;
                s = s1;
            } else {
                s++;
            }
        }
    } else {
        p.h_logits = logits; /* NULL: logits stay on the device */
        p.h_hidden = hidden;
        status = cuda_enqueue(b, &p);
        if (status != BT_OK) {
            (void)cudaStreamSynchronize(b->stream);
            return status;
        }
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(b->stream));
}

// ---------------------------------------------------------------------
// KV pool access

static void *cuda_kv_data(void *impl, int layer, int kv)
{
    cuda_backend_t *b = impl;
    size_t bytes = cuda_layer_kv_elems(b) * b->kv.elem_size;

    return (char *)(kv ? b->d_v : b->d_k) + (size_t)layer * bytes;
}

static bt_status_t cuda_kv_copy_block(void *impl, int src_block,
                                      int dst_block)
{
    cuda_backend_t *b = impl;
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status;

    if (src_block == dst_block)
        return BT_OK;
    for (int l = 0; l < b->kv.n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            char *base = cuda_kv_data(b, l, kv);
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                base + (size_t)dst_block * blk, base + (size_t)src_block * blk,
                blk, cudaMemcpyDeviceToDevice, b->stream));
            if (status != BT_OK)
                return status;
        }
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(b->stream));
}

/* backend_kv_copy_slots: slots up through the metadata buffer (free
 * between forwards), one kernel for K and V of every layer. */
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
    status = BT_CUDA_STATUS(cudaMemcpyAsync(b->d_meta, b->h_meta,
                                            2 * (size_t)n * sizeof(int),
                                            cudaMemcpyHostToDevice,
                                            b->stream));
    if (status == BT_OK)
        status = cuda_kv_copy_slots(
            b->d_k, b->d_v, b->kv.n_layers,
            cuda_layer_kv_elems(b) * b->kv.elem_size,
            (size_t)b->kv_dim * b->kv.elem_size, b->d_meta, b->d_meta + n,
            n, b->stream);
    if (status != BT_OK) {
        (void)cudaStreamSynchronize(b->stream);
        return status;
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(b->stream));
}

static const kv_layout_t *cuda_kv_layout(void *impl)
{
    return &((cuda_backend_t *)impl)->kv;
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
};
