/*
 * cuda_draft.c - the EAGLE draft head on the GPU (see cuda_draft.h).
 *
 * One forward over rows r (chunks of CUDA_DRAFT_CHUNK, in order):
 *   feature x_f[r]  = store row, or rmsnorm(hidden) * final_norm
 *   x_e[r]          = embedding[token[r]]
 *   h  = fc_b + x_e . Wfe^T + x_f . Wff^T       (fc split by input half)
 *   q|k|v = h . Wqkv^T; RoPE (half-split) on q, k; k, v -> head KV slot
 *   h += o_proj(paged attention with the row's ctx / mask)
 *   h += down(silu(gate(n)) * up(n)), n = rmsnorm(h) * post_norm
 *   store[out[r]] = h;  logits = h . cls^T -> top-k on the device
 * with the backend's kernels (embed-style gathers, cuBLASLt worker_gemm,
 * rope_kv, attn_decode, rmsnorm, swiglu) and kernels/draft.cu.  h (the
 * residual stream) is f32; GEMM inputs are in the activation dtype.
 */
#include "cuda_draft.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "cuda_switches.h"
#include "bt_util.h"
#include "cuda_int.h"
#include "gemm.h"
#include "kernels/attn_decode.h"
#include "kernels/convert.h"
#include "kernels/draft.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_kv.h"
#include "kernels/sample.h"
#include "kernels/swiglu.h"

#define CUDA_DRAFT_CHUNK 256       /* rows per pass */
#define CUDA_DRAFT_BLOCK 16        /* head KV block size */
#define CUDA_DRAFT_SPLITS 16       /* attention key splits, at most */
#define CUDA_DRAFT_LOGIT_ROWS 256  /* classifier rows per pass */
#define CUDA_DRAFT_STAGE (64u << 20) /* f32 staging for uploads, bytes */
#define CUDA_DRAFT_META 10         /* ints per row in the metadata (9 row
                                      arrays + the stash gather) */
#define CUDA_DRAFT_GRAPHS 64       /* captured passes kept */
#define CUDA_DRAFT_TREE_DEPTH 16   /* deepest device-loop tree */
#define CUDA_DRAFT_TREE_GRAPHS 16  /* captured device-loop trees kept */

/* The stages BT_DRAFT_PROFILE times (event i + 1 minus event i). */
#define DRAFT_PROF_N 14
static const char *const draft_prof_names[DRAFT_PROF_N - 1] = {
    "features (norm, gathers, bias)", "fc (2 GEMMs)", "convert + qkv",
    "rope + kv", "attention", "o_proj", "post norm", "gate/up",
    "swiglu", "down", "convert + store", "classifier", "top-k",
};
#define DRAFT_PROF(d, i)                                                    \
    do {                                                                    \
        if ((d)->prof_on)                                                   \
            (void)cudaEventRecord((d)->prof_ev[i], (d)->stream);            \
    } while (0)

/* What a captured pass depends on besides the fixed buffers. */
typedef struct {
    int n;                    /* rows */
    int n_hidden;             /* target feature rows to normalise */
    int stash;                /* 1: they are stashed rows (d_pend) */
    int k;                    /* top-k (0: no classifier) */
    int n_splits;             /* attention plan */
    int split_len;
} draft_key_t;

typedef struct {
    draft_key_t key;
    cudaGraphExec_t exec;
} draft_graph_t;

/* What a captured device-loop tree depends on besides the fixed buffers
 * (cuda_draft_tree): the shape and every level's attention plan (the
 * plan of the level's longest row, as draft_pass picks it). */
typedef struct {
    int n;                    /* sequences */
    int depth;
    int k;
    int n_splits[CUDA_DRAFT_TREE_DEPTH]; /* [lv] for levels 1..depth-1 */
    int split_len[CUDA_DRAFT_TREE_DEPTH];
} draft_tree_key_t;

typedef struct {
    draft_tree_key_t key;
    cudaGraphExec_t exec;
} draft_tree_graph_t;

struct cuda_draft_s {
    cuda_draft_config_t cfg;
    cuda_dtype_t dt;
    int dim, nh, nkv, hd, hid, vocab;
    int q_dim, kv_dim, qkv_dim;
    float eps;
    int n_sm;
    int attn_bps;             /* decode attention blocks an SM at once */
    int nb_per;               /* head KV blocks per state */
    cudaStream_t stream;
    worker_gemm_ctx_t *gemm;

    /* weights (activation dtype unless noted) */
    void *d_fce;              /* (dim, dim) fc columns of the embedding */
    void *d_fcf;              /* (dim, dim) fc columns of the feature */
    float *d_fcb;             /* (dim) f32 */
    void *d_wqkv;             /* (q_dim + 2 kv_dim, dim) */
    void *d_wo;               /* (dim, q_dim) */
    void *d_post_norm;        /* (dim) */
    void *d_wgu;              /* (2 hid, dim) gate rows, then up rows */
    void *d_wdown;            /* (dim, hid) */
    void *d_emb;              /* (vocab, dim) */
    void *d_cls;              /* (vocab, dim), may alias d_emb */
    void *d_final_norm;       /* (dim) */
    float *d_inv_freq;        /* (hd / 2) f32 */

    /* state */
    void *d_kc;               /* (n_states * nb_per * BLOCK, kv_dim) */
    void *d_vc;
    int *d_bt;                /* (n_states * nb_per) identity table */
    void *d_store;            /* (n_states * store_rows, dim) */
    float *d_pend;            /* (n_states * pend_rows, dim) f32 stashed
                                 target rows (cuda_draft_stash) */
    int *h_stash;             /* pinned (2 * stash_cap) */
    int *d_stash;
    int stash_cap;

    /* activations for CUDA_DRAFT_CHUNK rows */
    float *d_hid;             /* (chunk, dim) f32 uploaded hidden rows */
    void *d_hfeat;            /* (chunk, dim) normalised hidden rows */
    void *d_xe;               /* (chunk, dim) */
    void *d_xf;               /* (chunk, dim) */
    float *d_h;               /* (chunk, dim) f32 residual */
    void *d_hx;               /* (chunk, dim) residual in dt */
    void *d_qkv;              /* (chunk, qkv_dim) */
    void *d_q;                /* (chunk, q_dim) */
    void *d_att;              /* (chunk, q_dim) */
    void *d_xn;               /* (chunk, dim) */
    void *d_gu;               /* (chunk, 2 hid) */
    void *d_hh;               /* (chunk, hid) */
    float *d_ws;              /* attention split partials */
    size_t ws_floats;
    float *d_logits;          /* (LOGIT_ROWS, vocab) f32 */
    int *d_top_ids;           /* (chunk, TOPK_MAX) */
    float *d_topk_ws;         /* cuda_topk_logprob scratch for a chunk */
    float *d_top_logp;        /* (chunk, TOPK_MAX) */

    int *h_meta;              /* pinned (chunk * META) */
    int *d_meta;
    uint8_t *h_mask;          /* pinned, mask_cap bytes */
    uint8_t *d_mask;
    size_t mask_cap;
    size_t dev_bytes;

    bool use_graphs;          /* BT_DRAFT_GRAPHS != 0 and no failure */
    draft_graph_t graphs[CUDA_DRAFT_GRAPHS];
    int n_graphs;
    draft_key_t seen[CUDA_DRAFT_GRAPHS]; /* keys run once eagerly */
    int n_seen;
    uint64_t n_replay;        /* passes replayed from a graph */
    uint64_t n_capture;       /* passes captured (then replayed) */
    uint64_t n_eager;         /* passes launched kernel by kernel */
    cudaEvent_t ev_pass[2];   /* around a pass's device work */
    uint64_t gpu_ns;          /* their elapsed time, summed */
    /* BT_DRAFT_PROFILE=1: passes run eagerly with an event between the
     * stages of draft_enqueue; the sums are printed at destroy */
    bool prof;
    bool prof_on;             /* this pass records them */
    cudaEvent_t prof_ev[DRAFT_PROF_N];
    double prof_ms[DRAFT_PROF_N];
    uint64_t prof_passes, prof_rows;

    /* the device draft loop (cuda_draft_tree) */
    cuda_tree_seq_t *d_tseq;  /* (tree_seqs) */
    cuda_tree_seq_t *h_tseq;  /* pinned (tree_seqs) */
    int *d_l1;                /* (tree_seqs * TOPK_MAX) level-1 ids, then
                                 as many f32 log-probs */
    int *h_l1;                /* pinned, same layout */
    void *d_tnodes;           /* (tree_nodes) spec_node_t */
    spec_node_t *h_tnodes;    /* pinned (tree_nodes) */
    int *d_torder;            /* (tree_nodes) selection order */
    int *h_torder;            /* pinned (tree_nodes) */
    int tree_seqs;            /* capacities */
    size_t tree_nodes;
    draft_tree_graph_t tgraphs[CUDA_DRAFT_TREE_GRAPHS]; /* LRU last */
    int n_tgraphs;
    draft_tree_key_t tseen[CUDA_DRAFT_TREE_GRAPHS]; /* keys run eagerly */
    int n_tseen;
};

// ---------------------------------------------------------------------
// create / destroy

static bt_status_t draft_alloc(cuda_draft_t *d, void **p, size_t bytes,
                               const char *name)
{
    bt_status_t status = cuda__dev_malloc(p, bytes, name);

    if (status == BT_OK)
        d->dev_bytes += bytes;
    return status;
}

/* Device copy in the activation dtype of n host floats. */
static bt_status_t draft_upload(cuda_draft_t *d, const float *h, size_t n,
                                float *d_stage, void **d_p, const char *name)
{
    size_t es = cuda_dtype_size(d->dt), chunk = CUDA_DRAFT_STAGE / 4;
    bt_status_t status;

    status = draft_alloc(d, d_p, n * es, name);
    if (status != BT_OK)
        return status;
    /* stream-ordered copies: a pageable cudaMemcpy may return before its
     * DMA lands, and d->stream does not wait for the legacy stream */
    if (d->dt == CUDA_DT_F32) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(*d_p, h, n * 4,
                                                cudaMemcpyHostToDevice,
                                                d->stream));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
        return status;
    }
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = BT_MIN(chunk, n - off);

        status = BT_CUDA_STATUS(cudaMemcpyAsync(d_stage, h + off, m * 4,
                                                cudaMemcpyHostToDevice,
                                                d->stream));
        if (status == BT_OK)
            status = cuda_convert(d_stage, CUDA_SRC_F32, m,
                                  (char *)*d_p + off * es, d->dt,
                                  d->stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

static bt_status_t draft_weights(cuda_draft_t *d, const spec_head_t *head)
{
    spec_head_weights_t *w = (spec_head_weights_t *)spec_head_weights(
        (spec_head_t *)head);
    size_t dd = (size_t)d->dim * d->dim;
    float *split = NULL, *d_stage = NULL;
    bt_status_t status;

    status = cuda__dev_malloc((void **)&d_stage, CUDA_DRAFT_STAGE,
                              "draft_stage");
    if (status != BT_OK)
        return status;
    split = bt_malloc(2 * dd * sizeof(float), "cuda_draft");
    if (split == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    /* fc (dim, 2 dim) = [Wfe | Wff] by input half */
    for (int r = 0; r < d->dim; r++) {
        memcpy(split + (size_t)r * d->dim, w->fc_w + (size_t)r * 2 * d->dim,
               sizeof(float) * d->dim);
        memcpy(split + dd + (size_t)r * d->dim,
               w->fc_w + (size_t)r * 2 * d->dim + d->dim,
               sizeof(float) * d->dim);
    }
    BT_CHECK_GOTO(draft_upload(d, split, dd, d_stage, &d->d_fce, "draft_fc"),
                  status, out);
    BT_CHECK_GOTO(draft_upload(d, split + dd, dd, d_stage, &d->d_fcf,
                               "draft_fc"), status, out);
    BT_CHECK_GOTO(draft_alloc(d, (void **)&d->d_fcb, sizeof(float) * d->dim,
                              "draft_fc_bias"), status, out);
    BT_CUDA_CHECK_GOTO(cudaMemcpyAsync(d->d_fcb, w->fc_b,
                                       sizeof(float) * d->dim,
                                       cudaMemcpyHostToDevice, d->stream),
                       status, out);
    /* wq, wk, wv and w_gate, w_up are adjacent in the flat parameters */
    BT_ASSERT(w->wk == w->wq + (size_t)d->q_dim * d->dim &&
              w->wv == w->wk + (size_t)d->kv_dim * d->dim &&
              w->w_up == w->w_gate + (size_t)d->hid * d->dim);
    BT_CHECK_GOTO(draft_upload(d, w->wq, (size_t)d->qkv_dim * d->dim,
                               d_stage, &d->d_wqkv, "draft_wqkv"),
                  status, out);
    BT_CHECK_GOTO(draft_upload(d, w->wo, (size_t)d->dim * d->q_dim, d_stage,
                               &d->d_wo, "draft_wo"), status, out);
    BT_CHECK_GOTO(draft_upload(d, w->post_norm, (size_t)d->dim, d_stage,
                               &d->d_post_norm, "draft_norm"), status, out);
    BT_CHECK_GOTO(draft_upload(d, w->w_gate, (size_t)2 * d->hid * d->dim,
                               d_stage, &d->d_wgu, "draft_wgu"), status, out);
    BT_CHECK_GOTO(draft_upload(d, w->w_down, (size_t)d->dim * d->hid,
                               d_stage, &d->d_wdown, "draft_wdown"),
                  status, out);
    BT_CHECK_GOTO(draft_upload(d, spec_head_embedding(head),
                               (size_t)d->vocab * d->dim, d_stage,
                               &d->d_emb, "draft_embedding"), status, out);
    if (spec_head_classifier(head) == spec_head_embedding(head))
        d->d_cls = d->d_emb;
    else
        BT_CHECK_GOTO(draft_upload(d, spec_head_classifier(head),
                                   (size_t)d->vocab * d->dim, d_stage,
                                   &d->d_cls, "draft_classifier"),
                      status, out);
    BT_CHECK_GOTO(draft_upload(d, spec_head_final_norm(head),
                               (size_t)d->dim, d_stage, &d->d_final_norm,
                               "draft_final_norm"), status, out);
    BT_CHECK_GOTO(draft_alloc(d, (void **)&d->d_inv_freq,
                              sizeof(float) * (d->hd / 2), "draft_rope"),
                  status, out);
    BT_CUDA_CHECK_GOTO(cudaMemcpyAsync(d->d_inv_freq,
                                       spec_head_inv_freq(head),
                                       sizeof(float) * (d->hd / 2),
                                       cudaMemcpyHostToDevice, d->stream),
                       status, out);
    BT_CUDA_CHECK_GOTO(cudaStreamSynchronize(d->stream), status, out);

out:
    bt_free(split);
    cuda__dev_free((void **)&d_stage);
    return status;
}

static bt_status_t draft_mask_reserve(cuda_draft_t *d, size_t bytes);
static void draft_graphs_drop(cuda_draft_t *d);
static void draft_tree_free(cuda_draft_t *d);

bt_status_t cuda_draft_create(const spec_head_t *head,
                              const cuda_draft_config_t *cfg,
                              cuda_draft_t **draft_p)
{
    const model_config_t *mc = spec_head_config(head);
    size_t es, ch = CUDA_DRAFT_CHUNK;
    cuda_draft_t *d;
    int *bt = NULL;
    bt_status_t status;

    if (cfg->n_states <= 0 || cfg->state_slots <= 0 ||
        cfg->store_rows <= 0 || cfg->pend_rows < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft sizes must be positive (states %d, "
                        "slots %d, store rows %d, stash rows %d)",
                        cfg->n_states, cfg->state_slots, cfg->store_rows,
                        cfg->pend_rows);
    if (!cuda_attn_head_dim_ok(mc->head_dim) ||
        mc->n_heads % mc->n_kv_heads != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "SPEC",
                        "draft head: head_dim %d is not supported by the "
                        "CUDA kernels", mc->head_dim);
    d = bt_calloc(1, sizeof(*d), "cuda_draft");
    if (d == NULL)
        return BT_ERR_NO_MEMORY;
    d->cfg = *cfg;
    d->dt = cfg->bf16 ? CUDA_DT_BF16 : CUDA_DT_F32;
    es = cuda_dtype_size(d->dt);
    d->dim = mc->dim;
    d->nh = mc->n_heads;
    d->nkv = mc->n_kv_heads;
    d->hd = mc->head_dim;
    d->hid = spec_head_hidden_dim(head);
    d->vocab = mc->vocab_size;
    d->q_dim = d->nh * d->hd;
    d->kv_dim = d->nkv * d->hd;
    d->qkv_dim = d->q_dim + 2 * d->kv_dim;
    d->eps = mc->rms_eps;
    d->nb_per = (int)BT_DIV_UP(cfg->state_slots, CUDA_DRAFT_BLOCK);

    BT_CUDA_CHECK_GOTO(cudaSetDevice(cfg->device_index), status, err);
    BT_CUDA_CHECK_GOTO(cudaDeviceGetAttribute(
                           &d->n_sm, cudaDevAttrMultiProcessorCount,
                           cfg->device_index), status, err);
    d->attn_bps =
        cuda_attn_decode_blocks_per_sm(d->hd, false, d->nh / d->nkv);
    BT_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&d->stream,
                                                 cudaStreamNonBlocking),
                       status, err);
    BT_CHECK_GOTO(worker_gemm_ctx_create(32u << 20, &d->gemm), status, err);
    for (int i = 0; i < 2; i++)
        BT_CUDA_CHECK_GOTO(cudaEventCreate(&d->ev_pass[i]), status, err);
    {
        const char *env = cuda_switches()->draft_profile;

        d->prof = env != NULL && strcmp(env, "1") == 0;
        for (int i = 0; d->prof && i < DRAFT_PROF_N; i++)
            BT_CUDA_CHECK_GOTO(cudaEventCreate(&d->prof_ev[i]), status,
                               err);
    }
    BT_CHECK_GOTO(draft_weights(d, head), status, err);

    {
        size_t slots = (size_t)cfg->n_states * d->nb_per * CUDA_DRAFT_BLOCK;
        int n_bt = cfg->n_states * d->nb_per;

        BT_CHECK_GOTO(draft_alloc(d, &d->d_kc, slots * d->kv_dim * es,
                                  "draft_kv_k"), status, err);
        BT_CHECK_GOTO(draft_alloc(d, &d->d_vc, slots * d->kv_dim * es,
                                  "draft_kv_v"), status, err);
        BT_CUDA_CHECK_GOTO(cudaMemsetAsync(d->d_kc, 0,
                                           slots * d->kv_dim * es,
                                           d->stream), status, err);
        BT_CUDA_CHECK_GOTO(cudaMemsetAsync(d->d_vc, 0,
                                           slots * d->kv_dim * es,
                                           d->stream), status, err);
        BT_CHECK_GOTO(draft_alloc(d, (void **)&d->d_bt,
                                  sizeof(int) * (size_t)n_bt, "draft_bt"),
                      status, err);
        bt = bt_malloc(sizeof(int) * (size_t)n_bt, "cuda_draft");
        if (bt == NULL) {
            status = BT_ERR_NO_MEMORY;
            goto err;
        }
        for (int i = 0; i < n_bt; i++)
            bt[i] = i;
        BT_CUDA_CHECK_GOTO(cudaMemcpyAsync(d->d_bt, bt, sizeof(int) * n_bt,
                                           cudaMemcpyHostToDevice,
                                           d->stream), status, err);
        BT_CHECK_GOTO(draft_alloc(d, &d->d_store,
                                  (size_t)cfg->n_states * cfg->store_rows *
                                      d->dim * es, "draft_store"),
                      status, err);
        BT_CUDA_CHECK_GOTO(cudaMemsetAsync(d->d_store, 0,
                                      (size_t)cfg->n_states *
                                          cfg->store_rows * d->dim * es,
                                           d->stream),
                           status, err);
        if (cfg->pend_rows > 0)
            BT_CHECK_GOTO(draft_alloc(d, (void **)&d->d_pend,
                                      (size_t)cfg->n_states *
                                          cfg->pend_rows * d->dim * 4,
                                      "draft_stash"), status, err);
    }
#define DRAFT_ACT(_p, _bytes, _name)                                        \
    BT_CHECK_GOTO(draft_alloc(d, (void **)&(_p), (_bytes), _name), status,  \
                  err)
    DRAFT_ACT(d->d_hid, ch * d->dim * 4, "draft_hidden");
    DRAFT_ACT(d->d_hfeat, ch * d->dim * es, "draft_act");
    DRAFT_ACT(d->d_xe, ch * d->dim * es, "draft_act");
    DRAFT_ACT(d->d_xf, ch * d->dim * es, "draft_act");
    DRAFT_ACT(d->d_h, ch * d->dim * 4, "draft_act");
    DRAFT_ACT(d->d_hx, ch * d->dim * es, "draft_act");
    DRAFT_ACT(d->d_qkv, ch * d->qkv_dim * es, "draft_act");
    DRAFT_ACT(d->d_q, ch * d->q_dim * es, "draft_act");
    DRAFT_ACT(d->d_att, ch * d->q_dim * es, "draft_act");
    DRAFT_ACT(d->d_xn, ch * d->dim * es, "draft_act");
    DRAFT_ACT(d->d_gu, ch * 2 * d->hid * es, "draft_act");
    DRAFT_ACT(d->d_hh, ch * d->hid * es, "draft_act");
    d->ws_floats = cuda_attn_decode_ws_floats((int)ch, d->nh, d->hd,
                                              CUDA_DRAFT_SPLITS);
    DRAFT_ACT(d->d_ws, d->ws_floats * 4, "draft_attn_ws");
    DRAFT_ACT(d->d_logits, (size_t)CUDA_DRAFT_LOGIT_ROWS * d->vocab * 4,
              "draft_logits");
    DRAFT_ACT(d->d_top_ids, ch * CUDA_DRAFT_TOPK_MAX * sizeof(int),
              "draft_topk");
    DRAFT_ACT(d->d_topk_ws,
              cuda_topk_logprob_ws_floats((int)BT_MAX(ch,
                                              CUDA_DRAFT_LOGIT_ROWS),
                                          d->vocab, CUDA_DRAFT_TOPK_MAX) *
                  sizeof(float), "draft_topk");
    DRAFT_ACT(d->d_top_logp, ch * CUDA_DRAFT_TOPK_MAX * sizeof(float),
              "draft_topk");
    DRAFT_ACT(d->d_meta, ch * CUDA_DRAFT_META * sizeof(int), "draft_meta");
#undef DRAFT_ACT
    BT_CUDA_CHECK_GOTO(cudaMallocHost((void **)&d->h_meta,
                                      ch * CUDA_DRAFT_META * sizeof(int)),
                       status, err);
    /* masks of a full pass of tree rows, so captured passes keep d_mask */
    BT_CHECK_GOTO(draft_mask_reserve(d, ch * (size_t)(cfg->store_rows +
                                                      CUDA_DRAFT_TOPK_MAX)),
                  status, err);
    {
        const char *env = cuda_switches()->draft_graphs;

        d->use_graphs = env == NULL || strcmp(env, "0") != 0;
    }
    bt_free(bt);
    bt = NULL;
    /* the bt copy and memsets above are stream-ordered: let them land */
    BT_CUDA_CHECK_GOTO(cudaStreamSynchronize(d->stream), status, err);
    BT_LOG_INFO("SPEC", "device draft head: %zu MiB on device (%s, %d "
                "states of %d slots)", d->dev_bytes >> 20,
                cfg->bf16 ? "bf16" : "f32", cfg->n_states, cfg->state_slots);
    *draft_p = d;
    return BT_OK;

err:
    bt_free(bt);
    cuda_draft_destroy(&d);
    return status;
}

void cuda_draft_destroy(cuda_draft_t **draft_p)
{
    cuda_draft_t *d = *draft_p;

    if (d == NULL)
        return;
    void **bufs[] = {
        &d->d_fce, &d->d_fcf, (void **)&d->d_fcb, &d->d_wqkv, &d->d_wo,
        &d->d_post_norm, &d->d_wgu, &d->d_wdown, &d->d_emb,
        &d->d_final_norm, (void **)&d->d_inv_freq, &d->d_kc, &d->d_vc,
        (void **)&d->d_bt, &d->d_store, (void **)&d->d_hid, &d->d_hfeat,
        &d->d_xe, &d->d_xf, (void **)&d->d_h, &d->d_hx, &d->d_qkv, &d->d_q,
        &d->d_att, &d->d_xn, &d->d_gu, &d->d_hh, (void **)&d->d_ws,
        (void **)&d->d_logits, (void **)&d->d_top_ids,
        (void **)&d->d_top_logp, (void **)&d->d_meta, (void **)&d->d_mask,
        (void **)&d->d_pend, (void **)&d->d_stash, (void **)&d->d_topk_ws,
    };

    (void)cudaSetDevice(d->cfg.device_index);
    if (d->stream)
        (void)cudaStreamSynchronize(d->stream);
    draft_graphs_drop(d);
    if (d->d_cls != d->d_emb)
        cuda__dev_free(&d->d_cls);
    d->d_cls = NULL;
    for (size_t i = 0; i < BT_ARRAY_SIZE(bufs); i++)
        cuda__dev_free(bufs[i]);
    if (d->h_meta)
        cudaFreeHost(d->h_meta);
    if (d->h_mask)
        cudaFreeHost(d->h_mask);
    if (d->h_stash)
        cudaFreeHost(d->h_stash);
    draft_tree_free(d);
    worker_gemm_ctx_destroy(&d->gemm);
    for (int i = 0; i < 2; i++)
        if (d->ev_pass[i])
            cudaEventDestroy(d->ev_pass[i]);
    if (d->prof && d->prof_passes > 0) {
        double tot = 0.0;

        fprintf(stderr, "device draft profile: %llu passes, %.1f rows a "
                "pass (eager)\n", (unsigned long long)d->prof_passes,
                (double)d->prof_rows / (double)d->prof_passes);
        for (int i = 0; i < DRAFT_PROF_N - 1; i++) {
            fprintf(stderr, "  %-32s %8.1f us a pass\n",
                    draft_prof_names[i],
                    d->prof_ms[i] * 1e3 / (double)d->prof_passes);
            tot += d->prof_ms[i];
        }
        fprintf(stderr, "  %-32s %8.1f us a pass\n", "total",
                tot * 1e3 / (double)d->prof_passes);
    }
    for (int i = 0; i < DRAFT_PROF_N; i++)
        if (d->prof_ev[i])
            cudaEventDestroy(d->prof_ev[i]);
    if (d->stream)
        cudaStreamDestroy(d->stream);
    bt_free(d);
    *draft_p = NULL;
}

size_t cuda_draft_device_bytes(const cuda_draft_t *draft)
{
    return draft->dev_bytes;
}

// ---------------------------------------------------------------------
// forward

static bt_status_t draft_mask_reserve(cuda_draft_t *d, size_t bytes)
{
    size_t cap;
    bt_status_t status;

    if (bytes <= d->mask_cap)
        return BT_OK;
    cap = BT_MAX(bytes, 2 * d->mask_cap);
    if (d->h_mask)
        cudaFreeHost(d->h_mask);
    d->h_mask = NULL;
    cuda__dev_free((void **)&d->d_mask);
    d->mask_cap = 0;
    status = BT_CUDA_STATUS(cudaMallocHost((void **)&d->h_mask, cap));
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&d->d_mask, cap, "draft_masks");
    if (status == BT_OK)
        d->mask_cap = cap;
    return status;
}

/* Classifier + top-k over n dt rows of d_x, in passes of LOGIT_ROWS;
 * results copied to the host (async, caller syncs). */
static bt_status_t draft_classify(cuda_draft_t *d, const void *d_x, int n,
                                  int k, int *top_ids, float *top_logp,
                                  float *h_logits)
{
    size_t es = cuda_dtype_size(d->dt);
    bt_status_t status = BT_OK;

    for (int r0 = 0; r0 < n; r0 += CUDA_DRAFT_LOGIT_ROWS) {
        int m = BT_MIN(CUDA_DRAFT_LOGIT_ROWS, n - r0);

        status = worker_gemm(d->gemm, m, d->vocab, d->dim,
                             (const char *)d_x + (size_t)r0 * d->dim * es,
                             d->d_cls, d->dt, d->d_logits, CUDA_DT_F32,
                             false, d->stream);
        if (status == BT_OK && k > 0)
            status = cuda_topk_logprob(d->d_logits, m, d->vocab, k,
                                       d->d_top_ids + (size_t)r0 * k,
                                       d->d_top_logp + (size_t)r0 * k,
                                       d->d_topk_ws, d->stream);
        if (status == BT_OK && h_logits)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                h_logits + (size_t)r0 * d->vocab, d->d_logits,
                (size_t)m * d->vocab * sizeof(float),
                cudaMemcpyDeviceToHost, d->stream));
        if (status != BT_OK)
            return status;
    }
    if (k > 0) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            top_ids, d->d_top_ids, (size_t)n * k * sizeof(int),
            cudaMemcpyDeviceToHost, d->stream));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                top_logp, d->d_top_logp, (size_t)n * k * sizeof(float),
                cudaMemcpyDeviceToHost, d->stream));
    }
    return status;
}

/* The device work of one pass over n rows whose metadata is in d_meta
 * (layout of draft_pass) and masks in d_mask: features, the head's layer,
 * the store writes and, with k > 0, the classifier and top-k into
 * d_top_ids / d_top_logp.  No host copies and no allocation, so a CUDA
 * graph can capture it. */
static bt_status_t draft_enqueue(cuda_draft_t *d, int n, int n_hidden,
                                 bool stash, int k, bool logits, int n_splits,
                                 int split_len)
{
    int *d_tok = d->d_meta, *d_pos = d_tok + n, *d_slot = d_pos + n;
    int *d_kvl = d_slot + n, *d_bto = d_kvl + n, *d_ctx = d_bto + n;
    int *d_mo = d_ctx + n, *d_fsrc = d_mo + n, *d_odst = d_fsrc + n;
    int *d_hsrc = d_odst + n;
    cuda_rope_kv_args_t ra;
    cuda_attn_args_t aa;
    bt_status_t status = BT_OK;

    DRAFT_PROF(d, 0);
    /* target features: rmsnorm(hidden) * final_norm, of uploaded rows
     * or gathered from the stash */
    if (n_hidden > 0)
        status = cuda_rmsnorm(stash ? d->d_pend : d->d_hid, NULL,
                              d->d_final_norm, stash ? d_hsrc : NULL,
                              n_hidden, d->dim, d->eps, d->d_hfeat, d->dt,
                              d->stream);
    /* fc over [embedding; feature] */
    if (status == BT_OK)
        status = cuda_draft_rows(d->d_store, d->d_hfeat, d_fsrc, NULL, n,
                                 d->dim, d->d_xf, d->dt, d->stream);
    if (status == BT_OK)
        status = cuda_draft_rows(d->d_emb, NULL, d_tok, NULL, n, d->dim,
                                 d->d_xe, d->dt, d->stream);
    if (status == BT_OK)
        status = cuda_draft_bias(d->d_h, d->d_fcb, n, d->dim, d->stream);
    DRAFT_PROF(d, 1);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, d->dim, d->dim, d->d_xe, d->d_fce,
                             d->dt, d->d_h, CUDA_DT_F32, true, d->stream);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, d->dim, d->dim, d->d_xf, d->d_fcf,
                             d->dt, d->d_h, CUDA_DT_F32, true, d->stream);
    DRAFT_PROF(d, 2);
    /* attention (layer 0: no input norm) */
    if (status == BT_OK)
        status = cuda_convert(d->d_h, CUDA_SRC_F32, (size_t)n * d->dim,
                              d->d_hx, d->dt, d->stream);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, d->qkv_dim, d->dim, d->d_hx,
                             d->d_wqkv, d->dt, d->d_qkv, d->dt, false,
                             d->stream);
    if (status != BT_OK)
        return status;
    DRAFT_PROF(d, 3);
    memset(&ra, 0, sizeof(ra));
    ra.n_tokens = n;
    ra.n_heads = d->nh;
    ra.n_kv_heads = d->nkv;
    ra.head_dim = d->hd;
    ra.rope_half = 1;
    ra.d_qkv = d->d_qkv;
    ra.d_inv_freq = d->d_inv_freq;
    ra.d_pos = d_pos;
    ra.d_slot = d_slot;
    ra.d_q = d->d_q;
    ra.d_k_cache = d->d_kc;
    ra.d_v_cache = d->d_vc;
    status = cuda_rope_kv(&ra, d->dt, d->stream);
    if (status != BT_OK)
        return status;
    DRAFT_PROF(d, 4);
    memset(&aa, 0, sizeof(aa));
    aa.n_heads = d->nh;
    aa.n_kv_heads = d->nkv;
    aa.head_dim = d->hd;
    aa.block_size = CUDA_DRAFT_BLOCK;
    aa.scale = 1.0f / sqrtf((float)d->hd);
    aa.d_q = d->d_q;
    aa.d_k_cache = d->d_kc;
    aa.d_v_cache = d->d_vc;
    aa.d_block_tables = d->d_bt;
    aa.d_masks = d->d_mask;
    aa.d_kv_len = d_kvl;
    aa.d_bt_off = d_bto;
    aa.d_ctx_len = d_ctx;
    aa.d_mask_off = d_mo;
    aa.d_out = d->d_att;
    status = cuda_attn_decode(&aa, NULL, n, n_splits, split_len, d->d_ws,
                              d->dt, d->stream);
    DRAFT_PROF(d, 5);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, d->dim, d->q_dim, d->d_att,
                             d->d_wo, d->dt, d->d_h, CUDA_DT_F32, true,
                             d->stream);
    DRAFT_PROF(d, 6);
    /* feed-forward */
    if (status == BT_OK)
        status = cuda_rmsnorm(d->d_h, NULL, d->d_post_norm, NULL, n, d->dim,
                              d->eps, d->d_xn, d->dt, d->stream);
    DRAFT_PROF(d, 7);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, 2 * d->hid, d->dim, d->d_xn,
                             d->d_wgu, d->dt, d->d_gu, d->dt, false,
                             d->stream);
    DRAFT_PROF(d, 8);
    if (status == BT_OK)
        status = cuda_swiglu(d->d_gu, n, d->hid, d->d_hh, d->dt, d->stream);
    DRAFT_PROF(d, 9);
    if (status == BT_OK)
        status = worker_gemm(d->gemm, n, d->dim, d->hid, d->d_hh,
                             d->d_wdown, d->dt, d->d_h, CUDA_DT_F32, true,
                             d->stream);
    DRAFT_PROF(d, 10);
    /* outputs: store rows, then the classifier and top-k */
    if (status == BT_OK)
        status = cuda_convert(d->d_h, CUDA_SRC_F32, (size_t)n * d->dim,
                              d->d_hx, d->dt, d->stream);
    if (status == BT_OK)
        status = cuda_draft_rows(d->d_hx, NULL, NULL, d_odst, n, d->dim,
                                 d->d_store, d->dt, d->stream);
    DRAFT_PROF(d, 11);
    if (status == BT_OK && (k > 0 || logits))
        status = worker_gemm(d->gemm, n, d->vocab, d->dim, d->d_hx,
                             d->d_cls, d->dt, d->d_logits, CUDA_DT_F32,
                             false, d->stream);
    DRAFT_PROF(d, 12);
    if (status == BT_OK && k > 0)
        status = cuda_topk_logprob(d->d_logits, n, d->vocab, k,
                                   d->d_top_ids, d->d_top_logp,
                                   d->d_topk_ws, d->stream);
    DRAFT_PROF(d, 13);
    return status;
}

/* Drops every captured pass (a buffer they point to moved). */
static void draft_graphs_drop(cuda_draft_t *d)
{
    for (int i = 0; i < d->n_graphs; i++)
        cudaGraphExecDestroy(d->graphs[i].exec);
    d->n_graphs = 0;
    d->n_seen = 0;
    /* device-loop trees capture passes over the same buffers */
    for (int i = 0; i < d->n_tgraphs; i++)
        cudaGraphExecDestroy(d->tgraphs[i].exec);
    d->n_tgraphs = 0;
    d->n_tseen = 0;
}

/* Runs draft_enqueue for this key from a CUDA graph: found, or captured
 * the second time the key is seen (the first run is eager, so GEMM
 * tuning happens outside capture).  *done_p false: run it eagerly. */
static bt_status_t draft_graph_run(cuda_draft_t *d, const draft_key_t *key,
                                   bool *done_p)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bt_status_t status, st2;
    bool seen = false;

    *done_p = false;
    for (int i = 0; i < d->n_graphs; i++)
        if (memcmp(&d->graphs[i].key, key, sizeof(*key)) == 0) {
            draft_graph_t g = d->graphs[i];

            /* most recently used last (the eviction order) */
            memmove(&d->graphs[i], &d->graphs[i + 1],
                    (size_t)(d->n_graphs - 1 - i) * sizeof(g));
            d->graphs[d->n_graphs - 1] = g;
            *done_p = true;
            d->n_replay++;
            return BT_CUDA_STATUS(cudaGraphLaunch(g.exec, d->stream));
        }
    for (int i = 0; i < d->n_seen && !seen; i++)
        seen = memcmp(&d->seen[i], key, sizeof(*key)) == 0;
    if (!seen) {
        if (d->n_seen == CUDA_DRAFT_GRAPHS) /* forget the oldest */
            memmove(&d->seen[0], &d->seen[1],
                    (CUDA_DRAFT_GRAPHS - 1) * sizeof(d->seen[0]));
        d->seen[BT_MIN(d->n_seen, CUDA_DRAFT_GRAPHS - 1)] = *key;
        d->n_seen = BT_MIN(d->n_seen + 1, CUDA_DRAFT_GRAPHS);
        return BT_OK;
    }
    if (d->n_graphs == CUDA_DRAFT_GRAPHS) { /* full: drop the LRU one */
        cudaGraphExecDestroy(d->graphs[0].exec);
        memmove(&d->graphs[0], &d->graphs[1],
                (CUDA_DRAFT_GRAPHS - 1) * sizeof(d->graphs[0]));
        d->n_graphs--;
    }
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        d->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        goto fail;
    status = draft_enqueue(d, key->n, key->n_hidden, key->stash != 0, key->k,
                           false, key->n_splits, key->split_len);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(d->stream, &graph));
    if (status == BT_OK)
        status = st2;
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (graph)
        cudaGraphDestroy(graph);
    if (status != BT_OK)
        goto fail;
    d->graphs[d->n_graphs].key = *key;
    d->graphs[d->n_graphs++].exec = exec;
    d->n_capture++;
    *done_p = true;
    return BT_CUDA_STATUS(cudaGraphLaunch(exec, d->stream));

fail:
    /* graphs are an optimisation: log once and run eagerly from now on */
    BT_LOG_WARN("SPEC", "device draft: graph capture failed (%s); running "
                "the head without graphs", bt_error_last());
    (void)cudaGetLastError();
    d->use_graphs = false;
    return BT_OK;
}

/* One pass over at most CUDA_DRAFT_CHUNK rows: metadata up, the device
 * work (from a graph when it can), results down (async; caller syncs). */
static bt_status_t draft_pass(cuda_draft_t *d, int n,
                              const cuda_draft_row_t *rows,
                              const float *h_hidden, int n_hidden, int k,
                              int *top_ids, float *top_logp, float *h_feat,
                              float *h_logits)
{
    const cuda_draft_config_t *c = &d->cfg;
    /* passes of more than 32 rows run padded to a multiple of 16 rows, so
     * a batch whose row count moves a little every step reuses a few
     * captured passes (and GEMM plans) instead of meeting new ones; the
     * padding rows write nothing and see no keys.  32 rows or fewer run
     * exactly (the device draft loop's passes, which must match these
     * bit for bit, are that small in every test). */
    const int np = n > 32 ? (int)BT_DIV_UP(n, 16) * 16 : n;
    int *tok = d->h_meta, *pos = tok + np, *slot = pos + np;
    int *kvl = slot + np, *bto = kvl + np, *ctx = bto + np, *mo = ctx + np;
    int *fsrc = mo + np, *odst = fsrc + np, *hsrc = odst + np;
    bool stash = h_hidden == NULL;   /* hidden rows: stashed ones */
    int hid_lim = stash ? c->pend_rows : n_hidden;
    size_t mask_total = 0, at = 0;
    int state_slots = d->nb_per * CUDA_DRAFT_BLOCK, max_kv = 1;
    int max_splits, n_stashed = 0;
    draft_key_t key;
    bool done = false;
    bt_status_t status;

    for (int i = 0; i < n; i++) {
        const cuda_draft_row_t *r = &rows[i];

        if (r->state < 0 || r->state >= c->n_states || r->slot < 0 ||
            r->slot >= c->state_slots || r->ctx < 0 || r->ctx > r->kv_len ||
            r->kv_len > c->state_slots || r->slot >= r->kv_len ||
            r->token < 0 || r->token >= d->vocab || r->pos < 0 ||
            r->feat >= c->store_rows || r->feat < -hid_lim ||
            r->out >= c->store_rows)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "device draft row %d is malformed (state %d, "
                            "slot %d, ctx %d, kv_len %d, feat %d, out %d)",
                            i, r->state, r->slot, r->ctx, r->kv_len,
                            r->feat, r->out);
        if (r->mask)
            mask_total += (size_t)(r->kv_len - r->ctx);
    }
    if (mask_total > d->mask_cap)
        draft_graphs_drop(d); /* d_mask moves */
    status = draft_mask_reserve(d, BT_MAX(mask_total, (size_t)1));
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n; i++) {
        const cuda_draft_row_t *r = &rows[i];
        int base = r->state * state_slots;

        tok[i] = r->token;
        pos[i] = r->pos;
        slot[i] = base + r->slot;
        kvl[i] = r->kv_len;
        bto[i] = r->state * d->nb_per;
        ctx[i] = r->ctx;
        mo[i] = -1;
        if (r->mask) {
            mo[i] = (int)at;
            memcpy(d->h_mask + at, r->mask, (size_t)(r->kv_len - r->ctx));
            at += (size_t)(r->kv_len - r->ctx);
        }
        fsrc[i] = r->feat >= 0 ? r->state * c->store_rows + r->feat
                               : r->feat;
        if (stash && r->feat < 0) { /* normalised into d_hfeat row j */
            hsrc[n_stashed] = r->state * c->pend_rows + (-1 - r->feat);
            fsrc[i] = -1 - n_stashed++;
        }
        odst[i] = r->out >= 0 ? r->state * c->store_rows + r->out : -1;
        max_kv = BT_MAX(max_kv, r->kv_len);
    }
    for (int i = n; i < np; i++) { /* padding: no KV write, no keys */
        tok[i] = 0;
        pos[i] = 0;
        slot[i] = -1;
        kvl[i] = 0;
        bto[i] = 0;
        ctx[i] = 0;
        mo[i] = -1;
        fsrc[i] = 0;
        odst[i] = -1;
    }
    /* (before the upload below reads h_meta) */
    if (stash && n_stashed > 0) {
        /* normalise np rows (the extra ones read stash row 0 and land
         * where no row reads): the key must not follow the exact count,
         * which moves every step with the accepted lengths */
        for (int j = n_stashed; j < np; j++)
            hsrc[j] = 0;
        n_hidden = np;
    } else if (stash) {
        n_hidden = 0;
    }

    /* uploads */
    status = BT_CUDA_STATUS(cudaMemcpyAsync(
        d->d_meta, d->h_meta, (size_t)CUDA_DRAFT_META * np * sizeof(int),
        cudaMemcpyHostToDevice, d->stream));
    if (status == BT_OK && at > 0)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(d->d_mask, d->h_mask, at,
                                                cudaMemcpyHostToDevice,
                                                d->stream));
    if (status == BT_OK && !stash && n_hidden > 0)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d->d_hid, h_hidden, (size_t)n_hidden * d->dim * sizeof(float),
            cudaMemcpyHostToDevice, d->stream));
    if (status != BT_OK)
        return status;

    memset(&key, 0, sizeof(key));
    key.n = np;
    key.n_hidden = n_hidden;
    key.stash = stash && n_hidden > 0;
    key.k = k;
    max_splits = (int)BT_MIN((size_t)64,
                             d->ws_floats / ((size_t)np * d->nh *
                                             (d->hd + 2)));
    max_splits = BT_MAX(max_splits, 1);
    cuda_attn_decode_plan(np, max_kv, d->nh, d->nkv, d->n_sm, d->attn_bps,
                          max_splits, &key.n_splits, &key.split_len);
    status = BT_CUDA_STATUS(cudaEventRecord(d->ev_pass[0], d->stream));
    if (status != BT_OK)
        return status;
    /* test outputs (h_feat, h_logits) take the eager path, and so do
     * profiled passes */
    if (d->use_graphs && h_feat == NULL && h_logits == NULL && !d->prof) {
        status = draft_graph_run(d, &key, &done);
        if (status != BT_OK)
            return status;
    }
    if (!done) {
        d->n_eager++;
        uint64_t setups = worker_gemm_setups(d->gemm);

        d->prof_on = d->prof;
        status = draft_enqueue(d, np, n_hidden, key.stash != 0, k,
                               h_logits != NULL, key.n_splits,
                               key.split_len);
        /* a pass that planned or tuned a GEMM times that work too */
        if (worker_gemm_setups(d->gemm) != setups)
            d->prof_on = false;
        if (d->prof_on) {
            d->prof_rows += (uint64_t)n;
            d->prof_passes++;
        }
    }
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(d->ev_pass[1], d->stream));
    if (status == BT_OK && h_feat)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            h_feat, d->d_h, (size_t)n * d->dim * sizeof(float),
            cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK && h_logits)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            h_logits, d->d_logits, (size_t)n * d->vocab * sizeof(float),
            cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK && k > 0)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            top_ids, d->d_top_ids, (size_t)n * k * sizeof(int),
            cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK && k > 0)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            top_logp, d->d_top_logp, (size_t)n * k * sizeof(float),
            cudaMemcpyDeviceToHost, d->stream));
    return status;
}

bt_status_t cuda_draft_forward(cuda_draft_t *d, int n,
                               const cuda_draft_row_t *rows,
                               const float *h_hidden, int n_hidden, int k,
                               int *top_ids, float *top_logp, float *h_feat,
                               float *h_logits)
{
    bt_status_t status = BT_OK;
    cuda_draft_row_t *tmp = NULL;

    if (n < 0 || k < 0 || k > CUDA_DRAFT_TOPK_MAX || k > d->vocab ||
        n_hidden < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft forward of %d rows, top-%d", n, k);
    /* the backend may have switched devices (tensor parallelism) */
    status = BT_CUDA_STATUS(cudaSetDevice(d->cfg.device_index));
    if (status != BT_OK)
        return status;
    for (int r0 = 0; r0 < n && status == BT_OK; r0 += CUDA_DRAFT_CHUNK) {
        int m = BT_MIN(CUDA_DRAFT_CHUNK, n - r0);
        const cuda_draft_row_t *rows_c = rows + r0;
        int h0 = INT_MAX, h1 = 0;

        /* this pass's hidden rows: the range its rows name (stashed
         * rows are named per state) */
        for (int i = 0; i < m && h_hidden; i++)
            if (rows_c[i].feat < 0) {
                h0 = BT_MIN(h0, -1 - rows_c[i].feat);
                h1 = BT_MAX(h1, -rows_c[i].feat);
            }
        if (h1 == 0)
            h0 = 0;
        if (h1 - h0 > CUDA_DRAFT_CHUNK) {
            status = BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                              "device draft: a pass names %d hidden rows",
                              h1 - h0);
            break;
        }
        if (h0 > 0) { /* re-base the hidden row indices */
            if (tmp == NULL) {
                tmp = bt_malloc(sizeof(*tmp) * CUDA_DRAFT_CHUNK,
                                "cuda_draft");
                if (tmp == NULL)
                    return BT_ERR_NO_MEMORY;
            }
            memcpy(tmp, rows_c, sizeof(*tmp) * (size_t)m);
            for (int i = 0; i < m; i++)
                if (tmp[i].feat < 0)
                    tmp[i].feat += h0;
            rows_c = tmp;
        }
        status = draft_pass(d, m, rows_c,
                            h_hidden ? h_hidden + (size_t)h0 * d->dim : NULL,
                            h1 - h0, k, top_ids ? top_ids + (size_t)r0 * k
                                                : NULL,
                            top_logp ? top_logp + (size_t)r0 * k : NULL,
                            h_feat ? h_feat + (size_t)r0 * d->dim : NULL,
                            h_logits ? h_logits + (size_t)r0 * d->vocab
                                     : NULL);
        /* the pinned metadata is reused by the next pass */
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
        if (status == BT_OK) {
            float ms = 0.0f;

            if (cudaEventElapsedTime(&ms, d->ev_pass[0], d->ev_pass[1]) ==
                cudaSuccess)
                d->gpu_ns += (uint64_t)((double)ms * 1e6);
            for (int i = 0; d->prof_on && i < DRAFT_PROF_N - 1; i++)
                if (cudaEventElapsedTime(&ms, d->prof_ev[i],
                                         d->prof_ev[i + 1]) == cudaSuccess)
                    d->prof_ms[i] += ms;
            d->prof_on = false;
            (void)cudaGetLastError();
        }
    }
    bt_free(tmp);
    if (status != BT_OK)
        (void)cudaStreamSynchronize(d->stream);
    return status;
}

bt_status_t cuda_draft_topk(cuda_draft_t *d, int n, const int *states,
                            const int *store_rows, int k, int *top_ids,
                            float *top_logp, float *h_logits)
{
    const cuda_draft_config_t *c = &d->cfg;
    bt_status_t status = BT_OK;

    if (n < 0 || k < 1 || k > CUDA_DRAFT_TOPK_MAX || k > d->vocab)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft top-%d of %d rows", k, n);
    status = BT_CUDA_STATUS(cudaSetDevice(d->cfg.device_index));
    if (status != BT_OK)
        return status;
    for (int r0 = 0; r0 < n && status == BT_OK; r0 += CUDA_DRAFT_CHUNK) {
        int m = BT_MIN(CUDA_DRAFT_CHUNK, n - r0);

        for (int i = 0; i < m; i++) {
            int st = states[r0 + i], row = store_rows[r0 + i];

            if (st < 0 || st >= c->n_states || row < 0 ||
                row >= c->store_rows)
                return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                                "device draft top-k of state %d row %d",
                                st, row);
            d->h_meta[i] = st * c->store_rows + row;
        }
        status = BT_CUDA_STATUS(cudaMemcpyAsync(d->d_meta, d->h_meta,
                                                (size_t)m * sizeof(int),
                                                cudaMemcpyHostToDevice,
                                                d->stream));
        if (status == BT_OK)
            status = cuda_draft_rows(d->d_store, NULL, d->d_meta, NULL, m,
                                     d->dim, d->d_hx, d->dt, d->stream);
        if (status == BT_OK)
            status = draft_classify(d, d->d_hx, m, k,
                                    top_ids + (size_t)r0 * k,
                                    top_logp + (size_t)r0 * k,
                                    h_logits ? h_logits +
                                                   (size_t)r0 * d->vocab
                                             : NULL);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
    }
    if (status != BT_OK)
        (void)cudaStreamSynchronize(d->stream);
    return status;
}

// ---------------------------------------------------------------------
// the stash of target rows

bt_status_t cuda_draft_stash(cuda_draft_t *d, int n, const float *d_src,
                             const int *src_rows, const int *states,
                             const int *rows)
{
    const cuda_draft_config_t *c = &d->cfg;
    bt_status_t status;

    if (n < 0 || (n > 0 && (d_src == NULL || d->d_pend == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft stash of %d rows (%s)", n,
                        d->d_pend ? "no source" : "no stash");
    if (n == 0)
        return BT_OK;
    if (n > d->stash_cap) {
        int cap = BT_MAX(n, 2 * d->stash_cap);

        if (d->h_stash)
            cudaFreeHost(d->h_stash);
        d->h_stash = NULL;
        cuda__dev_free((void **)&d->d_stash);
        d->stash_cap = 0;
        status = BT_CUDA_STATUS(cudaMallocHost(
            (void **)&d->h_stash, 2 * (size_t)cap * sizeof(int)));
        if (status == BT_OK)
            status = cuda__dev_malloc((void **)&d->d_stash,
                                      2 * (size_t)cap * sizeof(int),
                                      "draft_stash_rows");
        if (status != BT_OK)
            return status;
        d->stash_cap = cap;
    }
    for (int i = 0; i < n; i++) {
        if (states[i] < 0 || states[i] >= c->n_states || rows[i] < 0 ||
            rows[i] >= c->pend_rows || src_rows[i] < 0)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "device draft stash row %d: state %d row %d "
                            "from %d", i, states[i], rows[i], src_rows[i]);
        d->h_stash[i] = src_rows[i];
        d->h_stash[n + i] = states[i] * c->pend_rows + rows[i];
    }
    status = BT_CUDA_STATUS(cudaSetDevice(c->device_index));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(d->d_stash, d->h_stash,
                                                2 * (size_t)n * sizeof(int),
                                                cudaMemcpyHostToDevice,
                                                d->stream));
    if (status == BT_OK)
        status = cuda_draft_rows(d_src, NULL, d->d_stash, d->d_stash + n, n,
                                 d->dim, d->d_pend, CUDA_DT_F32, d->stream);
    /* the source belongs to the next forward once this returns */
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
    else
        (void)cudaStreamSynchronize(d->stream);
    return status;
}

bt_status_t cuda_draft_stash_host(cuda_draft_t *d, int state, int row0,
                                  const float *h_rows, int n)
{
    const cuda_draft_config_t *c = &d->cfg;
    bt_status_t status;

    if (d->d_pend == NULL || state < 0 || state >= c->n_states ||
        row0 < 0 || n < 0 || row0 + n > c->pend_rows)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft stash of host rows %d..%d of state "
                        "%d", row0, row0 + n, state);
    status = BT_CUDA_STATUS(cudaSetDevice(c->device_index));
    if (status == BT_OK && n > 0)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d->d_pend + ((size_t)state * c->pend_rows + row0) * d->dim,
            h_rows, (size_t)n * d->dim * sizeof(float),
            cudaMemcpyHostToDevice, d->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
    return status;
}

// ---------------------------------------------------------------------
// the device draft loop

int cuda_draft_tree_nodes(int depth, int k)
{
    return k + (depth - 1) * k * k;
}

bool cuda_draft_tree_ok(const cuda_draft_t *d, int n, int depth, int k,
                        int max_draft_len)
{
    return n >= 1 && k >= 1 && k <= CUDA_DRAFT_TOPK_MAX && k <= d->vocab &&
           depth >= 2 && depth <= CUDA_DRAFT_TREE_DEPTH &&
           n * k <= CUDA_DRAFT_CHUNK && max_draft_len >= 0 &&
           /* the last level's rows: kv_len draft_len + (depth-1) k,
            * output store rows up to (depth - 1) k */
           max_draft_len + (depth - 1) * k <= d->cfg.state_slots &&
           1 + (depth - 1) * k <= d->cfg.store_rows;
}

static void draft_tree_free(cuda_draft_t *d)
{
    cuda__dev_free((void **)&d->d_tseq);
    cuda__dev_free((void **)&d->d_l1);
    cuda__dev_free(&d->d_tnodes);
    cuda__dev_free((void **)&d->d_torder);
    if (d->h_tseq)
        cudaFreeHost(d->h_tseq);
    if (d->h_l1)
        cudaFreeHost(d->h_l1);
    if (d->h_tnodes)
        cudaFreeHost(d->h_tnodes);
    if (d->h_torder)
        cudaFreeHost(d->h_torder);
    d->h_tseq = NULL;
    d->h_l1 = NULL;
    d->h_tnodes = NULL;
    d->h_torder = NULL;
    d->tree_seqs = 0;
    d->tree_nodes = 0;
}

/* Tree buffers for n sequences of node_cap nodes (they only grow; a move
 * drops every captured graph). */
static bt_status_t draft_tree_reserve(cuda_draft_t *d, int n, int node_cap)
{
    size_t nodes = (size_t)n * node_cap;
    int seqs;
    bt_status_t status;

    if (n <= d->tree_seqs && nodes <= d->tree_nodes)
        return BT_OK;
    draft_graphs_drop(d);
    seqs = BT_MAX(n, d->tree_seqs);
    nodes = BT_MAX(nodes, d->tree_nodes);
    draft_tree_free(d);
    status = cuda__dev_malloc((void **)&d->d_tseq,
                              (size_t)seqs * sizeof(cuda_tree_seq_t),
                              "draft_tree");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&d->d_l1,
                                  (size_t)seqs * CUDA_DRAFT_TOPK_MAX * 8,
                                  "draft_tree");
    if (status == BT_OK)
        status = cuda__dev_malloc(&d->d_tnodes, nodes * sizeof(spec_node_t),
                                  "draft_tree");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&d->d_torder, nodes * sizeof(int),
                                  "draft_tree");
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMallocHost(
            (void **)&d->h_tseq, (size_t)seqs * sizeof(cuda_tree_seq_t)));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMallocHost(
            (void **)&d->h_l1, (size_t)seqs * CUDA_DRAFT_TOPK_MAX * 8));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMallocHost(
            (void **)&d->h_tnodes, nodes * sizeof(spec_node_t)));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMallocHost((void **)&d->h_torder,
                                               nodes * sizeof(int)));
    if (status != BT_OK) {
        draft_tree_free(d);
        return status;
    }
    d->tree_seqs = seqs;
    d->tree_nodes = nodes;
    return BT_OK;
}

/* The device work of one tree (key), inputs already in d_tseq / d_l1:
 * level 1, then per level the rows, the head pass (draft_enqueue, as
 * draft_pass runs it) and the expansion, then the selection.  No host
 * copies and no allocation: a CUDA graph captures it whole. */
static bt_status_t draft_tree_enqueue(cuda_draft_t *d,
                                      const draft_tree_key_t *key)
{
    int n = key->n, k = key->k, nr = n * k;
    int node_cap = cuda_draft_tree_nodes(key->depth, k);
    bt_status_t status;

    status = cuda_tree_level1(n, k, d->d_l1, (const float *)(d->d_l1 + nr),
                              d->d_tnodes, node_cap, d->d_tseq, d->stream);
    for (int lv = 1; lv < key->depth && status == BT_OK; lv++) {
        status = cuda_tree_rows(n, k, lv, d->d_tnodes, node_cap, d->d_tseq,
                                d->nb_per * CUDA_DRAFT_BLOCK, d->nb_per,
                                d->cfg.store_rows, d->d_meta, d->d_mask,
                                d->stream);
        if (status == BT_OK)
            status = draft_enqueue(d, nr, 0, false, k, false,
                                   key->n_splits[lv], key->split_len[lv]);
        if (status == BT_OK)
            status = cuda_tree_expand(n, k, lv, d->d_top_ids,
                                      d->d_top_logp, d->d_tnodes, node_cap,
                                      d->d_tseq, d->stream);
    }
    if (status == BT_OK)
        status = cuda_tree_select(n, d->d_tnodes, node_cap, d->d_tseq,
                                  d->d_torder, d->stream);
    return status;
}

/* draft_graph_run for trees: replayed when captured, captured on the
 * key's second sight, else *done_p false (run it eagerly). */
static bt_status_t draft_tree_graph_run(cuda_draft_t *d,
                                        const draft_tree_key_t *key,
                                        bool *done_p)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bt_status_t status, st2;
    bool seen = false;

    *done_p = false;
    for (int i = 0; i < d->n_tgraphs; i++)
        if (memcmp(&d->tgraphs[i].key, key, sizeof(*key)) == 0) {
            draft_tree_graph_t g = d->tgraphs[i];

            memmove(&d->tgraphs[i], &d->tgraphs[i + 1],
                    (size_t)(d->n_tgraphs - 1 - i) * sizeof(g));
            d->tgraphs[d->n_tgraphs - 1] = g;
            *done_p = true;
            d->n_replay++;
            return BT_CUDA_STATUS(cudaGraphLaunch(g.exec, d->stream));
        }
    for (int i = 0; i < d->n_tseen && !seen; i++)
        seen = memcmp(&d->tseen[i], key, sizeof(*key)) == 0;
    if (!seen) {
        if (d->n_tseen == CUDA_DRAFT_TREE_GRAPHS)
            memmove(&d->tseen[0], &d->tseen[1],
                    (CUDA_DRAFT_TREE_GRAPHS - 1) * sizeof(d->tseen[0]));
        d->tseen[BT_MIN(d->n_tseen, CUDA_DRAFT_TREE_GRAPHS - 1)] = *key;
        d->n_tseen = BT_MIN(d->n_tseen + 1, CUDA_DRAFT_TREE_GRAPHS);
        return BT_OK;
    }
    if (d->n_tgraphs == CUDA_DRAFT_TREE_GRAPHS) {
        cudaGraphExecDestroy(d->tgraphs[0].exec);
        memmove(&d->tgraphs[0], &d->tgraphs[1],
                (CUDA_DRAFT_TREE_GRAPHS - 1) * sizeof(d->tgraphs[0]));
        d->n_tgraphs--;
    }
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        d->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        goto fail;
    status = draft_tree_enqueue(d, key);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(d->stream, &graph));
    if (status == BT_OK)
        status = st2;
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (graph)
        cudaGraphDestroy(graph);
    if (status != BT_OK)
        goto fail;
    d->tgraphs[d->n_tgraphs].key = *key;
    d->tgraphs[d->n_tgraphs++].exec = exec;
    d->n_capture++;
    *done_p = true;
    return BT_CUDA_STATUS(cudaGraphLaunch(exec, d->stream));

fail:
    BT_LOG_WARN("SPEC", "device draft loop: graph capture failed (%s); "
                "running the head without graphs", bt_error_last());
    (void)cudaGetLastError();
    d->use_graphs = false;
    return BT_OK;
}

bt_status_t cuda_draft_tree(cuda_draft_t *d, int n,
                            const cuda_draft_tree_seq_t *seqs, int depth,
                            int k, const int *l1_ids, const float *l1_logp,
                            spec_node_t *nodes, int *order, int *n_sel)
{
    const cuda_draft_config_t *c = &d->cfg;
    int node_cap, nr = n * k, max_dl = 0, max_splits;
    draft_tree_key_t key;
    bool done = false;
    bt_status_t status;

    if (n < 1 || k < 1 || k > CUDA_DRAFT_TOPK_MAX || k > d->vocab ||
        depth < 2 || depth > CUDA_DRAFT_TREE_DEPTH ||
        nr > CUDA_DRAFT_CHUNK)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device draft loop of %d sequences, depth %d, "
                        "top-%d", n, depth, k);
    for (int i = 0; i < n; i++) {
        const cuda_draft_tree_seq_t *q = &seqs[i];

        if (q->state < 0 || q->state >= c->n_states || q->draft_len < 0 ||
            !cuda_draft_tree_ok(d, n, depth, k, q->draft_len) ||
            q->cached < 0 || q->tokens < 1)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "device draft loop: sequence %d (state %d, "
                            "draft_len %d) does not fit", i, q->state,
                            q->draft_len);
        max_dl = BT_MAX(max_dl, q->draft_len);
    }
    for (int i = 0; i < nr; i++)
        if (l1_ids[i] < 0 || l1_ids[i] >= d->vocab)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "device draft loop: level-1 token %d",
                            l1_ids[i]);
    status = BT_CUDA_STATUS(cudaSetDevice(c->device_index));
    if (status != BT_OK)
        return status;
    node_cap = cuda_draft_tree_nodes(depth, k);
    status = draft_tree_reserve(d, n, node_cap);
    if (status == BT_OK &&
        (size_t)nr * (depth - 1) * k > d->mask_cap) {
        draft_graphs_drop(d); /* d_mask moves */
        status = draft_mask_reserve(d, (size_t)nr * (depth - 1) * k);
    }
    if (status != BT_OK)
        return status;

    /* inputs: one upload */
    for (int i = 0; i < n; i++) {
        cuda_tree_seq_t *t = &d->h_tseq[i];

        memset(t, 0, sizeof(*t));
        t->state = seqs[i].state;
        t->draft_len = seqs[i].draft_len;
        t->cached = seqs[i].cached;
        t->tokens = seqs[i].tokens;
    }
    memcpy(d->h_l1, l1_ids, (size_t)nr * sizeof(int));
    memcpy(d->h_l1 + nr, l1_logp, (size_t)nr * sizeof(float));
    status = BT_CUDA_STATUS(cudaMemcpyAsync(
        d->d_tseq, d->h_tseq, (size_t)n * sizeof(cuda_tree_seq_t),
        cudaMemcpyHostToDevice, d->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d->d_l1, d->h_l1, (size_t)nr * 8, cudaMemcpyHostToDevice,
            d->stream));
    if (status != BT_OK)
        goto out;

    /* every level's attention plan, exactly as draft_pass picks it */
    memset(&key, 0, sizeof(key));
    key.n = n;
    key.depth = depth;
    key.k = k;
    max_splits = (int)BT_MIN((size_t)64,
                             d->ws_floats / ((size_t)nr * d->nh *
                                             (d->hd + 2)));
    max_splits = BT_MAX(max_splits, 1);
    for (int lv = 1; lv < depth; lv++)
        cuda_attn_decode_plan(nr, BT_MAX(max_dl + lv * k, 1), d->nh, d->nkv,
                              d->n_sm, d->attn_bps, max_splits,
                              &key.n_splits[lv], &key.split_len[lv]);
    if (d->use_graphs) {
        status = draft_tree_graph_run(d, &key, &done);
        if (status != BT_OK)
            goto out;
    }
    if (!done) {
        d->n_eager++;
        status = draft_tree_enqueue(d, &key);
        if (status != BT_OK)
            goto out;
    }

    /* the tree: one download */
    status = BT_CUDA_STATUS(cudaMemcpyAsync(
        d->h_tnodes, d->d_tnodes, (size_t)n * node_cap * sizeof(spec_node_t),
        cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d->h_torder, d->d_torder, (size_t)n * node_cap * sizeof(int),
            cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d->h_tseq, d->d_tseq, (size_t)n * sizeof(cuda_tree_seq_t),
            cudaMemcpyDeviceToHost, d->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
    if (status != BT_OK)
        goto out;
    for (int i = 0; i < n; i++)
        if (d->h_tseq[i].n_nodes != node_cap) {
            status = BT_ERROR(BT_ERR_INTERNAL, "SPEC",
                              "device draft loop: sequence %d grew %d of "
                              "%d nodes", i, d->h_tseq[i].n_nodes,
                              node_cap);
            goto out;
        }
    memcpy(nodes, d->h_tnodes, (size_t)n * node_cap * sizeof(spec_node_t));
    memcpy(order, d->h_torder, (size_t)n * node_cap * sizeof(int));
    for (int i = 0; i < n; i++)
        n_sel[i] = d->h_tseq[i].n_sel;
    return BT_OK;

out:
    (void)cudaStreamSynchronize(d->stream);
    return status;
}

// ---------------------------------------------------------------------
// verification

/* cuda_draft_target_argmax of host rows h_hidden, or (h_hidden NULL) of
 * device rows d_hidden + map[i] * dim. */
static bt_status_t draft_target_argmax(cuda_draft_t *d, int n,
                                       const float *h_hidden,
                                       const float *d_hidden, const int *map,
                                       int *argmax, int n_full,
                                       const int *full_rows, float *h_logits)
{
    size_t es = cuda_dtype_size(d->dt);
    int fi = 0; /* next entry of full_rows */
    bt_status_t status = BT_OK;

    if (n < 0 || n_full < 0 || (n_full > 0 && (full_rows == NULL ||
                                               h_logits == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device verification of %d rows", n);
    for (int i = 0; i < n_full; i++)
        if ((i > 0 && full_rows[i] <= full_rows[i - 1]) || full_rows[i] < 0 ||
            full_rows[i] >= n)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "device verification: full rows must ascend "
                            "below %d", n);
    status = BT_CUDA_STATUS(cudaSetDevice(d->cfg.device_index));
    if (status != BT_OK)
        return status;
    for (int r0 = 0; r0 < n && status == BT_OK; r0 += CUDA_DRAFT_CHUNK) {
        int m = BT_MIN(CUDA_DRAFT_CHUNK, n - r0);

        if (h_hidden) {
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                d->d_hid, h_hidden + (size_t)r0 * d->dim,
                (size_t)m * d->dim * sizeof(float), cudaMemcpyHostToDevice,
                d->stream));
        } else { /* the rows' indices; h_meta is free (passes sync) */
            memcpy(d->h_meta, map + r0, (size_t)m * sizeof(int));
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                d->d_meta, d->h_meta, (size_t)m * sizeof(int),
                cudaMemcpyHostToDevice, d->stream));
        }
        if (status == BT_OK)
            status = cuda_rmsnorm(h_hidden ? d->d_hid : (float *)d_hidden,
                                  NULL, d->d_final_norm,
                                  h_hidden ? NULL : d->d_meta, m, d->dim,
                                  d->eps, d->d_hfeat, d->dt, d->stream);
        for (int c0 = 0; c0 < m && status == BT_OK;
             c0 += CUDA_DRAFT_LOGIT_ROWS) {
            int k = BT_MIN(CUDA_DRAFT_LOGIT_ROWS, m - c0);

            status = worker_gemm(d->gemm, k, d->vocab, d->dim,
                                 (const char *)d->d_hfeat +
                                     (size_t)c0 * d->dim * es,
                                 d->d_cls, d->dt, d->d_logits, CUDA_DT_F32,
                                 false, d->stream);
            if (status == BT_OK)
                status = cuda_argmax(d->d_logits, k, d->vocab,
                                     d->d_top_ids + c0, d->stream);
            while (status == BT_OK && fi < n_full &&
                   full_rows[fi] < r0 + c0 + k) {
                int row = full_rows[fi++];

                status = BT_CUDA_STATUS(cudaMemcpyAsync(
                    h_logits + (size_t)row * d->vocab,
                    d->d_logits + (size_t)(row - r0 - c0) * d->vocab,
                    (size_t)d->vocab * sizeof(float),
                    cudaMemcpyDeviceToHost, d->stream));
            }
        }
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                argmax + r0, d->d_top_ids, (size_t)m * sizeof(int),
                cudaMemcpyDeviceToHost, d->stream));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(d->stream));
    }
    if (status != BT_OK)
        (void)cudaStreamSynchronize(d->stream);
    return status;
}

bt_status_t cuda_draft_target_argmax(cuda_draft_t *d, int n,
                                     const float *h_hidden, int *argmax,
                                     int n_full, const int *full_rows,
                                     float *h_logits)
{
    return draft_target_argmax(d, n, h_hidden, NULL, NULL, argmax, n_full,
                               full_rows, h_logits);
}

bt_status_t cuda_draft_target_argmax_dev(cuda_draft_t *d, int n,
                                         const float *d_hidden,
                                         const int *map, int *argmax,
                                         int n_full, const int *full_rows,
                                         float *h_logits)
{
    if (d_hidden == NULL || map == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "device verification without device rows");
    return draft_target_argmax(d, n, NULL, d_hidden, map, argmax, n_full,
                               full_rows, h_logits);
}

void *cuda_draft_host_alloc(size_t bytes)
{
    void *p = NULL;

    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void cuda_draft_host_free(void *p)
{
    if (p != NULL)
        cudaFreeHost(p);
}

void cuda_draft_graph_stats(const cuda_draft_t *d, uint64_t *replays,
                            uint64_t *captures, uint64_t *eager,
                            uint64_t *gpu_ns)
{
    *replays = d->n_replay;
    *captures = d->n_capture;
    *eager = d->n_eager;
    *gpu_ns = d->gpu_ns;
}
