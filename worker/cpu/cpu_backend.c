/*
 * cpu_backend.c - the float32 CPU backend: weights, the paged KV pool and
 * the batched forward pass (see backend.h for the attention semantics).
 *
 * Precision bf16 keeps the float32 arithmetic but rounds the weights and,
 * wherever the CUDA backend stores bf16, the activations: the normed
 * inputs, the q/k/v and gate/up products, the K/V cache, the attention
 * and SwiGLU outputs (the residual stream and the logits stay float32, as
 * there).  It is the same-precision reference the GPU's bf16 path is
 * checked against (tests/gpu/test_cuda_model.c).
 *
 * create() converts every weight to float32 once, fuses wq/wk/wv into one
 * matrix and w_gate/w_up into another (rows interleaved gate_i, up_i), and
 * packs every matrix into panels (cpu__pack: 16 output rows, k-major) for
 * the register-blocked matmul kernels; the forward pass never reads the
 * model's own tensors except the embedding rows.  The forward pass
 * flattens the batch into one (n_tok, dim) matrix: the matmuls see many
 * tokens at once, and only attention and the KV writes look at sequence
 * boundaries.
 *
 * Precision fp8 is bf16 mode plus FP8 E4M3 at the four GEMMs of a layer
 * (q/k/v, o, gate/up, down): the weights are E4M3 values with a scale per
 * output row (a per-tensor checkpoint repeats its scale), the GEMM input
 * is rounded to E4M3 after dividing by its scale (the checkpoint's static
 * input_scale, or per token absmax / 448), the products are summed in
 * float32 (a product of two E4M3 values is exact there) and the sum is
 * multiplied by input scale x weight scale, as an FP8 tensor-core GEMM
 * with a scaled epilogue computes it.  --kv-dtype fp8 stores K/V as E4M3
 * bytes (scale per layer and KV head); attention dequantizes the rows it
 * reads into float32 scratch and computes in float32.
 *
 * Threads, two ways:
 *   - sequence split (batches of several sequences, no on_layer_done):
 *     the batch is cut into chunks of whole sequences and each thread runs
 *     the *whole* forward pass (every layer, the classifier) for the
 *     chunks it takes, so a step costs one pool hand-off instead of one
 *     per op.  Sequences never read each other's new slots (backend.h),
 *     and small models' weights stay in every core's cache, so nothing is
 *     shared but the read-only weights.  Chunks are taken dynamically: a
 *     thread that lost its core to another process delays the step by at
 *     most the chunk it holds.
 *   - op split (one long prompt, or a caller that streams KV per layer):
 *     every op is split across the pool by a work estimate.
 * Tiny work (a 64-dim model at batch 1) stays on the calling thread and
 * costs no synchronisation.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_fp8.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cpu_int.h"

/* Multiply-adds below which an op is not worth waking another thread for.
 * A join costs about a microsecond on idle cores but a scheduler time
 * slice when the cores are shared, so the bar is high: on aidreams260K
 * (2-core box, bench-engine) batch <= 16 stays on one thread, which was
 * as fast or faster in every measurement.  BT_CPU_MIN_WORK overrides it
 * (tests set 1 to split every op). */
#define CPU_MIN_WORK_PER_THREAD 262144
#define CPU_MIN_WORK_ENV "BT_CPU_MIN_WORK"

/* Query tokens of one sequence per attention work item: bounds the score
 * scratch (CPU_ATTN_CHUNK x context per thread) and splits long prompts
 * into pieces the threads can share. */
#define CPU_ATTN_CHUNK 16

/* Sequence split: the batch is cut into about CPU_CHUNKS_PER_THREAD
 * chunks per thread (whole sequences, at least CPU_CHUNK_MIN_TOKENS
 * tokens each): enough that the threads balance and a preempted one holds
 * up little, few enough that each chunk fills the matmul tiles.
 * BT_CPU_SPLIT=ops turns the sequence split off, BT_CPU_SPLIT=seqs uses
 * it whenever it applies, without measuring (tests). */
#define CPU_CHUNKS_PER_THREAD 2
#define CPU_CHUNK_MIN_TOKENS 4
#define CPU_SPLIT_ENV "BT_CPU_SPLIT"

/* Sequence split or one thread: measured, not guessed.  On a box whose
 * cores are busy with other processes a worker is often not running when
 * a step needs it; the caller then waits up to a scheduler time slice
 * for it, and a split step takes milliseconds instead of 100 us.  So the
 * backend keeps a running mean of the step time per token of each mode
 * and uses the faster.  Every `explore` steps it runs CPU_EXPLORE_STEPS
 * steps of the other mode (the first only wakes the workers and is not
 * timed) to refresh that mode's figure.  A swap back after the mode in
 * use falls 10% behind, or a probe that loses, doubles the period (up to
 * CPU_EXPLORE_MAX, about half a second), so flapping dies out and on a
 * loaded box the probes of the split cost a few percent at most, while a
 * box that becomes idle is noticed within a second. */
#define CPU_EXPLORE_FIRST 8
#define CPU_EXPLORE_MIN 32
#define CPU_EXPLORE_MAX 2048
#define CPU_EXPLORE_STEPS 4
/* The figures are kept per batch-size class (tokens 1, 2-3, 4-7, ...,
 * >= 128): a prefill step and a decode step of the same model differ in
 * cost per token and in what threads buy. */
#define CPU_MODE_CLASSES 8

/* Matrices are packed (cpu__pack) forms of the shapes given. */
typedef struct {
    const float *attn_norm; /* (dim) */
    const float *wqkv;      /* packed (q_dim + 2 * kv_dim, dim) rows q, k, v */
    const float *bqkv;      /* (q_dim + 2 * kv_dim) or NULL */
    const float *wo;        /* packed (dim, q_dim) */
    const float *ffn_norm;  /* (dim) */
    const float *wgu;       /* packed (2 * hidden_dim, dim) rows gate_0,
                               up_0, gate_1, ... */
    const float *w_down;    /* packed (dim, hidden_dim) */
    /* fp8: per output row weight scales of the four GEMMs (the packed
     * matrices then hold E4M3 values) and their static input scales
     * (0 = dynamic per token) */
    const float *ws[BACKEND_CALIB_GEMMS]; /* qkv, o, gate/up, down */
    float in_scale[BACKEND_CALIB_GEMMS];
    float *kv_scale;        /* kv8: (2, n_kv_heads) K then V scales */
} cpu_layer_t;

/* The GEMMs of a layer, in the order of cpu_layer_t.ws and of the
 * calibration statistics. */
enum { CPU_GEMM_QKV = 0, CPU_GEMM_O, CPU_GEMM_GU, CPU_GEMM_DOWN };

/* Step-mode statistics of one batch-size class: one thread (mode 0) or
 * the sequence split (mode 1), see CPU_EXPLORE_*. */
typedef struct {
    double step_ns[2];        /* mean step ns per token; 0 = not measured */
    int mode;                 /* the faster mode, in use */
    int explore;              /* steps between explorations */
    int until_explore;        /* steps left before the next */
    int exploring;            /* steps left in the current exploration */
    double explore_sum;       /* its timed ns per token, summed */
    int explore_n;            /* its timed steps */
} cpu_mode_stat_t;

/* A run of whole sequences of the flattened batch and what belongs to
 * them. */
typedef struct {
    int s0, s1;             /* sequences [s0, s1) */
    int t0, t1;             /* their batch tokens */
    int r0, r1;             /* their logits rows */
    int i0, i1;             /* their attention items */
} cpu_range_t;

/* One attention work item: query tokens [i0, i0 + n_q) of sequence seq,
 * the query heads of KV head kv_head; kv_head -1: the sequence's one
 * decode token (no mask), every head at once (cpu__attention_decode). */
typedef struct {
    int seq;
    int kv_head;
    int i0;
    int n_q;
} cpu_attn_item_t;

typedef struct {
    model_config_t cfg;       /* the model's shape */
    backend_config_t bcfg;    /* sizes this backend was created with */
    int q_dim;                /* n_heads * head_dim */
    int kv_dim;               /* n_kv_heads * head_dim */
    int qkv_dim;              /* q_dim + 2 * kv_dim */
    int max_ctx;              /* most slots one sequence can have */
    double min_work;          /* multiply-adds per extra thread */
    bool split_seqs;          /* sequence split allowed (BT_CPU_SPLIT) */
    bool split_always;        /* ... and always used (BT_CPU_SPLIT=seqs) */
    bool bf16;                /* precision bf16: weights and activations
                                 rounded where the CUDA backend keeps bf16
                                 (also set in fp8) */
    bool fp8;                 /* precision fp8: E4M3 GEMMs */
    bool kv8;                 /* K/V stored as E4M3 bytes */
    bool kv_round_bf16;       /* K/V rounded to bf16 (--kv-dtype bf16) */
    backend_calib_t *calib;   /* calibration statistics or NULL */
    cpu_mode_stat_t modes[CPU_MODE_CLASSES]; /* by batch-size class */
    double tok_work;          /* matmul multiply-adds per token */
    const float *tok_emb;     /* (vocab, dim) */
    const float *final_norm;  /* (dim) */
    const float *cls;         /* packed (vocab, dim) */
    cpu_layer_t *layers;      /* (n_layers) */
    void **owned;             /* (n_owned) weight buffers we allocated */
    int n_owned;
    kv_layout_t kv_layout;    /* f32 or E4M3 (elem_size 4 or 1),
                                 (layers, blocks, bs, kv_heads, hd) */
    float *k_cache;           /* (n_layers, n_blocks, bs, n_kv_heads, hd);
                                 kv8: E4M3 bytes of that shape */
    float *v_cache;           /* (n_layers, n_blocks, bs, n_kv_heads, hd) */
    float *kvg;               /* kv8: (n_threads, 2, max_ctx, kv_dim) K/V
                                 rows dequantized for attention */
    float *xq;                /* fp8: (max_tok, max_k) E4M3 GEMM inputs */
    float *xs;                /* fp8: (max_tok) their scales */
    float *mmo;               /* fp8: (max_tok, dim) residual GEMM sums */
    int max_k;                /* largest GEMM input width */
    float *inv_freq;          /* (head_dim / 2) RoPE frequencies */
    cpu_pool_t *pool;

    /* scratch for max_batch_tokens rows */
    float *x;                 /* (max_tok, dim) residual stream */
    float *xb;                /* (max_tok, dim) normed input of a block */
    float *qkv;               /* (max_tok, qkv_dim) */
    float *att;               /* (max_tok, q_dim) attention output */
    float *gu;                /* (max_tok, 2 * hidden_dim) gate/up pairs */
    float *hb;                /* (max_tok, hidden_dim) SwiGLU output */
    float *xf;                /* (max_tok, dim) final-normed logits rows */
    float *rope_cos;          /* (max_tok, head_dim / 2) */
    float *rope_sin;          /* (max_tok, head_dim / 2) */
    int *tok_seq;             /* (max_tok) sequence of each batch token */
    int *tok_idx;             /* (max_tok) index inside its sequence */
    int *tok_pos;             /* (max_tok) RoPE position */
    int *seq_first_tok;       /* (max_seqs) batch row of a sequence's first
                                 new token */
    cpu_range_t *chunks;      /* (max_seqs) sequence-split chunks */
    int *logit_tok;           /* (max_tok) batch token of each logits row */
    cpu_attn_seq_t *attn_seqs;/* (max_seqs) per-sequence attention view */
    cpu_attn_item_t *items;   /* (max_tok * n_kv_heads) attention work */
    float *scores;            /* (n_threads, scores_ld) attention scratch */
    size_t scores_ld;         /* max(CPU_ATTN_CHUNK * max_ctx,
                                 CPU_ATTN_DECODE_SCRATCH(max_ctx)) */
    float *tmp;               /* (n_threads, tmp_ld) SwiGLU scratch */
    int tmp_ld;               /* hidden_dim rounded up to a cache line */
} cpu_backend_t;

// ----------------------------------------------------------------------------
// ops over a range of the batch

/* Threads worth using for `work` multiply-adds. */
static int cpu_nth(const cpu_backend_t *be, double work)
{
    double n = work / be->min_work;
    int size = cpu__pool_size(be->pool);

    return n < 1.0 ? 1 : n > (double)size ? size : (int)n;
}

typedef struct {
    float *out;          /* (n_tok, ldo) */
    int ldo;
    const float *x;      /* (n_tok, ldx) */
    int ldx;
    const float *w;      /* packed (n_out, k) */
    const float *bias;   /* (n_out) or NULL */
    int n_tok;
    int k;
    int n_out;
    bool accumulate;
    float *swiglu_out;   /* (n_tok, n_out / 2) or NULL: apply SwiGLU */
    bool round_bf16;     /* round out (and swiglu_out) to bf16 */
    float *tmp;          /* (n_threads, tmp_ld) SwiGLU scratch */
    int tmp_ld;          /* >= n_out / 2, whole cache lines */
    /* fp8: x holds E4M3 values; the sum of row t, output n is scaled by
     * xs[t] * ws[n] (+ bias[n]); an accumulating product is summed into
     * acc first (acc_ld floats a row) */
    const float *ws;     /* (n_out) or NULL: not fp8 */
    const float *xs;     /* (n_tok) */
    float *acc;          /* (n_tok, acc_ld) */
    int acc_ld;
} cpu_matmul_job_t;

/* fp8 GEMM of outputs [n0, n1): the E4M3 products summed in float32, then
 * the scaled epilogue (see cpu_matmul_job_t). */
static void cpu_matmul_fp8(const cpu_matmul_job_t *j, int n0, int n1)
{
    float *dst = j->accumulate ? j->acc : j->out;
    int ldd = j->accumulate ? j->acc_ld : j->ldo;

    cpu__matmul_packed(dst, ldd, j->x, j->ldx, j->w, j->n_out, NULL,
                       j->n_tok, j->k, n0, n1, false);
    cpu__fp8_epilogue(j->out, j->ldo, dst, ldd, j->xs, j->ws, j->bias,
                      j->n_tok, n0, n1, j->accumulate);
}

/* Part `part` of `n_parts` of a matmul (whole panels), with SwiGLU
 * scratch row `slot`. */
static void cpu_matmul_part(const cpu_matmul_job_t *j, int part, int n_parts,
                            int slot)
{
    int chunk = BT_DIV_UP(BT_DIV_UP(j->n_out, n_parts), CPU_PACK_NR) *
                CPU_PACK_NR;
    int n0 = BT_MIN(part * chunk, j->n_out);
    int n1 = BT_MIN(n0 + chunk, j->n_out);

    if (n0 >= n1)
        return;
    if (j->ws != NULL)
        cpu_matmul_fp8(j, n0, n1);
    else
        cpu__matmul_packed(j->out, j->ldo, j->x, j->ldx, j->w, j->n_out,
                           j->bias, j->n_tok, j->k, n0, n1, j->accumulate);
    if (j->round_bf16)
        cpu__round_bf16_rows(j->out + n0, (size_t)j->ldo, j->n_tok, n1 - n0);
    if (j->swiglu_out != NULL) {
        int half = j->n_out / 2;

        for (int t = 0; t < j->n_tok; t++)
            cpu__swiglu(j->swiglu_out + (size_t)t * half + n0 / 2,
                        j->out + (size_t)t * j->ldo + n0, (n1 - n0) / 2,
                        j->tmp + (size_t)slot * j->tmp_ld);
        if (j->round_bf16)
            cpu__round_bf16_rows(j->swiglu_out + n0 / 2, (size_t)half,
                                 j->n_tok, (n1 - n0) / 2);
    }
}

static void cpu_matmul_task(void *arg, int ith, int nth)
{
    cpu_matmul_part(arg, ith, nth, ith);
}

/* out[t0..t1) = x[t0..t1) @ w^T: split over the pool when `par`, else on
 * the calling thread `ith`.  In bf16 mode a product is rounded unless it
 * is a residual add (accumulate) or f32_out (the logits), as the CUDA
 * backend's GEMM output.  `gemm` (CPU_GEMM_*, or -1 for the classifier)
 * of layer `lw` selects the fp8 scales and the calibration statistic. */
static void cpu_matmul_rows(cpu_backend_t *be, const cpu_range_t *r,
                            bool par, int ith, float *out, int ldo,
                            const float *x, int ldx, const float *w,
                            const float *bias, int k, int n_out,
                            bool accumulate, bool f32_out, float *swiglu_out,
                            const cpu_layer_t *lw, int gemm)
{
    int n_tok = r->t1 - r->t0;
    cpu_matmul_job_t j = {
        out + (size_t)r->t0 * ldo, ldo, x + (size_t)r->t0 * ldx, ldx, w,
        bias, n_tok, k, n_out, accumulate,
        swiglu_out != NULL ? swiglu_out + (size_t)r->t0 * (n_out / 2) : NULL,
        be->bf16 && !accumulate && !f32_out, be->tmp, be->tmp_ld,
        NULL, NULL, NULL, 0 };

    if (be->calib != NULL && gemm >= 0) {
        backend_calib_stat_t *st =
            &be->calib->stats[(size_t)(lw - be->layers) *
                                  BACKEND_CALIB_PER_LAYER(be->cfg.n_kv_heads) +
                              gemm];

        for (int t = r->t0; t < r->t1; t++)
            backend_calib_add(st, x + (size_t)t * ldx, (size_t)k);
    }
    if (be->fp8 && gemm >= 0) {
        cpu__fp8_quant_rows(be->xq + (size_t)r->t0 * k, be->xs + r->t0,
                            x + (size_t)r->t0 * ldx, ldx, n_tok, k,
                            lw->in_scale[gemm]);
        j.x = be->xq + (size_t)r->t0 * k;
        j.ldx = k;
        j.ws = lw->ws[gemm];
        j.xs = be->xs + r->t0;
        j.acc = be->mmo + (size_t)r->t0 * be->cfg.dim;
        j.acc_ld = be->cfg.dim;
    }

    if (par)
        cpu__pool_run(be->pool, cpu_nth(be, (double)n_tok * n_out * k),
                      cpu_matmul_task, &j);
    else
        cpu_matmul_part(&j, 0, 1, ith);
}

typedef struct {
    cpu_backend_t *be;
    const float *in;     /* (n_tok, dim) */
    float *out;          /* (n_tok, dim) */
    const float *weight; /* (dim) */
    int t0, t1;          /* rows */
} cpu_norm_job_t;

static void cpu_norm_task(void *arg, int ith, int nth)
{
    const cpu_norm_job_t *j = arg;
    int dim = j->be->cfg.dim;
    int n = j->t1 - j->t0;
    int t0 = j->t0 + (int)((long)n * ith / nth);
    int t1 = j->t0 + (int)((long)n * (ith + 1) / nth);

    for (int t = t0; t < t1; t++) {
        cpu__rmsnorm(j->out + (size_t)t * dim, j->in + (size_t)t * dim,
                     j->weight, dim, j->be->cfg.rms_eps);
        if (j->be->bf16)
            cpu__round_bf16(j->out + (size_t)t * dim, (size_t)dim);
    }
}

static void cpu_norm_rows(cpu_backend_t *be, const cpu_range_t *r, bool par,
                          const float *in, float *out, const float *weight)
{
    cpu_norm_job_t j = { be, in, out, weight, r->t0, r->t1 };

    if (par)
        cpu__pool_run(be->pool,
                      cpu_nth(be, 4.0 * (r->t1 - r->t0) * be->cfg.dim),
                      cpu_norm_task, &j);
    else
        cpu_norm_task(&j, 0, 1);
}

typedef struct {
    cpu_backend_t *be;
    const backend_batch_t *batch;
    int layer;
    cpu_range_t r;
    atomic_int next;     /* next attention item to take (op split) */
} cpu_layer_job_t;

/* kv8: one token's K (or V) row as E4M3 codes, head h divided by
 * scale[h]. */
static void cpu_store_kv8(uint8_t *dst, const float *src, const float *scale,
                          const cpu_backend_t *be)
{
    int hd = be->cfg.head_dim;

    for (int h = 0; h < be->cfg.n_kv_heads; h++) {
        float inv = 1.0f / scale[h];

        for (int i = 0; i < hd; i++)
            dst[h * hd + i] = bt_f32_to_e4m3(src[h * hd + i] * inv);
    }
}

/* Calibration: one token's K and V rows into the per-head statistics. */
static void cpu_calib_kv(cpu_backend_t *be, int layer, const float *k,
                         const float *v)
{
    int nkv = be->cfg.n_kv_heads, hd = be->cfg.head_dim;
    backend_calib_stat_t *st =
        &be->calib->stats[(size_t)layer * BACKEND_CALIB_PER_LAYER(nkv) +
                          BACKEND_CALIB_GEMMS];

    for (int h = 0; h < nkv; h++) {
        backend_calib_add(&st[h], k + h * hd, (size_t)hd);
        backend_calib_add(&st[nkv + h], v + h * hd, (size_t)hd);
    }
}

/* RoPE on q and k of each token, then K/V into the token's cache slot.
 * bf16 (as the CUDA backend's rope_kv): the bias added to the rounded
 * product here, in float32, and q, k and v rounded after RoPE. */
static void cpu_rope_kv_task(void *arg, int ith, int nth)
{
    const cpu_layer_job_t *j = arg;
    cpu_backend_t *be = j->be;
    const model_config_t *c = &be->cfg;
    /* bf16: the bias, left out of the q/k/v product (cpu_layer) */
    const float *bias = be->bf16 ? be->layers[j->layer].bqkv : NULL;
    int half = c->head_dim / 2;
    int n = j->r.t1 - j->r.t0;
    int t0 = j->r.t0 + (int)((long)n * ith / nth);
    int t1 = j->r.t0 + (int)((long)n * (ith + 1) / nth);

    for (int t = t0; t < t1; t++) {
        const backend_seq_t *seq = &j->batch->seqs[be->tok_seq[t]];
        float *q = be->qkv + (size_t)t * be->qkv_dim;
        float *k = q + be->q_dim;
        float *v = k + be->kv_dim;
        int slot = seq->ctx_len + be->tok_idx[t];
        int block = seq->block_table[slot / be->bcfg.block_size];
        size_t off = kv_layout_offset(&be->kv_layout, j->layer, block,
                                      slot % be->bcfg.block_size);

        if (bias != NULL)
            for (int i = 0; i < be->qkv_dim; i++)
                q[i] += bias[i];
        cpu__rope_apply(q, c->n_heads, c->head_dim, c->rope_layout,
                        be->rope_cos + (size_t)t * half,
                        be->rope_sin + (size_t)t * half);
        cpu__rope_apply(k, c->n_kv_heads, c->head_dim, c->rope_layout,
                        be->rope_cos + (size_t)t * half,
                        be->rope_sin + (size_t)t * half);
        if (be->bf16)
            cpu__round_bf16(q, (size_t)be->qkv_dim);
        else if (be->kv_round_bf16)
            cpu__round_bf16(k, 2 * (size_t)be->kv_dim);
        if (be->calib != NULL)
            cpu_calib_kv(be, j->layer, k, v);
        if (be->kv8) {
            cpu_store_kv8((uint8_t *)be->k_cache + off, k,
                          be->layers[j->layer].kv_scale, be);
            cpu_store_kv8((uint8_t *)be->v_cache + off, v,
                          be->layers[j->layer].kv_scale + c->n_kv_heads, be);
            continue;
        }
        memcpy(be->k_cache + off, k, (size_t)be->kv_dim * sizeof(float));
        memcpy(be->v_cache + off, v, (size_t)be->kv_dim * sizeof(float));
    }
}

/* kv8: the K/V rows of one sequence (view) in layer `layer`, dequantized
 * into thread `slot`'s scratch as one contiguous block, and the view
 * pointed at it: every KV head when kv_head < 0 (decode), else only
 * kv_head (the view's kv_row becomes head_dim). */
static void cpu_gather_kv8(cpu_backend_t *be, int layer, cpu_attn_seq_t *view,
                           int kv_head, int slot)
{
    static const int block0 = 0;
    const model_config_t *c = &be->cfg;
    const float *ks = be->layers[layer].kv_scale;
    const float *vs = ks + c->n_kv_heads;
    int n = view->ctx_len + view->n_new, hd = c->head_dim;
    int h0 = kv_head < 0 ? 0 : kv_head;
    int h1 = kv_head < 0 ? c->n_kv_heads : kv_head + 1;
    int row = (h1 - h0) * hd;
    float *kd = be->kvg + (size_t)slot * 2 * be->max_ctx * be->kv_dim;
    float *vd = kd + (size_t)be->max_ctx * be->kv_dim;

    for (int p = 0; p < n; p++) {
        int block = view->block_table[p / view->block_size];
        size_t off = kv_layout_offset(&be->kv_layout, layer, block,
                                      p % view->block_size);
        const uint8_t *kr = (const uint8_t *)be->k_cache + off;
        const uint8_t *vr = (const uint8_t *)be->v_cache + off;

        for (int h = h0; h < h1; h++) {
            float *kdst = kd + (size_t)p * row + (h - h0) * hd;
            float *vdst = vd + (size_t)p * row + (h - h0) * hd;

            for (int i = 0; i < hd; i++) {
                kdst[i] = bt_e4m3_to_f32(kr[h * hd + i]) * ks[h];
                vdst[i] = bt_e4m3_to_f32(vr[h * hd + i]) * vs[h];
            }
        }
    }
    view->k_layer = kd;
    view->v_layer = vd;
    view->block_table = &block0;
    view->block_size = be->max_ctx;
    view->kv_row = row;
}

/* Attention work item `it` in layer `layer`, with the score scratch of
 * thread `slot`.  The sequence's view is copied and pointed at the layer
 * here, so threads at different layers never write shared state. */
static void cpu_attention_item(cpu_backend_t *be, int layer, int it,
                               int slot)
{
    const model_config_t *c = &be->cfg;
    int group = c->n_heads / c->n_kv_heads;
    float *scratch = be->scores + (size_t)slot * be->scores_ld;
    const cpu_attn_item_t *item = &be->items[it];
    size_t layer_off = kv_layout_offset(&be->kv_layout, layer, 0, 0);
    cpu_attn_seq_t view = be->attn_seqs[item->seq];
    /* batch row of the item's first token */
    int t = be->seq_first_tok[item->seq] + item->i0;
    size_t head = (size_t)item->kv_head * group * c->head_dim;

    if (!be->kv8) {
        view.k_layer = be->k_cache + layer_off;
        view.v_layer = be->v_cache + layer_off;
    } else {
        cpu_gather_kv8(be, layer, &view, item->kv_head, slot);
        if (item->kv_head >= 0) { /* the view holds that head alone */
            cpu__attention(be->att + (size_t)t * be->q_dim + head, be->q_dim,
                           be->qkv + (size_t)t * be->qkv_dim + head,
                           be->qkv_dim, &view, 0, group, item->i0, item->n_q,
                           scratch);
            if (be->bf16)
                cpu__round_bf16_rows(be->att + (size_t)t * be->q_dim + head,
                                     (size_t)be->q_dim, item->n_q,
                                     group * c->head_dim);
            return;
        }
    }
    if (item->kv_head < 0) {
        cpu__attention_decode(be->att + (size_t)t * be->q_dim,
                              be->qkv + (size_t)t * be->qkv_dim, &view,
                              c->n_kv_heads, group, scratch);
        if (be->bf16)
            cpu__round_bf16(be->att + (size_t)t * be->q_dim,
                            (size_t)be->q_dim);
        return;
    }
    cpu__attention(be->att + (size_t)t * be->q_dim + head, be->q_dim,
                   be->qkv + (size_t)t * be->qkv_dim + head, be->qkv_dim,
                   &view, item->kv_head, group, item->i0, item->n_q,
                   scratch);
    if (be->bf16)
        cpu__round_bf16_rows(be->att + (size_t)t * be->q_dim + head,
                             (size_t)be->q_dim, item->n_q,
                             group * c->head_dim);
}

/* Attention items, taken dynamically: their costs differ (context
 * lengths, causal chunks), and each item's result does not depend on the
 * thread that computes it. */
static void cpu_attention_task(void *arg, int ith, int nth)
{
    cpu_layer_job_t *j = arg;
    int it;

    (void)nth;
    while ((it = atomic_fetch_add_explicit(&j->next, 1,
                                           memory_order_relaxed)) < j->r.i1)
        cpu_attention_item(j->be, j->layer, it, ith);
}

/* One transformer layer for the tokens of range r: every op split over
 * the pool when `par`, else all on the calling thread `ith`. */
static void cpu_layer(cpu_backend_t *be, const backend_batch_t *batch,
                      int l, const cpu_range_t *r, bool par, int ith,
                      double attn_work)
{
    const model_config_t *c = &be->cfg;
    const cpu_layer_t *w = &be->layers[l];
    int dim = c->dim;
    cpu_layer_job_t lj = { be, batch, l, *r, r->i0 };

    /* attention block */
    cpu_norm_rows(be, r, par, be->x, be->xb, w->attn_norm);
    /* bf16: the bias is added after the product's rounding, with RoPE */
    cpu_matmul_rows(be, r, par, ith, be->qkv, be->qkv_dim, be->xb, dim,
                    w->wqkv, be->bf16 ? NULL : w->bqkv, dim, be->qkv_dim,
                    false, false, NULL, w, CPU_GEMM_QKV);
    if (par)
        cpu__pool_run(be->pool, cpu_nth(be, 8.0 * (r->t1 - r->t0) *
                                            (be->q_dim + be->kv_dim)),
                      cpu_rope_kv_task, &lj);
    else
        cpu_rope_kv_task(&lj, 0, 1);
    if (batch->on_layer_done != NULL)
        batch->on_layer_done(batch->on_layer_arg, l);
    if (par) {
        cpu__pool_run(be->pool, cpu_nth(be, attn_work), cpu_attention_task,
                      &lj);
    } else {
        for (int it = r->i0; it < r->i1; it++)
            cpu_attention_item(be, l, it, ith);
    }
    cpu_matmul_rows(be, r, par, ith, be->x, dim, be->att, be->q_dim, w->wo,
                    NULL, be->q_dim, dim, true, false, NULL, w, CPU_GEMM_O);

    /* feed-forward block */
    cpu_norm_rows(be, r, par, be->x, be->xb, w->ffn_norm);
    cpu_matmul_rows(be, r, par, ith, be->gu, 2 * c->hidden_dim, be->xb, dim,
                    w->wgu, NULL, dim, 2 * c->hidden_dim, false, false,
                    be->hb, w, CPU_GEMM_GU);
    cpu_matmul_rows(be, r, par, ith, be->x, dim, be->hb, c->hidden_dim,
                    w->w_down, NULL, c->hidden_dim, dim, true, false, NULL, w,
                    CPU_GEMM_DOWN);
}

/* The logits rows of range r: hidden copy, final norm, classifier. */
static void cpu_final(cpu_backend_t *be, const cpu_range_t *r, bool par,
                      int ith, float *logits, float *hidden)
{
    const model_config_t *c = &be->cfg;
    int dim = c->dim;
    /* the classifier reads rows [r0, r1) of xf as batch rows */
    cpu_range_t rows = { r->s0, r->s1, r->r0, r->r1, 0, 0, 0, 0 };

    if (r->r0 >= r->r1)
        return;
    for (int row = r->r0; row < r->r1; row++) {
        const float *xr = be->x + (size_t)be->logit_tok[row] * dim;

        if (hidden != NULL)
            memcpy(hidden + (size_t)row * dim, xr,
                   (size_t)dim * sizeof(float));
        cpu__rmsnorm(be->xf + (size_t)row * dim, xr, be->final_norm, dim,
                     c->rms_eps);
        if (be->bf16)
            cpu__round_bf16(be->xf + (size_t)row * dim, (size_t)dim);
    }
    cpu_matmul_rows(be, &rows, par, ith, logits, c->vocab_size, be->xf, dim,
                    be->cls, NULL, dim, c->vocab_size, false, true, NULL,
                    NULL, -1);
}

/* The tokens of range r enter the residual stream: embedding rows, and
 * the RoPE cos/sin of their positions (shared by every layer). */
static void cpu_embed_rows(cpu_backend_t *be, const backend_batch_t *batch,
                           const cpu_range_t *r)
{
    int dim = be->cfg.dim;
    int half = be->cfg.head_dim / 2;

    for (int t = r->t0; t < r->t1; t++) {
        const backend_seq_t *seq = &batch->seqs[be->tok_seq[t]];

        cpu__embed(be->x + (size_t)t * dim, be->tok_emb, dim,
                   seq->tokens[be->tok_idx[t]]);
        cpu__rope_cos_sin(be->tok_pos[t], be->inv_freq, half,
                          be->rope_cos + (size_t)t * half,
                          be->rope_sin + (size_t)t * half);
    }
}

typedef struct {
    cpu_backend_t *be;
    const backend_batch_t *batch;
    float *logits;
    float *hidden;
    int n_chunks;
    atomic_int next;     /* next chunk to take */
} cpu_chunk_job_t;

/* Sequence split: take chunks until none are left; run every layer and
 * the classifier for each on this thread. */
static void cpu_chunk_task(void *arg, int ith, int nth)
{
    cpu_chunk_job_t *j = arg;
    int ch;

    (void)nth;
    while ((ch = atomic_fetch_add_explicit(&j->next, 1,
                                           memory_order_relaxed)) <
           j->n_chunks) {
        const cpu_range_t *r = &j->be->chunks[ch];

        cpu_embed_rows(j->be, j->batch, r);
        for (int l = 0; l < j->be->cfg.n_layers; l++)
            cpu_layer(j->be, j->batch, l, r, false, ith, 0.0);
        cpu_final(j->be, r, false, ith, j->logits, j->hidden);
    }
}

/* Runs the chunks of a sequence-split step on nth threads or on the
 * calling thread, whichever has been faster lately (see CPU_EXPLORE_*). */
static void cpu_run_chunks(cpu_backend_t *be, cpu_chunk_job_t *j, int nth,
                           int n_tok)
{
    cpu_mode_stat_t *ms;
    int mode, cls = 0;
    bool timed = true;
    uint64_t t0;
    double per;

    if (be->split_always) {
        cpu__pool_run(be->pool, nth, cpu_chunk_task, j);
        return;
    }
    while ((2 << cls) <= n_tok && cls < CPU_MODE_CLASSES - 1)
        cls++;
    ms = &be->modes[cls];
    mode = ms->mode;
    if (ms->exploring > 0) {
        mode = !ms->mode;
        timed = ms->exploring < CPU_EXPLORE_STEPS; /* first: warm-up */
        ms->exploring--;
    } else if (--ms->until_explore <= 0) {
        ms->exploring = CPU_EXPLORE_STEPS;
        ms->explore_sum = 0.0;
        ms->explore_n = 0;
    }
    t0 = bt_time_ns();
    if (mode == 1)
        cpu__pool_run(be->pool, nth, cpu_chunk_task, j);
    else
        cpu_chunk_task(j, 0, 1);
    per = (double)(bt_time_ns() - t0) / n_tok;

    if (mode == ms->mode) {
        double *m = &ms->step_ns[mode];
        double other = ms->step_ns[!mode];

        *m = *m == 0.0 ? per : *m + (per - *m) / 16.0;
        if (other > 0.0 && *m > 1.1 * other) { /* lost its lead: swap */
            BT_LOG_DEBUG("CPU", "%d+ tokens: step mode %s (%.0f vs %.0f "
                         "ns/token)", 1 << cls,
                         mode ? "one thread" : "split", other, *m);
            ms->mode = !mode;
            ms->explore = BT_MIN(2 * ms->explore, CPU_EXPLORE_MAX);
            ms->until_explore = ms->explore;
        }
        return;
    }
    if (timed) {
        ms->explore_sum += per;
        ms->explore_n++;
    }
    if (ms->exploring == 0 && ms->explore_n > 0) {
        ms->step_ns[mode] = ms->explore_sum / ms->explore_n;
        if (ms->step_ns[mode] < ms->step_ns[ms->mode]) {
            BT_LOG_DEBUG("CPU", "%d+ tokens: step mode %s (%.0f vs %.0f "
                         "ns/token)", 1 << cls,
                         mode ? "split" : "one thread", ms->step_ns[mode],
                         ms->step_ns[ms->mode]);
            ms->mode = mode;
        } else {
            ms->explore = BT_MIN(2 * ms->explore, CPU_EXPLORE_MAX);
        }
        ms->until_explore = ms->explore;
    }
}

// ----------------------------------------------------------------------------
// forward

static bt_status_t cpu_forward(void *impl, const backend_batch_t *batch,
                               float *logits, float *hidden)
{
    cpu_backend_t *be = impl;
    const model_config_t *c = &be->cfg;
    int n_tok = 0, n_rows = 0, n_items = 0, n_chunks = 0;
    double attn_work = 0;
    cpu_range_t all;
    cpu_range_t *cur = NULL;   /* chunk being filled */
    int nth, chunk_tokens = 0;

    for (int s = 0; s < batch->n_seqs; s++)
        chunk_tokens += batch->seqs[s].n_tokens;
    chunk_tokens = BT_MAX(CPU_CHUNK_MIN_TOKENS,
                          BT_DIV_UP(chunk_tokens, CPU_CHUNKS_PER_THREAD *
                                                  cpu__pool_size(be->pool)));

    /* flatten the batch: token positions, logits rows, attention views
     * and work items once for every layer (embedding rows and RoPE angles
     * per chunk, in parallel: cpu_embed_rows); chunks of whole sequences
     * of >= chunk_tokens tokens */
    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *seq = &batch->seqs[s];

        if (cur == NULL || cur->t1 - cur->t0 >= chunk_tokens) {
            cur = &be->chunks[n_chunks++];
            *cur = (cpu_range_t){ s, s, n_tok, n_tok, n_rows, n_rows,
                                  n_items, n_items };
        }
        be->attn_seqs[s] = (cpu_attn_seq_t){
            .block_table = seq->block_table,
            .block_size = be->bcfg.block_size, .kv_row = be->kv_dim,
            .head_dim = c->head_dim, .ctx_len = seq->ctx_len,
            .n_new = seq->n_tokens, .mask = seq->mask };
        be->seq_first_tok[s] = n_tok;
        if (seq->n_tokens == 1 && seq->mask == NULL) { /* decode */
            be->items[n_items++] = (cpu_attn_item_t){ s, -1, 0, 1 };
        } else {
            for (int h = 0; h < c->n_kv_heads; h++)
                for (int i0 = 0; i0 < seq->n_tokens; i0 += CPU_ATTN_CHUNK)
                    be->items[n_items++] = (cpu_attn_item_t){
                        s, h, i0, BT_MIN(CPU_ATTN_CHUNK, seq->n_tokens - i0)
                    };
        }
        for (int i = 0; i < seq->n_tokens; i++, n_tok++) {
            int pos = seq->positions != NULL ? seq->positions[i]
                                             : seq->ctx_len + i;


            be->tok_seq[n_tok] = s;
            be->tok_idx[n_tok] = i;
            be->tok_pos[n_tok] = pos;
            if (i >= seq->n_tokens - seq->n_logits)
                be->logit_tok[n_rows++] = n_tok;
        }
        *cur = (cpu_range_t){ cur->s0, s + 1, cur->t0, n_tok, cur->r0,
                              n_rows, cur->i0, n_items };
        attn_work += (double)seq->n_tokens *
                     (seq->ctx_len + seq->n_tokens) * 2.0 * be->q_dim;
    }
    all = (cpu_range_t){ 0, batch->n_seqs, 0, n_tok, 0, n_rows, 0, n_items };

    /* sequence split: one pool hand-off for the whole step */
    nth = cpu_nth(be, n_tok * be->tok_work + attn_work);
    if (be->split_seqs && batch->on_layer_done == NULL && n_chunks >= 2 &&
        nth >= 2) {
        cpu_chunk_job_t j = { be, batch, logits, hidden, n_chunks, 0 };

        cpu_run_chunks(be, &j, BT_MIN(nth, n_chunks), n_tok);
        return BT_OK;
    }

    /* op split (or one thread) */
    cpu_embed_rows(be, batch, &all);
    for (int l = 0; l < c->n_layers; l++)
        cpu_layer(be, batch, l, &all, true, 0, attn_work);
    cpu_final(be, &all, true, 0, logits, hidden);
    return BT_OK;
}

// ----------------------------------------------------------------------------
// create / destroy

/* Remembers a buffer to free in destroy.  Takes ownership of `buf`. */
static bt_status_t cpu_own(cpu_backend_t *be, void *buf)
{
    void **owned = bt_realloc(be->owned, (size_t)(be->n_owned + 1) *
                                             sizeof(*owned), "cpu_weights");

    if (owned == NULL) {
        bt_free(buf);
        return BT_ERR_NO_MEMORY;
    }
    be->owned = owned;
    be->owned[be->n_owned++] = buf;
    return BT_OK;
}

/* A float32 view of `t`: the mapping itself when it is already F32, else
 * a converted copy owned by the backend (always a copy in bf16 mode, with
 * the values rounded to bf16). */
static bt_status_t cpu_weight_f32(cpu_backend_t *be, const model_tensor_t *t,
                                  const float **out_p)
{
    int64_t n = t->rows * t->cols;
    float *buf;
    bt_status_t status;

    if (t->dtype == MODEL_DTYPE_F32 && !be->bf16) {
        *out_p = t->data;
        return BT_OK;
    }
    buf = bt_malloc_aligned((size_t)n * sizeof(float), "cpu_weights");
    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    model_tensor_to_f32(t, 0, n, buf);
    if (be->bf16)
        cpu__round_bf16(buf, (size_t)n);
    status = cpu_own(be, buf);
    if (status != BT_OK)
        return status;
    *out_p = buf;
    return BT_OK;
}

/* The packed form of the (n_out, k) float32 matrix w, owned by the
 * backend; its values rounded to bf16 in bf16 mode. */
static bt_status_t cpu_pack_owned(cpu_backend_t *be, const float *w,
                                  int n_out, int k, const float **out_p)
{
    float *buf = bt_malloc_aligned(cpu__pack_size(n_out, k) * sizeof(float),
                                   "cpu_weights");
    bt_status_t status;

    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    cpu__pack(buf, w, k, n_out, k);
    if (be->bf16)
        cpu__round_bf16(buf, cpu__pack_size(n_out, k));
    status = cpu_own(be, buf);
    if (status != BT_OK)
        return status;
    *out_p = buf;
    return BT_OK;
}

/* The packed form of matrix tensor t (any dtype). */
static bt_status_t cpu_weight_packed(cpu_backend_t *be,
                                     const model_tensor_t *t,
                                     const float **out_p)
{
    float *tmp = NULL;
    bt_status_t status;

    if (t->dtype == MODEL_DTYPE_F32)
        return cpu_pack_owned(be, t->data, (int)t->rows, (int)t->cols,
                              out_p);
    tmp = bt_malloc_aligned((size_t)(t->rows * t->cols) * sizeof(float),
                            "cpu_weights");
    if (tmp == NULL)
        return BT_ERR_NO_MEMORY;
    model_tensor_to_f32(t, 0, t->rows * t->cols, tmp);
    status = cpu_pack_owned(be, tmp, (int)t->rows, (int)t->cols, out_p);
    bt_free(tmp);
    return status;
}

/* fp8: row `dst` (k floats, holding the f32 weight) becomes E4M3 values
 * and *scale_p its scale: the checkpoint's codes and scale for source row
 * `src` when the weight is FP8 there, else absmax / 448 of the row. */
static void cpu_fp8_row(float *dst, int k, const model_fp8_t *f8,
                        int64_t src, float *scale_p)
{
    float amax = 0.0f, s, inv;

    if (f8 != NULL && f8->codes != NULL) {
        const uint8_t *c = f8->codes + src * k;

        for (int i = 0; i < k; i++)
            dst[i] = bt_e4m3_to_f32(c[i]);
        *scale_p = f8->w_scale[f8->n_w_scale == 1 ? 0 : src];
        return;
    }
    for (int i = 0; i < k; i++)
        amax = fmaxf(amax, fabsf(dst[i]));
    s = bt_fp8_scale(amax);
    inv = 1.0f / s;
    for (int i = 0; i < k; i++)
        dst[i] = bt_fp8_round(dst[i] * inv);
    *scale_p = s;
}

/* A backend-owned array of n floats. */
static bt_status_t cpu_owned_f32(cpu_backend_t *be, size_t n, float **out_p)
{
    float *buf = bt_calloc(n > 0 ? n : 1, sizeof(float), "cpu_weights");
    bt_status_t status;

    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    status = cpu_own(be, buf);
    if (status != BT_OK)
        return status;
    *out_p = buf;
    return BT_OK;
}

/* fp8: the packed E4M3 form of linear `which` of a layer (o or down),
 * its row scales into *ws_p. */
static bt_status_t cpu_weight_packed_fp8(cpu_backend_t *be,
                                         const model_layer_t *ml,
                                         model_linear_t which,
                                         const float **out_p,
                                         const float **ws_p)
{
    const model_tensor_t *t = model_layer_linear(ml, which);
    int rows = (int)t->rows, k = (int)t->cols;
    float *tmp, *ws;
    bt_status_t status;

    status = cpu_owned_f32(be, (size_t)rows, &ws);
    if (status != BT_OK)
        return status;
    tmp = bt_malloc_aligned((size_t)rows * k * sizeof(float), "cpu_weights");
    if (tmp == NULL)
        return BT_ERR_NO_MEMORY;
    model_tensor_to_f32(t, 0, (int64_t)rows * k, tmp);
    for (int r = 0; r < rows; r++)
        cpu_fp8_row(tmp + (size_t)r * k, k, &ml->fp8[which], r, &ws[r]);
    status = cpu_pack_owned(be, tmp, rows, k, out_p);
    bt_free(tmp);
    *ws_p = ws;
    return status;
}

/* Fused q/k/v weights (and biases when the model has them). */
static bt_status_t cpu_fuse_qkv(cpu_backend_t *be, const model_layer_t *ml,
                                cpu_layer_t *cl)
{
    int dim = be->cfg.dim;
    const model_tensor_t *parts[3] = { &ml->wq, &ml->wk, &ml->wv };
    const model_tensor_t *biases[3] = { &ml->bq, &ml->bk, &ml->bv };
    int rows[3] = { be->q_dim, be->kv_dim, be->kv_dim };
    float *w, *b;
    bt_status_t status;
    size_t off = 0;

    w = bt_malloc_aligned((size_t)be->qkv_dim * dim * sizeof(float),
                          "cpu_weights");
    if (w == NULL)
        return BT_ERR_NO_MEMORY;
    for (int p = 0; p < 3; p++) {
        model_tensor_to_f32(parts[p], 0, (int64_t)rows[p] * dim, w + off);
        off += (size_t)rows[p] * dim;
    }
    if (be->fp8) {
        float *ws;
        int r = 0;

        status = cpu_owned_f32(be, (size_t)be->qkv_dim, &ws);
        if (status != BT_OK) {
            bt_free(w);
            return status;
        }
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < rows[p]; i++, r++)
                cpu_fp8_row(w + (size_t)r * dim, dim,
                            &ml->fp8[MODEL_LIN_Q + p], i, &ws[r]);
        cl->ws[CPU_GEMM_QKV] = ws;
        cl->in_scale[CPU_GEMM_QKV] = model_fp8_in_scale(ml, MODEL_LIN_Q, 3);
    }
    status = cpu_pack_owned(be, w, be->qkv_dim, dim, &cl->wqkv);
    bt_free(w);
    if (status != BT_OK)
        return status;
    cl->bqkv = NULL;
    if (!be->cfg.qkv_bias)
        return BT_OK;
    b = bt_calloc((size_t)be->qkv_dim, sizeof(float), "cpu_weights");
    if (b == NULL)
        return BT_ERR_NO_MEMORY;
    off = 0;
    for (int p = 0; p < 3; p++) {
        if (biases[p]->data != NULL)
            model_tensor_to_f32(biases[p], 0, rows[p], b + off);
        off += (size_t)rows[p];
    }
    if (be->bf16)
        cpu__round_bf16(b, (size_t)be->qkv_dim);
    status = cpu_own(be, b);
    if (status != BT_OK)
        return status;
    cl->bqkv = b;
    return BT_OK;
}

/* Fused gate/up weights, rows interleaved gate_0, up_0, gate_1, ... */
static bt_status_t cpu_fuse_gate_up(cpu_backend_t *be,
                                    const model_layer_t *ml, cpu_layer_t *cl)
{
    int dim = be->cfg.dim;
    int hidden = be->cfg.hidden_dim;
    float *w = bt_malloc_aligned((size_t)2 * hidden * dim * sizeof(float),
                                 "cpu_weights");
    bt_status_t status;

    if (w == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < hidden; i++) {
        model_tensor_to_f32(&ml->w_gate, (int64_t)i * dim, dim,
                            w + (size_t)(2 * i) * dim);
        model_tensor_to_f32(&ml->w_up, (int64_t)i * dim, dim,
                            w + (size_t)(2 * i + 1) * dim);
    }
    if (be->fp8) {
        float *ws;

        status = cpu_owned_f32(be, 2 * (size_t)hidden, &ws);
        if (status != BT_OK) {
            bt_free(w);
            return status;
        }
        for (int i = 0; i < hidden; i++) {
            cpu_fp8_row(w + (size_t)(2 * i) * dim, dim,
                        &ml->fp8[MODEL_LIN_GATE], i, &ws[2 * i]);
            cpu_fp8_row(w + (size_t)(2 * i + 1) * dim, dim,
                        &ml->fp8[MODEL_LIN_UP], i, &ws[2 * i + 1]);
        }
        cl->ws[CPU_GEMM_GU] = ws;
        cl->in_scale[CPU_GEMM_GU] = model_fp8_in_scale(ml, MODEL_LIN_GATE, 2);
    }
    status = cpu_pack_owned(be, w, 2 * hidden, dim, &cl->wgu);
    bt_free(w);
    return status;
}

static bt_status_t cpu_load_weights(cpu_backend_t *be, const model_t *model)
{
    const model_config_t *c = &be->cfg;
    bt_status_t status;

    status = cpu_weight_f32(be, model_tok_embedding(model), &be->tok_emb);
    if (status != BT_OK)
        return status;
    status = cpu_weight_f32(be, model_final_norm(model), &be->final_norm);
    if (status != BT_OK)
        return status;
    if (be->cfg.tied_embeddings ||
        model_classifier(model)->data == model_tok_embedding(model)->data)
        status = cpu_pack_owned(be, be->tok_emb, c->vocab_size, c->dim,
                                &be->cls);
    else
        status = cpu_weight_packed(be, model_classifier(model), &be->cls);
    if (status != BT_OK)
        return status;
    for (int l = 0; l < be->cfg.n_layers; l++) {
        const model_layer_t *ml = model_layer(model, l);
        cpu_layer_t *cl = &be->layers[l];

        if ((status = cpu_weight_f32(be, &ml->attn_norm, &cl->attn_norm)) ||
            (status = cpu_fuse_qkv(be, ml, cl)) ||
            (status = cpu_weight_f32(be, &ml->ffn_norm, &cl->ffn_norm)) ||
            (status = cpu_fuse_gate_up(be, ml, cl)))
            return status;
        if (be->fp8) {
            if ((status = cpu_weight_packed_fp8(be, ml, MODEL_LIN_O, &cl->wo,
                                                &cl->ws[CPU_GEMM_O])) ||
                (status = cpu_weight_packed_fp8(be, ml, MODEL_LIN_DOWN,
                                                &cl->w_down,
                                                &cl->ws[CPU_GEMM_DOWN])))
                return status;
            cl->in_scale[CPU_GEMM_O] = model_fp8_in_scale(ml, MODEL_LIN_O, 1);
            cl->in_scale[CPU_GEMM_DOWN] = model_fp8_in_scale(ml,
                                                           MODEL_LIN_DOWN, 1);
        } else if ((status = cpu_weight_packed(be, &ml->wo, &cl->wo)) ||
                   (status = cpu_weight_packed(be, &ml->w_down,
                                               &cl->w_down))) {
            return status;
        }
        if (be->kv8) {
            status = cpu_owned_f32(be, 2 * (size_t)c->n_kv_heads,
                                   &cl->kv_scale);
            if (status != BT_OK)
                return status;
            backend_kv8_scales(ml, c->n_kv_heads, cl->kv_scale);
        }
    }
    /* matmul multiply-adds per token, for the thread heuristics */
    be->tok_work = (double)c->n_layers *
                   ((double)c->dim * be->qkv_dim + (double)be->q_dim * c->dim +
                    3.0 * c->dim * c->hidden_dim) +
                   (double)c->vocab_size * c->dim;
    return BT_OK;
}

/* Frees a KV array with the allocator that made it. */
static void cpu_free_kv(cpu_backend_t *be, float **p)
{
    if (*p != NULL && be->bcfg.kv_alloc != NULL)
        be->bcfg.kv_free(be->bcfg.kv_alloc_arg, *p);
    else
        bt_free(*p);
    *p = NULL;
}

static void cpu_destroy(void *impl)
{
    cpu_backend_t *be = impl;

    if (be == NULL)
        return;
    cpu__pool_destroy(&be->pool);
    for (int i = 0; i < be->n_owned; i++)
        bt_free(be->owned[i]);
    bt_free(be->owned);
    bt_free(be->layers);
    cpu_free_kv(be, &be->k_cache);
    cpu_free_kv(be, &be->v_cache);
    bt_free(be->inv_freq);
    bt_free(be->x);
    bt_free(be->xb);
    bt_free(be->qkv);
    bt_free(be->att);
    bt_free(be->gu);
    bt_free(be->hb);
    bt_free(be->xf);
    bt_free(be->chunks);
    bt_free(be->rope_cos);
    bt_free(be->rope_sin);
    bt_free(be->tok_seq);
    bt_free(be->tok_idx);
    bt_free(be->tok_pos);
    bt_free(be->seq_first_tok);
    bt_free(be->items);
    bt_free(be->tmp);
    bt_free(be->logit_tok);
    bt_free(be->attn_seqs);
    bt_free(be->scores);
    bt_free(be->kvg);
    bt_free(be->xq);
    bt_free(be->xs);
    bt_free(be->mmo);
    bt_free(be);
}

/* bt_malloc_aligned of rows * cols floats, false on overflow or failure. */
static bool cpu_alloc_f32(float **p, size_t rows, size_t cols,
                          const char *name)
{
    size_t n;

    if (bt_mul_overflow_size(rows, cols, &n) ||
        bt_mul_overflow_size(n, sizeof(float), &n))
        return false;
    *p = bt_malloc_aligned(n > 0 ? n : 1, name);
    return *p != NULL;
}

/* The KV arrays come from the caller's allocator when it gave one
 * (backend_config_t.kv_alloc: e.g. transport-mapped memory), else from
 * bt_malloc_aligned.  `bytes` bytes (a whole number of floats, or E4M3
 * bytes with kv8). */
static bool cpu_alloc_kv(cpu_backend_t *be, float **p, size_t bytes)
{
    if (be->bcfg.kv_alloc == NULL) {
        *p = bt_malloc_aligned(bytes > 0 ? bytes : 1, "kv_cache");
        return *p != NULL;
    }
    *p = be->bcfg.kv_alloc(be->bcfg.kv_alloc_arg, bytes > 0 ? bytes : 1);
    return *p != NULL;
}

/* n_kv_blocks 0: the pool from a host budget (backend.h: the explicit
 * kv_memory_bytes, else MemAvailable / BACKEND_KV_HOST_DEFAULT_DIV up to
 * BACKEND_KV_HOST_DEFAULT_MAX), at most max_seqs full contexts; max_seqs
 * 0: up to BACKEND_MAX_SEQS_CPU.  Logs where the size came from. */
static bt_status_t cpu_size_kv(const model_config_t *mc,
                               backend_config_t *cfg)
{
    size_t elem = cfg->kv_dtype == BACKEND_KV_DTYPE_FP8 ? 1 : sizeof(float);
    size_t token_bytes = 2 * (size_t)mc->n_layers * mc->n_kv_heads *
                         mc->head_dim * elem;
    size_t avail, budget;
    char what[128];
    bool auto_seqs = cfg->max_seqs == 0;
    bt_status_t status;

    if (auto_seqs)
        cfg->max_seqs = backend__max_seqs_auto(cfg, cfg->n_kv_blocks,
                                               BACKEND_MAX_SEQS_CPU);
    if (cfg->n_kv_blocks > 0)
        return BT_OK;
    avail = backend__host_mem_available();
    if (cfg->kv_memory_bytes > 0) {
        budget = cfg->kv_memory_bytes;
        snprintf(what, sizeof(what), "the --kv-memory-gb budget");
    } else {
        budget = avail > 0 ? avail / BACKEND_KV_HOST_DEFAULT_DIV
                           : BACKEND_KV_HOST_DEFAULT_MAX;
        budget = BT_MIN(budget, BACKEND_KV_HOST_DEFAULT_MAX);
        snprintf(what, sizeof(what), "the default host budget (1/%d of "
                 "%zu MiB available, at most %zu MiB)",
                 BACKEND_KV_HOST_DEFAULT_DIV, avail >> 20,
                 BACKEND_KV_HOST_DEFAULT_MAX >> 20);
    }
    status = backend__kv_blocks_auto(cfg, mc, token_bytes, budget,
                                     cfg->max_seqs, what, &cfg->n_kv_blocks);
    if (status != BT_OK)
        return status;
    if (auto_seqs) /* the pool known now: no more sequences than blocks */
        cfg->max_seqs = BT_MIN(cfg->max_seqs, cfg->n_kv_blocks);
    BT_LOG_INFO("CPU", "KV pool sized from %s: %.1f MiB budget, %zu bytes "
                "a token -> %d blocks of %d tokens (%lld tokens; capped at "
                "%d contexts of %d)", what, (double)budget / 1048576.0,
                token_bytes, cfg->n_kv_blocks, cfg->block_size,
                (long long)cfg->n_kv_blocks * cfg->block_size,
                cfg->kv_auto_contexts > 0 ? cfg->kv_auto_contexts
                                          : cfg->max_seqs,
                mc->max_seq_len);
    return BT_OK;
}

static bt_status_t cpu_create(const model_t *model, backend_config_t *cfg,
                              void **impl_p)
{
    const model_config_t *mc = model_config(model);
    cpu_backend_t *be;
    size_t max_tok = (size_t)cfg->max_batch_tokens;
    size_t kv_bytes;
    bt_status_t status;

    if (cfg->calib != NULL &&
        (cfg->calib->n_layers != mc->n_layers ||
         cfg->calib->n_kv_heads != mc->n_kv_heads ||
         cfg->calib->stats == NULL))
        return BT_ERROR(BT_ERR_INVALID_ARG, "CPU", "calibration statistics "
                        "for %d layers x %d KV heads do not fit the model "
                        "(%d x %d)", cfg->calib->n_layers,
                        cfg->calib->n_kv_heads, mc->n_layers,
                        mc->n_kv_heads);
    status = cpu_size_kv(mc, cfg);
    if (status != BT_OK)
        return status;
    if ((long)cfg->n_kv_blocks * cfg->block_size > INT32_MAX / 2)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CPU",
                        "KV pool of %d blocks x %d tokens is too large",
                        cfg->n_kv_blocks, cfg->block_size);
    be = bt_calloc(1, sizeof(*be), "cpu_backend");
    if (be == NULL)
        return BT_ERR_NO_MEMORY;
    be->cfg = *mc;
    be->bcfg = *cfg;
    be->fp8 = cfg->precision == BACKEND_PRECISION_FP8;
    be->bf16 = cfg->precision == BACKEND_PRECISION_BF16 || be->fp8;
    be->kv8 = cfg->kv_dtype == BACKEND_KV_DTYPE_FP8;
    be->kv_round_bf16 = cfg->kv_dtype == BACKEND_KV_DTYPE_BF16;
    be->calib = cfg->calib;
    be->max_k = BT_MAX(BT_MAX(mc->dim, mc->n_heads * mc->head_dim),
                       mc->hidden_dim);
    be->q_dim = mc->n_heads * mc->head_dim;
    be->kv_dim = mc->n_kv_heads * mc->head_dim;
    be->qkv_dim = be->q_dim + 2 * be->kv_dim;
    be->max_ctx = cfg->n_kv_blocks * cfg->block_size;
    be->scores_ld = BT_MAX((size_t)CPU_ATTN_CHUNK * be->max_ctx,
                           CPU_ATTN_DECODE_SCRATCH(be->max_ctx));
    be->min_work = CPU_MIN_WORK_PER_THREAD;
    be->split_seqs = getenv(CPU_SPLIT_ENV) == NULL ||
                     strcmp(getenv(CPU_SPLIT_ENV), "ops") != 0;
    be->split_always = getenv(CPU_SPLIT_ENV) != NULL &&
                       strcmp(getenv(CPU_SPLIT_ENV), "seqs") == 0;
    for (int i = 0; i < CPU_MODE_CLASSES; i++)
        be->modes[i] = (cpu_mode_stat_t){ .mode = 1,
                                          .explore = CPU_EXPLORE_MIN,
                                          .until_explore = CPU_EXPLORE_FIRST };
    be->tmp_ld = BT_DIV_UP(mc->hidden_dim, 16) * 16;
    if (getenv(CPU_MIN_WORK_ENV) != NULL) {
        double v;

        if (bt_parse_double(getenv(CPU_MIN_WORK_ENV), &v) == BT_OK && v > 0)
            be->min_work = v;
        else
            BT_LOG_WARN("CPU", "ignoring %s=%s (want a positive number)",
                        CPU_MIN_WORK_ENV, getenv(CPU_MIN_WORK_ENV));
    }
    be->kv_layout = (kv_layout_t){ mc->n_layers, cfg->n_kv_blocks,
                                   cfg->block_size, mc->n_kv_heads,
                                   mc->head_dim,
                                   be->kv8 ? 1 : sizeof(float) };

    /* calibration records into shared statistics: one thread */
    status = cpu__pool_create(be->calib != NULL ? 1 : cfg->n_threads,
                              &be->pool);
    if (status != BT_OK)
        goto err_destroy;
    status = BT_ERR_NO_MEMORY;
    be->layers = bt_calloc((size_t)mc->n_layers, sizeof(*be->layers),
                           "cpu_backend");
    if (be->layers == NULL)
        goto err_destroy;
    status = cpu_load_weights(be, model);
    if (status != BT_OK)
        goto err_destroy;

    status = BT_ERR_NO_MEMORY;
    kv_bytes = (size_t)mc->n_layers * kv_layout_layer_bytes(&be->kv_layout);
    BT_LOG_INFO("CPU", "allocating %.1f MiB for the KV cache (%d blocks of "
                "%d tokens, %s), %d threads", 2.0 * kv_bytes / 1048576.0,
                cfg->n_kv_blocks, cfg->block_size,
                be->kv8 ? "fp8 e4m3" : "f32", cpu__pool_size(be->pool));
    if (be->kv8) {
        bool any = false;

        for (int l = 0; l < mc->n_layers; l++)
            any |= model_layer(model, l)->k_scale != NULL;
        if (!any)
            BT_LOG_WARN("CPU", "--kv-dtype fp8: the model has no k_scale / "
                        "v_scale; using 1.0 (calibrate with baton model "
                        "quantize --fp8 --kv-scales)");
        if (!cpu_alloc_f32(&be->kvg, (size_t)cpu__pool_size(be->pool) * 2,
                           (size_t)be->max_ctx * be->kv_dim, "cpu_scratch"))
            goto err_destroy;
    }
    if (be->fp8 &&
        (!cpu_alloc_f32(&be->xq, max_tok, (size_t)be->max_k, "cpu_scratch") ||
         !cpu_alloc_f32(&be->xs, max_tok, 1, "cpu_scratch") ||
         !cpu_alloc_f32(&be->mmo, max_tok, (size_t)mc->dim, "cpu_scratch")))
        goto err_destroy;
    if (!cpu_alloc_kv(be, &be->k_cache, kv_bytes) ||
        !cpu_alloc_kv(be, &be->v_cache, kv_bytes) ||
        !cpu_alloc_f32(&be->inv_freq, 1, (size_t)mc->head_dim / 2 + 1,
                       "cpu_backend") ||
        !cpu_alloc_f32(&be->x, max_tok, (size_t)mc->dim, "cpu_scratch") ||
        !cpu_alloc_f32(&be->xb, max_tok, (size_t)mc->dim, "cpu_scratch") ||
        !cpu_alloc_f32(&be->qkv, max_tok, (size_t)be->qkv_dim,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->att, max_tok, (size_t)be->q_dim,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->gu, max_tok, 2 * (size_t)mc->hidden_dim,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->hb, max_tok, (size_t)mc->hidden_dim,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->xf, max_tok, (size_t)mc->dim, "cpu_scratch") ||
        !cpu_alloc_f32(&be->rope_cos, max_tok, (size_t)mc->head_dim / 2 + 1,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->rope_sin, max_tok, (size_t)mc->head_dim / 2 + 1,
                       "cpu_scratch") ||
        !cpu_alloc_f32(&be->scores, (size_t)cpu__pool_size(be->pool),
                       be->scores_ld, "cpu_scratch") ||
        !cpu_alloc_f32(&be->tmp, (size_t)cpu__pool_size(be->pool),
                       (size_t)be->tmp_ld, "cpu_scratch"))
        goto err_destroy;
    /* A fresh pool reads as zeros, never as garbage. */
    memset(be->k_cache, 0, kv_bytes);
    memset(be->v_cache, 0, kv_bytes);
    be->tok_seq = bt_malloc(max_tok * sizeof(int), "cpu_scratch");
    be->tok_idx = bt_malloc(max_tok * sizeof(int), "cpu_scratch");
    be->tok_pos = bt_malloc(max_tok * sizeof(int), "cpu_scratch");
    be->seq_first_tok = bt_malloc((size_t)cfg->max_seqs * sizeof(int),
                                  "cpu_scratch");
    be->items = bt_malloc(max_tok * (size_t)mc->n_kv_heads *
                          sizeof(*be->items), "cpu_scratch");
    be->logit_tok = bt_malloc(max_tok * sizeof(int), "cpu_scratch");
    be->attn_seqs = bt_calloc((size_t)cfg->max_seqs, sizeof(*be->attn_seqs),
                              "cpu_scratch");
    be->chunks = bt_malloc((size_t)cfg->max_seqs * sizeof(*be->chunks),
                           "cpu_scratch");
    if (be->tok_seq == NULL || be->tok_idx == NULL || be->tok_pos == NULL ||
        be->seq_first_tok == NULL || be->items == NULL ||
        be->logit_tok == NULL || be->attn_seqs == NULL || be->chunks == NULL)
        goto err_destroy;
    cpu__rope_inv_freq(mc, be->inv_freq);
    *impl_p = be;
    return BT_OK;

err_destroy:
    cpu_destroy(be);
    if (status == BT_ERR_NO_MEMORY)
        return BT_ERROR(status, "CPU", "out of memory creating the cpu "
                        "backend (%d KV blocks, %d batch tokens)",
                        cfg->n_kv_blocks, cfg->max_batch_tokens);
    return status;
}

// ----------------------------------------------------------------------------
// KV pool access

static void *cpu_kv_data(void *impl, int layer, int kv)
{
    cpu_backend_t *be = impl;
    size_t off = kv_layout_offset(&be->kv_layout, layer, 0, 0);

    return (char *)(kv == 0 ? be->k_cache : be->v_cache) +
           off * be->kv_layout.elem_size;
}

static bt_status_t cpu_kv_copy_block(void *impl, int src_block,
                                     int dst_block)
{
    cpu_backend_t *be = impl;
    size_t bytes = kv_layout_block_bytes(&be->kv_layout);

    if (src_block == dst_block)
        return BT_OK;
    for (int l = 0; l < be->cfg.n_layers; l++) {
        size_t es = be->kv_layout.elem_size;
        size_t src = kv_layout_offset(&be->kv_layout, l, src_block, 0) * es;
        size_t dst = kv_layout_offset(&be->kv_layout, l, dst_block, 0) * es;

        memcpy((char *)be->k_cache + dst, (char *)be->k_cache + src, bytes);
        memcpy((char *)be->v_cache + dst, (char *)be->v_cache + src, bytes);
    }
    return BT_OK;
}

static bt_status_t cpu_kv_copy_slots(void *impl, int n,
                                     const int *src_slots,
                                     const int *dst_slots)
{
    cpu_backend_t *be = impl;

    return backend__kv_copy_slots_host(&be->kv_layout, be->k_cache,
                                       be->v_cache, n, src_slots, dst_slots);
}

/* Host tier copies: the pool is host memory, so plain copies, each
 * layer's K then V of a block next to each other in host[i]. */
/* Window block i of layer l's K (V) at src + ((2*l + kv) * n + i) *
 * block bytes into pool block blocks[i] (backend_kv_copy_in): plain
 * copies, done before return. */
static bt_status_t cpu_kv_copy_in(void *impl, const void *src, int n,
                                  const int *blocks, backend_done_fn_t done,
                                  void *done_arg)
{
    cpu_backend_t *be = impl;
    size_t bytes = kv_layout_block_bytes(&be->kv_layout);
    size_t es = be->kv_layout.elem_size;

    for (int l = 0; l < be->cfg.n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            const char *s = (const char *)src + (2 * (size_t)l + kv) *
                                                    (size_t)n * bytes;
            char *pool = (char *)(kv == 0 ? (void *)be->k_cache
                                          : (void *)be->v_cache);
            for (int i = 0; i < n; i++)
                memcpy(pool + kv_layout_offset(&be->kv_layout, l, blocks[i],
                                               0) * es,
                       s + (size_t)i * bytes, bytes);
        }
    }
    done(done_arg);
    return BT_OK;
}

static bt_status_t cpu_kv_host_copy(void *impl, int n, const int *blocks,
                                    void *const *host, bool to_host)
{
    cpu_backend_t *be = impl;
    size_t bytes = kv_layout_block_bytes(&be->kv_layout);
    size_t es = be->kv_layout.elem_size;

    for (int i = 0; i < n; i++) {
        char *h = host[i];

        for (int l = 0; l < be->cfg.n_layers; l++) {
            size_t off = kv_layout_offset(&be->kv_layout, l, blocks[i], 0) *
                         es;
            char *k = (char *)be->k_cache + off;
            char *v = (char *)be->v_cache + off;

            if (to_host) {
                memcpy(h, k, bytes);
                memcpy(h + bytes, v, bytes);
            } else {
                memcpy(k, h, bytes);
                memcpy(v, h + bytes, bytes);
            }
            h += 2 * bytes;
        }
    }
    return BT_OK;
}

static const kv_layout_t *cpu_kv_layout(void *impl)
{
    cpu_backend_t *be = impl;

    return &be->kv_layout;
}

static bool cpu_is_available(void)
{
    return true;
}

const backend_ops_t cpu_backend_ops = {
    .name = "cpu",
    .is_available = cpu_is_available,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .kv_data = cpu_kv_data,
    .kv_copy_block = cpu_kv_copy_block,
    .kv_layout = cpu_kv_layout,
    .kv_copy_slots = cpu_kv_copy_slots,
    .kv_host_copy = cpu_kv_host_copy,
    .kv_copy_in = cpu_kv_copy_in,
};
