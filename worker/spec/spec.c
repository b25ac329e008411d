/*
 * spec.c - speculative decoding: dynamic draft trees, one batched tree
 * verification, recursive rejection sampling, KV slot compaction and
 * adaptive tree sizing (see spec.h).
 */
#include "spec.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cpu/cpu_int.h"
#include "spec_int.h"
#include "spec_tree.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_draft.h"
#endif

#define SPEC_PEND_CAP 64   /* target features buffered before the draft
                              head is fed (plain decoding defers it) */
#define SPEC_N_ARMS 6      /* off, chains of 1, 2, 4 and 8 (within the
                              configured depth and tokens), configured
                              tree */
#define SPEC_N_BUCKETS 4   /* batch sizes 1, 2-4, 5-16, 17+ */
/* The controller (spec_pick_arm): plain decoding is the baseline,
 * measured on every plain step; a speculative arm is tried in short
 * episodes, and each loss multiplies the wait before its next try. */
#define SPEC_BASELINE_STEPS 8   /* plain steps measured before any try */
#define SPEC_EPISODE 3          /* measured steps per try */
#define SPEC_CLEAR 0.7          /* a try below 0.7x the default ends at
                                   once (a clear loss) */
#define SPEC_WARM 1             /* steps before a try that keep features
                                   (the root feature of the first tree) */
#define SPEC_PLAIN_SKIP 2       /* first plain steps of a bucket not
                                   measured (first-call costs) */
#define SPEC_EXPLORE_FIRST 32   /* wait after a first loss */
#define SPEC_EXPLORE_MAX (1u << 22) /* longest wait: practically never */
#define SPEC_HOST_DRAFT_MAX_PARAMS (1u << 20) /* auto: heads of at most 1 M
                                             multiply-adds a token (own
                                             weights + classifier) draft
                                             on the host beside a cuda
                                             target */
#define SPEC_WIN 1.03           /* a challenger must beat the default
                                   by 3% ... */
#define SPEC_ENTER 1.10         /* ... and a speculative arm plain by 10%:
                                   a wrong switch to speculation costs
                                   far more than a missed small gain, and
                                   a try's few steps can fall where the
                                   tree pays (aidreams260K at batch 8: a
                                   chain of 4 measured 1.09x plain in its
                                   try at context ~30 and ran at 0.68x
                                   over whole sequences) */
#define SPEC_LADDER 0.9         /* a bigger arm is tried only while the
                                   next smaller one reaches 0.9x plain */
#define SPEC_EMA_PLAIN 0.05
#define SPEC_WIDE_ROWS 256      /* cuda: tree steps with more rows than
                                   this (the backend's one-chunk device
                                   sampling) verify through the draft's
                                   classifier copy (spec_forward_wide) */
#define SPEC_EMA 0.3

enum { SPEC_MODE_SKIP = 0, SPEC_MODE_PREFILL, SPEC_MODE_PLAIN,
       SPEC_MODE_TREE };

typedef struct {
    int tokens; /* draft tokens verified, 0 = plain decoding */
    int depth;
    int topk;
} spec_shape_t;


struct spec_seq_s {
    spec_t *spec;             /* owner */
    engine_seq_t *seq;        /* borrowed */
    spec_head_kv_t kv;        /* host head: draft cache, true pairs then
                                 tree (device head: its state's slice) */
    int state;                /* device head: draft state, -1 = none (the
                                 sequence then always decodes plainly) */
    int draft_len;            /* draft slots holding true (f[t], x[t+1]) */
    float *pend;              /* (SPEC_PEND_CAP, dim) features not yet fed */
    int n_pend;
    int pend_pos;             /* position of pend's first row; rows before
                                 it are fed or were dropped (a gap in the
                                 draft cache while speculation was off) */
    float *root_feat;         /* (dim) head output of slot draft_len - 1
                                 (host head; device: store row 0) */
    spec_node_t *nodes;       /* (node_cap) this step's candidates */
    int n_nodes;
    int *by_score;            /* (node_cap) selected node ids, best first */
    int n_sel;
    float *exp_feat;          /* (exp_cap, dim) outputs of expanded nodes
                                 (host head; device: store rows 1..) */
    int frontier[SPEC_MAX_TOPK]; /* nodes expanded at the next level */
    int n_front;
    int n_exp;                /* nodes expanded so far this step */
    int depth_lim;            /* levels of this step's tree */
    int tokens_plan;          /* draft tokens it may verify this step */
    int lrow0;                /* its first row in this level's batch */
    bool use_amax;            /* this step's target tokens come from the
                                 device argmax (greedy, verified there) */
    int *v_tokens;            /* (1 + SPEC_MAX_TOKENS) verification chunk */
    int *v_pos;               /* (1 + SPEC_MAX_TOKENS) RoPE positions */
    uint8_t *v_mask;          /* ((1 + SPEC_MAX_TOKENS)^2) tree mask */
    int queue[SPEC_MAX_DEPTH + 2]; /* spec_seq_next's undelivered tokens */
    int q_head;
    int q_len;
    int mode;                 /* SPEC_MODE_* this step */
    int take;                 /* tokens fed this step */
    int row0;                 /* first logits row of this sequence */
    int n_rows;               /* its logits rows this step */
    int max_slots;            /* KV slots it may grow to, 0 = context */
    int drafted;              /* draft tokens verified in its last step */
};

struct spec_s {
    engine_t *engine;         /* borrowed */
    spec_head_t *head;        /* borrowed */
    spec_config_t cfg;
    int dim;
    int vocab;
    int max_ctx;
    int node_cap;             /* topk + (depth - 1) * topk^2 */
    int exp_cap;              /* (depth - 1) * topk */
    backend_seq_t *bseqs;     /* (max_seqs) */
    float *logits;            /* (max_batch_tokens, vocab) */
    float *hidden;            /* (max_batch_tokens, dim) */
    float *probs;             /* (vocab); also the draft log-softmax's
                                 scratch (spec_row_topk) */
    /* host head, every drafting sequence in one pass
     * (spec_head_forward_parts): rows grown on demand */
    int hb_cap, hb_lcap;      /* rows; rows with logits */
    float *hb_feat, *hb_out;  /* (hb_cap, dim) */
    int *hb_tok, *hb_pos;     /* (hb_cap) */
    float *hb_logits;         /* (hb_lcap, vocab) */
    spec_head_part_t *hb_parts; /* (max_seqs) */
    /* destroyed sequences kept with their buffers for the next create
     * (a request's draft cache, tree and chunk buffers: allocating and
     * zeroing them per sequence cost a tiny model 2-5% of its batch-32
     * throughput with sequences of 96 tokens) */
    spec_seq_t **pool;        /* (max_seqs) */
    int n_pool;
    float *fbuf;              /* (SPEC_MAX_DEPTH + 2, dim) features */
    int *dtok;                /* (SPEC_PEND_CAP + topk) */
    int *dpos;                /* (SPEC_PEND_CAP + topk) */
    uint8_t *dmask;           /* (topk, exp_cap + topk) */
    int *mv_src;              /* (max_seqs * SPEC_MAX_DEPTH) pool slots of
                                 accepted KV to move this step */
    int *mv_dst;              /* (max_seqs * SPEC_MAX_DEPTH) */
    int n_mv;
    int max_seqs;
    spec_seq_t **dseqs;       /* (max_seqs) sequences drafting this step */
    int *top_ids;             /* (max_seqs * topk, topk) level candidates */
    float *top_logp;          /* (max_seqs * topk, topk) */
    int *top_n;               /* (max_seqs * topk) candidates per row */
    size_t mask_stride;       /* dmask bytes per drafting sequence */
    void *dev;                /* cuda_draft_t: the head on the device, or
                                 NULL (the host head) */
    int *free_states;         /* (n_states) device states not in use */
    int n_free;
    void *lrows;              /* device head rows (cuda_draft_row_t) */
    int lrows_cap;
    float *fcat;              /* (fcat_rows, dim) hidden rows of a flush */
    int *ftop_ids;            /* (ftop_cap) top-k of a flush's rows */
    float *ftop_logp;         /* (ftop_cap) */
    int ftop_cap;
    int fcat_rows;
    bool pinned;              /* logits and hidden are pinned (device) */
    /* target features stay on the GPU (device head, BT_DRAFT_FEATURES
     * not "host"): the forward keeps its hidden rows there and a
     * sequence's buffered features are rows of its state's stash
     * (cuda_draft_stash), not s->pend */
    bool feat_dev;
    int wide_rows;            /* SPEC_WIDE_ROWS (tests: BT_SPEC_WIDE_ROWS) */
    const float *fwd_hidden;  /* the last forward's rows on the device */
    const int *fwd_map;       /* (fwd_rows) row -> device row */
    int fwd_rows;
    int *st_src;              /* (st_cap) queued stash copies: device row, */
    int *st_state;            /* state, */
    int *st_row;              /* stash row */
    int n_st;
    int st_cap;
    bool host_verify;         /* BT_SPEC_VERIFY=host: target logits always
                                 come to the host */
    int *amax;                /* (max_batch_tokens) sampled ids per row
                                 (backend_forward_sample; greedy tree rows:
                                 the target's argmax) */
    int *full_rows;           /* (max_batch_tokens) rows needing logits
                                 (spec_forward_wide) */
    sampler_t **row_smp;      /* (max_batch_tokens) sampler per row, NULL:
                                 no id (its logits come to the host when
                                 asked) */
    double force_rate;        /* spec_test_force_accept, < 0 = off */
    uint64_t force_rng;
    spec_shape_t arms[SPEC_N_ARMS];
    bool arm_dup[SPEC_N_ARMS];   /* drafts as a smaller arm: never tried */
    double arm_rate[SPEC_N_BUCKETS][SPEC_N_ARMS]; /* tokens/s EMA (arm 0:
                                                    every plain step;
                                                    others: per episode) */
    int arm_n[SPEC_N_BUCKETS][SPEC_N_ARMS];       /* measurements */
    uint64_t bucket_steps[SPEC_N_BUCKETS];
    uint64_t explore_gap[SPEC_N_BUCKETS][SPEC_N_ARMS]; /* wait after the
                                                          last loss */
    uint64_t next_explore[SPEC_N_BUCKETS][SPEC_N_ARMS];
    int best_arm[SPEC_N_BUCKETS];                 /* arm run by default */
    int ep_arm[SPEC_N_BUCKETS];                   /* episode arm, -1 none */
    int ep_left[SPEC_N_BUCKETS];                  /* measured steps left */
    int ep_warm[SPEC_N_BUCKETS];                  /* unmeasured steps left
                                                    (an arm's first try:
                                                    graph captures, GEMM
                                                    tuning) */
    int plain_skip[SPEC_N_BUCKETS];               /* plain steps seen,
                                                    up to SPEC_PLAIN_SKIP */
    double ep_tokens[SPEC_N_BUCKETS];
    double ep_ns[SPEC_N_BUCKETS];
    bool lazy;                /* speculation is off and no try is near:
                                 no features at all (the draft cache gets
                                 a gap; drafting resumes around it) */
    bool wrong_accept;        /* tests: spec_test_wrong_accept */
    bool fixed;               /* spec_set_fixed was called */
    spec_shape_t fixed_shape;
    spec_stats_t stats;
    /* the device draft loop (BT_DRAFT_LOOP=device, cuda only): whole
     * trees grown on the device (cuda_draft_tree), same trees */
    bool dev_loop;
    void *loop_seqs;          /* (max_seqs) cuda_draft_tree_seq_t */
    spec_node_t *loop_nodes;  /* (loop_cap) every sequence's nodes */
    int *loop_order;          /* (loop_cap) */
    int *loop_nsel;           /* (max_seqs) */
    size_t loop_cap;
};

/* True when shapes a and b draft the same: equal, or two chains (top-k
 * 1) of the same length (a chain is as long as its depth and tokens
 * allow). */
static bool spec_shape_same(const spec_shape_t *a, const spec_shape_t *b)
{
    if (a->topk == 1 && b->topk == 1)
        return BT_MIN(a->tokens, a->depth) == BT_MIN(b->tokens, b->depth);
    return a->tokens == b->tokens && a->depth == b->depth &&
           a->topk == b->topk;
}

/* The controller with nothing measured.  An arm that drafts as a
 * smaller one does (the limits cut the chains short, or the tree is a
 * chain) is marked a duplicate and never tried. */
static void spec_controller_reset(spec_t *spec)
{
    memset(spec->arm_rate, 0, sizeof(spec->arm_rate));
    memset(spec->arm_n, 0, sizeof(spec->arm_n));
    memset(spec->bucket_steps, 0, sizeof(spec->bucket_steps));
    memset(spec->next_explore, 0, sizeof(spec->next_explore));
    memset(spec->best_arm, 0, sizeof(spec->best_arm));
    memset(spec->ep_left, 0, sizeof(spec->ep_left));
    memset(spec->ep_warm, 0, sizeof(spec->ep_warm));
    memset(spec->plain_skip, 0, sizeof(spec->plain_skip));
    for (int a = 0; a < SPEC_N_ARMS; a++) {
        spec->arm_dup[a] = false;
        for (int e = 0; e < a; e++)
            spec->arm_dup[a] |= spec_shape_same(&spec->arms[e],
                                                &spec->arms[a]);
    }
    for (int b = 0; b < SPEC_N_BUCKETS; b++) {
        spec->ep_arm[b] = -1;
        for (int a = 0; a < SPEC_N_ARMS; a++) {
            spec->explore_gap[b][a] = SPEC_EXPLORE_FIRST / 2;
            if (spec->arm_dup[a])
                spec->next_explore[b][a] = UINT64_MAX;
        }
    }
}

static void spec_seq_free(spec_seq_t *s);

void spec_config_init(spec_config_t *cfg)
{
    cfg->depth = 8;
    cfg->topk = 4;
    cfg->tokens = 16;
    cfg->adaptive = true;
}

bt_status_t spec_config_validate(const spec_config_t *cfg)
{
    if (cfg->depth < 1 || cfg->depth > SPEC_MAX_DEPTH)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "spec depth %d out of range 1..%d", cfg->depth,
                        SPEC_MAX_DEPTH);
    if (cfg->topk < 1 || cfg->topk > SPEC_MAX_TOPK)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "spec top-k %d out of range 1..%d", cfg->topk,
                        SPEC_MAX_TOPK);
    if (cfg->tokens < 1 || cfg->tokens > SPEC_MAX_TOKENS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "spec tokens %d out of range 1..%d", cfg->tokens,
                        SPEC_MAX_TOKENS);
    return BT_OK;
}

// ----------------------------------------------------------------------------
// create / destroy

bt_status_t spec_create(engine_t *engine, spec_head_t *head,
                        const spec_config_t *cfg, spec_t **spec_p)
{
    const engine_config_t *ecfg = engine_config(engine);
    const model_config_t *mc = model_config(engine_model(engine));
    const model_config_t *hc = spec_head_config(head);
    spec_t *spec;
    size_t rows = (size_t)ecfg->backend.max_batch_tokens;
    int dr;
    bt_status_t status;

    status = spec_config_validate(cfg);
    if (status != BT_OK)
        return status;
    if (hc->dim != mc->dim || hc->vocab_size != mc->vocab_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "draft head (dim %d, vocab %d) does not fit the "
                        "target (dim %d, vocab %d)", hc->dim,
                        hc->vocab_size, mc->dim, mc->vocab_size);
    if (strcmp(backend_name(engine_backend(engine)), "cpu") != 0
#ifdef BATON_HAVE_CUDA
        && strcmp(backend_name(engine_backend(engine)), "cuda") != 0
#endif
    )
        return BT_ERROR(BT_ERR_UNSUPPORTED, "SPEC",
                        "speculative decoding runs on the cpu and cuda "
                        "backends, not %s",
                        backend_name(engine_backend(engine)));
    spec = bt_calloc(1, sizeof(*spec), "spec");
    if (spec == NULL)
        return BT_ERR_NO_MEMORY;
    spec->engine = engine;
    spec->head = head;
    spec->cfg = *cfg;
    spec->dim = mc->dim;
    spec->vocab = mc->vocab_size;
    spec->max_ctx = engine_max_context(engine);
    spec->node_cap = cfg->topk + (cfg->depth - 1) * cfg->topk * cfg->topk;
    spec->exp_cap = (cfg->depth - 1) * cfg->topk;
    spec->max_seqs = ecfg->backend.max_seqs;
    dr = BT_MAX(SPEC_PEND_CAP + cfg->topk, spec->max_seqs * cfg->topk);
    spec->mask_stride = (size_t)cfg->topk *
                        (size_t)(spec->exp_cap + cfg->topk);
    spec->bseqs = bt_calloc((size_t)ecfg->backend.max_seqs,
                            sizeof(*spec->bseqs), "spec");
    spec->logits = bt_malloc(rows * (size_t)spec->vocab * sizeof(float),
                             "spec");
    spec->hidden = bt_malloc(rows * (size_t)spec->dim * sizeof(float),
                             "spec");
    spec->probs = bt_malloc((size_t)spec->vocab * sizeof(float), "spec");
    spec->amax = bt_malloc(rows * sizeof(int), "spec");
    spec->row_smp = bt_calloc(rows, sizeof(*spec->row_smp), "spec");
    spec->full_rows = bt_malloc(rows * sizeof(int), "spec");
    spec->force_rate = -1.0;
    spec->fbuf = bt_malloc((size_t)(SPEC_MAX_DEPTH + 2) * spec->dim *
                               sizeof(float), "spec");
    spec->dtok = bt_malloc((size_t)dr * sizeof(int), "spec");
    spec->dpos = bt_malloc((size_t)dr * sizeof(int), "spec");
    spec->dmask = bt_malloc((size_t)spec->max_seqs * spec->mask_stride,
                            "spec");
    spec->dseqs = bt_calloc((size_t)spec->max_seqs, sizeof(*spec->dseqs),
                            "spec");
    spec->top_ids = bt_malloc((size_t)spec->max_seqs * cfg->topk *
                                  cfg->topk * sizeof(int), "spec");
    spec->top_logp = bt_malloc((size_t)spec->max_seqs * cfg->topk *
                                   cfg->topk * sizeof(float), "spec");
    spec->top_n = bt_malloc((size_t)spec->max_seqs * cfg->topk *
                                sizeof(int), "spec");
    spec->mv_src = bt_malloc((size_t)ecfg->backend.max_seqs *
                                 SPEC_MAX_DEPTH * sizeof(int), "spec");
    spec->mv_dst = bt_malloc((size_t)ecfg->backend.max_seqs *
                                 SPEC_MAX_DEPTH * sizeof(int), "spec");
    if (spec->bseqs == NULL || spec->logits == NULL ||
        spec->hidden == NULL || spec->probs == NULL ||
        spec->fbuf == NULL || spec->dtok == NULL || spec->dpos == NULL ||
        spec->dmask == NULL || spec->mv_src == NULL ||
        spec->mv_dst == NULL || spec->dseqs == NULL ||
        spec->top_ids == NULL || spec->top_logp == NULL ||
        spec->top_n == NULL || spec->amax == NULL ||
        spec->row_smp == NULL || spec->full_rows == NULL) {
        spec_destroy(&spec);
        return BT_ERR_NO_MEMORY;
    }
    spec->arms[0] = (spec_shape_t){ 0, 0, 0 };
    for (int a = 1; a < SPEC_N_ARMS - 1; a++) {
        /* chains of 1, 2, 4, 8 within the configured limits */
        int len = BT_MIN(1 << (a - 1), BT_MIN(cfg->tokens, cfg->depth));

        spec->arms[a] = (spec_shape_t){ len, len, 1 };
    }
    spec->arms[SPEC_N_ARMS - 1] =
        (spec_shape_t){ cfg->tokens, cfg->depth, cfg->topk };
    spec_controller_reset(spec);
    if (!cfg->adaptive) {
        spec->fixed = true;
        spec->fixed_shape = spec->arms[SPEC_N_ARMS - 1];
    }
#ifdef BATON_HAVE_CUDA
    /* Where the head runs beside a cuda target (BT_DRAFT_DEVICE=
     * auto|host|device, default auto): on the GPU, unless it is so small
     * that a draft level costs less on the host than the ~15 kernel
     * launches it takes on the GPU (hidden rows and logits then cross
     * every step).  The 260K models' heads (~0.1 M multiply-adds a
     * token, classifier included): GPU trees cost 0.32 ms and lost
     * (0.99x at batch 1); on the host, batch 1 ran 1.60x (H200,
     * 2026-12-01, docs/PERFORMANCE.md round 6). */
    const char *draft_where = getenv("BT_DRAFT_DEVICE");
    bool draft_host = draft_where && strcmp(draft_where, "host") == 0;
    if (!draft_host && !(draft_where && strcmp(draft_where, "device") == 0)) {
        size_t n_head = 0;

        (void)spec_head_params(head, &n_head);
        draft_host = n_head + (size_t)spec->vocab * spec->dim <=
                     SPEC_HOST_DRAFT_MAX_PARAMS;
    }
    if (strcmp(backend_name(engine_backend(engine)), "cuda") == 0 &&
        !draft_host) {
        cuda_draft_config_t dc;
        cuda_draft_t *dev = NULL;

        memset(&dc, 0, sizeof(dc));
        dc.device_index = ecfg->backend.device_index;
        dc.bf16 = ecfg->backend.precision != BACKEND_PRECISION_F32;
        dc.n_states = spec->max_seqs;
        dc.state_slots = spec->max_ctx + spec->exp_cap + 1;
        dc.store_rows = 1 + spec->exp_cap;
        {
            const char *env = getenv("BT_DRAFT_FEATURES");

            spec->feat_dev = env == NULL || strcmp(env, "host") != 0;
            env = getenv("BT_SPEC_WIDE_ROWS");
            spec->wide_rows = env != NULL && atoi(env) > 0 ? atoi(env)
                                                           : SPEC_WIDE_ROWS;
        }
        dc.pend_rows = spec->feat_dev ? SPEC_PEND_CAP : 0;
        if (cfg->topk > CUDA_DRAFT_TOPK_MAX) {
            spec_destroy(&spec);
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "spec top-k %d: the device head takes at most "
                            "%d", cfg->topk, CUDA_DRAFT_TOPK_MAX);
        }
        spec->free_states = bt_malloc((size_t)dc.n_states * sizeof(int),
                                      "spec");
        if (spec->free_states == NULL) {
            spec_destroy(&spec);
            return BT_ERR_NO_MEMORY;
        }
        for (int i = 0; i < dc.n_states; i++)
            spec->free_states[i] = dc.n_states - 1 - i;
        spec->n_free = dc.n_states;
        status = cuda_draft_create(head, &dc, &dev);
        if (status != BT_OK) {
            spec_destroy(&spec);
            return status;
        }
        spec->dev = dev;
        /* the backend copies logits and hidden rows into pinned memory */
        bt_free(spec->logits);
        bt_free(spec->hidden);
        spec->pinned = true;
        spec->logits = cuda_draft_host_alloc(rows * (size_t)spec->vocab *
                                             sizeof(float));
        spec->hidden = cuda_draft_host_alloc(rows * (size_t)spec->dim *
                                             sizeof(float));
        if (spec->logits == NULL || spec->hidden == NULL) {
            spec_destroy(&spec);
            return BT_ERROR(BT_ERR_NO_MEMORY, "SPEC",
                            "pinned host buffers for %zu rows", rows);
        }
        {
            const char *env = getenv("BT_SPEC_VERIFY");

            spec->host_verify = env != NULL && strcmp(env, "host") == 0;
            env = getenv("BT_DRAFT_LOOP");
            spec->dev_loop = env != NULL && strcmp(env, "device") == 0;
        }
    }
#endif
    *spec_p = spec;
    return BT_OK;
}

void spec_destroy(spec_t **spec_p)
{
    spec_t *spec = *spec_p;

    if (spec == NULL)
        return;
    bt_free(spec->bseqs);
#ifdef BATON_HAVE_CUDA
    if (spec->pinned) {
        cuda_draft_host_free(spec->logits);
        cuda_draft_host_free(spec->hidden);
        spec->logits = spec->hidden = NULL;
    }
#endif
    bt_free(spec->logits);
    bt_free(spec->hidden);
    bt_free(spec->amax);
    bt_free(spec->row_smp);
    bt_free(spec->full_rows);
    bt_free(spec->probs);
    bt_free(spec->hb_feat);
    bt_free(spec->hb_out);
    bt_free(spec->hb_tok);
    bt_free(spec->hb_pos);
    bt_free(spec->hb_logits);
    bt_free(spec->hb_parts);
    for (int i = 0; i < spec->n_pool; i++)
        spec_seq_free(spec->pool[i]);
    bt_free(spec->pool);
    bt_free(spec->fbuf);
    bt_free(spec->st_src);
    bt_free(spec->st_state);
    bt_free(spec->st_row);
    bt_free(spec->dtok);
    bt_free(spec->dpos);
    bt_free(spec->dmask);
    bt_free(spec->mv_src);
    bt_free(spec->mv_dst);
    bt_free(spec->dseqs);
    bt_free(spec->top_ids);
    bt_free(spec->top_logp);
    bt_free(spec->top_n);
    bt_free(spec->free_states);
    bt_free(spec->lrows);
    bt_free(spec->fcat);
    bt_free(spec->ftop_ids);
    bt_free(spec->ftop_logp);
    bt_free(spec->loop_seqs);
    bt_free(spec->loop_nodes);
    bt_free(spec->loop_order);
    bt_free(spec->loop_nsel);
#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL) {
        cuda_draft_t *dev = spec->dev;

        cuda_draft_destroy(&dev);
    }
#endif
    bt_free(spec);
    *spec_p = NULL;
}

/* A sequence with its buffers and nothing else set: from the pool of
 * destroyed ones, or allocated; NULL when out of memory. */
static spec_seq_t *spec_seq_buffers(spec_t *spec)
{
    int t1 = SPEC_MAX_TOKENS + 1;
    spec_seq_t *s;

    if (spec->n_pool > 0) {
        spec_seq_t keep;

        s = spec->pool[--spec->n_pool];
        keep = *s;
        memset(s, 0, sizeof(*s));
        s->kv = keep.kv;
        s->pend = keep.pend;
        s->root_feat = keep.root_feat;
        s->nodes = keep.nodes;
        s->by_score = keep.by_score;
        s->exp_feat = keep.exp_feat;
        s->v_tokens = keep.v_tokens;
        s->v_pos = keep.v_pos;
        s->v_mask = keep.v_mask;
        if (s->root_feat != NULL)
            memset(s->root_feat, 0, sizeof(float) * (size_t)spec->dim);
        return s;
    }
    s = bt_calloc(1, sizeof(*s), "spec_seq");
    if (s == NULL)
        return NULL;
    if (spec->dev == NULL) { /* host head: its draft cache and features */
        if (spec_head_kv_init(spec->head, spec->max_ctx + spec->exp_cap + 1,
                              &s->kv) != BT_OK)
            goto err;
        s->root_feat = bt_calloc((size_t)spec->dim, sizeof(float),
                                 "spec_seq");
        s->exp_feat = bt_malloc((size_t)(spec->exp_cap + 1) * spec->dim *
                                    sizeof(float), "spec_seq");
        if (s->root_feat == NULL || s->exp_feat == NULL)
            goto err;
    }
    s->pend = bt_malloc((size_t)SPEC_PEND_CAP * spec->dim * sizeof(float),
                        "spec_seq");
    s->nodes = bt_malloc((size_t)spec->node_cap * sizeof(*s->nodes),
                         "spec_seq");
    s->by_score = bt_malloc((size_t)spec->node_cap * sizeof(int),
                            "spec_seq");
    s->v_tokens = bt_malloc((size_t)t1 * sizeof(int), "spec_seq");
    s->v_pos = bt_malloc((size_t)t1 * sizeof(int), "spec_seq");
    s->v_mask = bt_malloc((size_t)t1 * t1, "spec_seq");
    if (s->pend == NULL || s->nodes == NULL || s->by_score == NULL ||
        s->v_tokens == NULL || s->v_pos == NULL || s->v_mask == NULL)
        goto err;
    return s;

err:
    spec_seq_free(s);
    return NULL;
}

bt_status_t spec_seq_create(spec_t *spec, engine_seq_t *seq,
                            spec_seq_t **sseq_p)
{
    spec_seq_t *s = spec_seq_buffers(spec);

    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->spec = spec;
    s->seq = seq;
    s->state = -1;
    if (spec->dev != NULL) {
        if (spec->n_free > 0)
            s->state = spec->free_states[--spec->n_free];
        else
            BT_LOG_DEBUG("SPEC", "no device draft state left: the "
                         "sequence decodes plainly");
    }
    *sseq_p = s;
    return BT_OK;
}

void spec_seq_destroy(spec_seq_t **sseq_p)
{
    spec_seq_t *s = *sseq_p;
    spec_t *spec;

    if (s == NULL)
        return;
    spec = s->spec;
    if (s->state >= 0)
        spec->free_states[spec->n_free++] = s->state;
    s->state = -1;
    *sseq_p = NULL;
    if (spec->pool == NULL)
        spec->pool = bt_calloc((size_t)spec->max_seqs, sizeof(*spec->pool),
                               "spec");
    if (spec->pool != NULL && spec->n_pool < spec->max_seqs) {
        spec->pool[spec->n_pool++] = s;
        return;
    }
    spec_seq_free(s);
}

static void spec_seq_free(spec_seq_t *s)
{
    spec_head_kv_cleanup(&s->kv);
    bt_free(s->pend);
    bt_free(s->root_feat);
    bt_free(s->nodes);
    bt_free(s->by_score);
    bt_free(s->exp_feat);
    bt_free(s->v_tokens);
    bt_free(s->v_pos);
    bt_free(s->v_mask);
    bt_free(s);
}

engine_seq_t *spec_seq_engine_seq(spec_seq_t *sseq)
{
    return sseq->seq;
}

int spec_max_step_tokens(const spec_t *spec)
{
    return spec->cfg.depth + 1;
}

void spec_get_stats(const spec_t *spec, spec_stats_t *stats)
{
    *stats = spec->stats;
#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL)
        cuda_draft_graph_stats(spec->dev, &stats->head_replays,
                               &stats->head_captures, &stats->head_eager,
                               &stats->head_gpu_ns);
#endif
}

double spec_accept_length(const spec_t *spec)
{
    if (spec->stats.verify_seqs == 0)
        return 0.0;
    return (double)spec->stats.verify_tokens /
           (double)spec->stats.verify_seqs;
}

void spec_test_wrong_accept(spec_t *spec, bool on)
{
    spec->wrong_accept = on;
}

void spec_test_force_accept(spec_t *spec, double rate, uint64_t seed)
{
    spec->force_rate = rate;
    spec->force_rng = seed * 0x9e3779b97f4a7c15ull + 0x5bd1e995ull;
}

void spec_set_adaptive(spec_t *spec)
{
    if (!spec->cfg.adaptive)
        return;
    spec->fixed = false;
    spec->lazy = false;
    spec_controller_reset(spec);
}

void spec_set_fixed(spec_t *spec, int tokens, int depth, int topk)
{
    spec->fixed = true;
    spec->fixed_shape.tokens = BT_MAX(0, BT_MIN(tokens, spec->cfg.tokens));
    spec->fixed_shape.depth = BT_MAX(1, BT_MIN(depth, spec->cfg.depth));
    spec->fixed_shape.topk = BT_MAX(1, BT_MIN(topk, spec->cfg.topk));
}

// ----------------------------------------------------------------------------
// draft head state

#ifdef BATON_HAVE_CUDA
/* Grows spec->lrows to n device rows. */
static bt_status_t spec_lrows_reserve(spec_t *spec, int n)
{
    void *p;

    if (n <= spec->lrows_cap)
        return BT_OK;
    n = BT_MAX(n, 2 * spec->lrows_cap);
    p = bt_realloc(spec->lrows, (size_t)n * sizeof(cuda_draft_row_t),
                   "spec");
    if (p == NULL)
        return BT_ERR_NO_MEMORY;
    spec->lrows = p;
    spec->lrows_cap = n;
    return BT_OK;
}
#endif

/* Grows the host head's batch scratch to rows rows, lrows of them with
 * logits. */
static bool spec_grow(void **p, size_t bytes)
{
    void *q = bt_realloc(*p, bytes, "spec");

    if (q == NULL)
        return false;
    *p = q;
    return true;
}

static bt_status_t spec_hb_reserve(spec_t *spec, int rows, int lrows)
{
    if (spec->hb_parts == NULL) {
        spec->hb_parts = bt_calloc((size_t)spec->max_seqs,
                                   sizeof(*spec->hb_parts), "spec");
        if (spec->hb_parts == NULL)
            return BT_ERR_NO_MEMORY;
    }
    if (rows > spec->hb_cap) {
        size_t cap = (size_t)BT_MAX(rows, 2 * spec->hb_cap);
        size_t fb = cap * spec->dim * sizeof(float);

        if (!spec_grow((void **)&spec->hb_feat, fb) ||
            !spec_grow((void **)&spec->hb_out, fb) ||
            !spec_grow((void **)&spec->hb_tok, cap * sizeof(int)) ||
            !spec_grow((void **)&spec->hb_pos, cap * sizeof(int)))
            return BT_ERR_NO_MEMORY;
        spec->hb_cap = (int)cap;
    }
    if (lrows > spec->hb_lcap) {
        size_t cap = (size_t)BT_MAX(lrows, 2 * spec->hb_lcap);

        if (!spec_grow((void **)&spec->hb_logits,
                       cap * spec->vocab * sizeof(float)))
            return BT_ERR_NO_MEMORY;
        spec->hb_lcap = (int)cap;
    }
    return BT_OK;
}

/* Host head: feeds the buffered target features of n sequences (those
 * with any) in one pass; slot t gets the pair (f[t], x[t+1]), and each
 * sequence's last output becomes its root feature. */
static bt_status_t spec_flush_host(spec_t *spec, spec_seq_t **ss, int n)
{
    int n_parts = 0, rows = 0;
    bt_status_t status;

    for (int i = 0; i < n; i++)
        rows += ss[i]->n_pend;
    if (rows == 0)
        return BT_OK;
    status = spec_hb_reserve(spec, rows, 0);
    if (status != BT_OK)
        return status;
    rows = 0;
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = ss[i];
        const int *toks = engine_seq_tokens(s->seq);

        if (s->n_pend == 0)
            continue;
        memcpy(spec->hb_feat + (size_t)rows * spec->dim, s->pend,
               sizeof(float) * (size_t)s->n_pend * spec->dim);
        for (int j = 0; j < s->n_pend; j++) {
            spec->hb_tok[rows + j] = toks[s->pend_pos + j + 1];
            spec->hb_pos[rows + j] = s->pend_pos + j;
        }
        spec->hb_parts[n_parts++] = (spec_head_part_t){
            &s->kv, s->n_pend, s->draft_len, s->draft_len, NULL };
        rows += s->n_pend;
    }
    spec->stats.head_rows += (uint64_t)rows;
    status = spec_head_forward_parts(spec->head, n_parts, spec->hb_parts,
                                     spec->hb_feat, spec->hb_tok,
                                     spec->hb_pos, spec->hb_out, NULL);
    if (status != BT_OK)
        return status;
    rows = 0;
    for (int i = 0; i < n; i++) { /* the parts' order */
        if (ss[i]->n_pend == 0)
            continue;
        rows += ss[i]->n_pend;
        memcpy(ss[i]->root_feat,
               spec->hb_out + (size_t)(rows - 1) * spec->dim,
               sizeof(float) * (size_t)spec->dim);
    }
    return BT_OK;
}

#ifdef BATON_HAVE_CUDA
/* Runs the queued stash copies (rows of the last target forward into
 * the sequences' stash rows); before anything reads the stash and
 * before the next forward. */
static bt_status_t spec_stash_run(spec_t *spec)
{
    int n = spec->n_st;

    if (n == 0)
        return BT_OK;
    spec->n_st = 0;
    return cuda_draft_stash(spec->dev, n, spec->fwd_hidden, spec->st_src,
                            spec->st_state, spec->st_row);
}

/* Grows the stash queue to n entries. */
static bt_status_t spec_stash_reserve(spec_t *spec, int n)
{
    int cap = BT_MAX(n, 2 * spec->st_cap);
    int *a, *b, *c;

    if (n <= spec->st_cap)
        return BT_OK;
    a = bt_realloc(spec->st_src, (size_t)cap * sizeof(int), "spec");
    if (a != NULL)
        spec->st_src = a;
    b = bt_realloc(spec->st_state, (size_t)cap * sizeof(int), "spec");
    if (b != NULL)
        spec->st_state = b;
    c = bt_realloc(spec->st_row, (size_t)cap * sizeof(int), "spec");
    if (c != NULL)
        spec->st_row = c;
    if (a == NULL || b == NULL || c == NULL)
        return BT_ERR_NO_MEMORY;
    spec->st_cap = cap;
    return BT_OK;
}
#endif

#ifdef BATON_HAVE_CUDA
/* Device head: one forward over the buffered rows of n sequences (raw
 * hidden rows, normalised on the device); the last row of each writes
 * its state's root (store row 0).  k > 0: also the top-k candidates of
 * every row (top_ids / top_logp, (rows, k)). */
static bt_status_t spec_flush_dev(spec_t *spec, spec_seq_t **ss, int n,
                                  int k, int *top_ids, float *top_logp)
{
    cuda_draft_row_t *rows;
    int total = 0, r = 0;
    bt_status_t status;

    for (int i = 0; i < n; i++)
        total += ss[i]->n_pend;
    if (total == 0)
        return BT_OK;
    status = spec_lrows_reserve(spec, total);
    if (status != BT_OK)
        return status;
    if (spec->feat_dev) { /* the buffered rows are in the stash */
        status = spec_stash_run(spec);
        if (status != BT_OK)
            return status;
    } else if (total > spec->fcat_rows) {
        float *p = bt_realloc(spec->fcat, (size_t)total * spec->dim *
                                              sizeof(float), "spec");
        if (p == NULL)
            return BT_ERR_NO_MEMORY;
        spec->fcat = p;
        spec->fcat_rows = total;
    }
    rows = spec->lrows;
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = ss[i];
        const int *toks = engine_seq_tokens(s->seq);

        if (!spec->feat_dev)
            memcpy(spec->fcat + (size_t)r * spec->dim, s->pend,
                   (size_t)s->n_pend * spec->dim * sizeof(float));
        for (int j = 0; j < s->n_pend; j++, r++) {
            cuda_draft_row_t *row = &rows[r];

            row->state = s->state;
            row->token = toks[s->pend_pos + j + 1];
            row->pos = s->pend_pos + j;
            row->slot = s->draft_len + j;
            row->ctx = s->draft_len;
            row->kv_len = s->draft_len + j + 1;
            row->mask = NULL;
            row->feat = -1 - (spec->feat_dev ? j : r);
            row->out = j == s->n_pend - 1 ? 0 : -1;
        }
    }
    spec->stats.head_rows += (uint64_t)total;
    return cuda_draft_forward(spec->dev, total, rows,
                              spec->feat_dev ? NULL : spec->fcat, total, k,
                              top_ids, top_logp, NULL, NULL);
}

/* Device head, a tree step's first head call: feeds every drafting
 * sequence's buffered features AND takes the level-1 candidates from the
 * same pass (the classifier on the last fed row is the root's), so a
 * tree costs one head call per level; sequences with nothing buffered
 * read their stored root (cuda_draft_topk). */
static bt_status_t spec_flush_roots_dev(spec_t *spec, spec_seq_t **ds,
                                        int nd, int k)
{
    int total = 0, n0 = 0, row = 0, need;
    int *idx0 = spec->full_rows;
    bt_status_t status;

    for (int i = 0; i < nd; i++)
        total += ds[i]->n_pend;
    need = BT_MAX(total, nd) * k;
    if (need > spec->ftop_cap) {
        int *ids = bt_realloc(spec->ftop_ids, (size_t)need * sizeof(int),
                              "spec");
        float *lp;

        if (ids == NULL)
            return BT_ERR_NO_MEMORY;
        spec->ftop_ids = ids;
        lp = bt_realloc(spec->ftop_logp, (size_t)need * sizeof(float),
                        "spec");
        if (lp == NULL)
            return BT_ERR_NO_MEMORY;
        spec->ftop_logp = lp;
        spec->ftop_cap = need;
    }
    if (total > 0) {
        status = spec_flush_dev(spec, ds, nd, k, spec->ftop_ids,
                                spec->ftop_logp);
        if (status != BT_OK)
            return status;
    }
    for (int i = 0; i < nd; i++) {
        spec_seq_t *s = ds[i];

        spec->top_n[i] = k;
        if (s->n_pend == 0) {
            spec->dtok[n0] = s->state;
            spec->dpos[n0] = 0;
            idx0[n0++] = i;
            continue;
        }
        row += s->n_pend;
        memcpy(spec->top_ids + (size_t)i * k,
               spec->ftop_ids + (size_t)(row - 1) * k, sizeof(int) * k);
        memcpy(spec->top_logp + (size_t)i * k,
               spec->ftop_logp + (size_t)(row - 1) * k, sizeof(float) * k);
        s->draft_len += s->n_pend;
        s->pend_pos += s->n_pend;
        s->n_pend = 0;
    }
    if (n0 == 0)
        return BT_OK;
    status = cuda_draft_topk(spec->dev, n0, spec->dtok, spec->dpos, k,
                             spec->ftop_ids, spec->ftop_logp, NULL);
    if (status != BT_OK)
        return status;
    for (int j = 0; j < n0; j++) {
        memcpy(spec->top_ids + (size_t)idx0[j] * k,
               spec->ftop_ids + (size_t)j * k, sizeof(int) * k);
        memcpy(spec->top_logp + (size_t)idx0[j] * k,
               spec->ftop_logp + (size_t)j * k, sizeof(float) * k);
    }
    return BT_OK;
}
#endif

/* Feeds the buffered features of n sequences to the draft head (one
 * device call for all of them). */
static bt_status_t spec_flush_many(spec_t *spec, spec_seq_t **ss, int n)
{
    bt_status_t status = BT_OK;

#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL) {
        status = spec_flush_dev(spec, ss, n, 0, NULL, NULL);
        if (status != BT_OK)
            return status;
    }
#endif
    if (spec->dev == NULL) {
        status = spec_flush_host(spec, ss, n);
        if (status != BT_OK)
            return status;
    }
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = ss[i];

        if (s->n_pend == 0)
            continue;
        s->draft_len += s->n_pend;
        s->pend_pos += s->n_pend;
        s->n_pend = 0;
    }
    return BT_OK;
}

static bt_status_t spec_flush(spec_t *spec, spec_seq_t *s)
{
    return spec_flush_many(spec, &s, 1);
}

/* Queues n target hidden rows (before the final norm) of the tokens just
 * cached, in token order.  The host head keeps them as features (after
 * the norm); the device head normalises them itself. */
static bt_status_t spec_push(spec_t *spec, spec_seq_t *s,
                             const float *hidden, int n)
{
    bt_status_t status;

    if (spec->lazy || (spec->dev != NULL && s->state < 0)) {
        /* speculation is off: no feature work at all; the draft cache
         * gets a gap that a later draft attends around */
        s->pend_pos += s->n_pend + n;
        s->n_pend = 0;
        return BT_OK;
    }
    while (n > 0) {
        int chunk = BT_MIN(n, SPEC_PEND_CAP - s->n_pend);
        float *dst = s->pend + (size_t)s->n_pend * spec->dim;

#ifdef BATON_HAVE_CUDA
        if (spec->feat_dev) {
            /* only imported rows come here (between steps: the stash
             * queue is empty then); a step's rows take spec_push_rows */
            status = cuda_draft_stash_host(spec->dev, s->state, s->n_pend,
                                           hidden, chunk);
            if (status != BT_OK)
                return status;
        } else
#endif
        if (spec->dev != NULL)
            memcpy(dst, hidden, (size_t)chunk * spec->dim * sizeof(float));
        else
            spec_head_feature(spec->head, hidden, chunk, dst);
        s->n_pend += chunk;
        hidden += (size_t)chunk * spec->dim;
        n -= chunk;
        if (s->n_pend == SPEC_PEND_CAP) {
            status = spec_flush(spec, s);
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
}

/* Queues hidden rows of the last target forward: row0 + (vidx ? vidx[i]
 * : i) for i < n, in token order.  Host rows go through spec_push; with
 * the features on the device they are queued for one stash copy of the
 * whole step (spec_stash_run). */
static bt_status_t spec_push_rows(spec_t *spec, spec_seq_t *s, int row0,
                                  const int *vidx, int n)
{
    bt_status_t status;

    if (!spec->feat_dev) {
        if (vidx == NULL)
            return spec_push(spec, s, spec->hidden +
                                          (size_t)row0 * spec->dim, n);
        for (int i = 0; i < n; i++)
            memcpy(spec->fbuf + (size_t)i * spec->dim,
                   spec->hidden + (size_t)(row0 + vidx[i]) * spec->dim,
                   sizeof(float) * (size_t)spec->dim);
        return spec_push(spec, s, spec->fbuf, n);
    }
#ifdef BATON_HAVE_CUDA
    if (spec->lazy || s->state < 0) { /* as spec_push */
        s->pend_pos += s->n_pend + n;
        s->n_pend = 0;
        return BT_OK;
    }
    for (int i = 0; i < n; ) {
        int chunk = BT_MIN(n - i, SPEC_PEND_CAP - s->n_pend);

        status = spec_stash_reserve(spec, spec->n_st + chunk);
        if (status != BT_OK)
            return status;
        for (int j = 0; j < chunk; j++, i++) {
            int row = row0 + (vidx ? vidx[i] : i);

            if (row < 0 || row >= spec->fwd_rows)
                return BT_ERROR(BT_ERR_INTERNAL, "SPEC",
                                "hidden row %d of a forward that kept %d",
                                row, spec->fwd_rows);
            spec->st_src[spec->n_st] = spec->fwd_map[row];
            spec->st_state[spec->n_st] = s->state;
            spec->st_row[spec->n_st++] = s->n_pend++;
        }
        if (s->n_pend == SPEC_PEND_CAP) {
            status = spec_flush(spec, s); /* runs the queue first */
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
#else
    (void)status;
    return BT_ERR_INTERNAL;
#endif
}

// ----------------------------------------------------------------------------
// drafting

/* logsumexp(row) and *best_p = the first index of its maximum; tmp: n
 * floats of scratch.  Eight lanes at a time (the maximum as
 * sampler_argmax finds it, the exponentials and their sums in one
 * cpu__exp_shift8 pass) where n allows. */
static float spec_logsumexp(const float *row, int n, float *tmp,
                            int *best_p)
{
    float mx = row[0], m8[8], shift[8], sum8[8];
    double sum = 0.0;
    int best = 0;

    if (n < 16 || n % 8 != 0 || row[0] != row[0]) {
        for (int i = 1; i < n; i++)
            if (row[i] > row[best])
                best = i;
        mx = row[best];
        for (int i = 0; i < n; i++)
            tmp[i] = row[i] - mx;
        cpu__exp_inplace(tmp, n);
        for (int i = 0; i < n; i++)
            sum += tmp[i];
        *best_p = best;
        return mx + (float)log(sum);
    }
    for (int l = 0; l < 8; l++)
        m8[l] = row[0];
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++)
            m8[l] = row[i + l] > m8[l] ? row[i + l] : m8[l];
    mx = m8[0];
    for (int l = 1; l < 8; l++)
        mx = m8[l] > mx ? m8[l] : mx;
    while (row[best] != mx)
        best++;
    for (int l = 0; l < 8; l++)
        shift[l] = mx;
    memcpy(tmp, row, sizeof(float) * (size_t)n);
    cpu__exp_shift8(tmp, n, shift, sum8);
    for (int l = 0; l < 8; l++)
        sum += sum8[l];
    *best_p = best;
    return mx + (float)log(sum);
}

/* row -= logsumexp(row) (spec_logsumexp); tmp: n floats of scratch. */
static void spec_log_softmax(float *row, int n, float *tmp)
{
    int best;
    float lse = spec_logsumexp(row, n, tmp, &best);

    for (int i = 0; i < n; i++)
        row[i] -= lse;
}

/* The k largest entries of row (ids best first, ties to the lower id). */
static int spec_topk(const float *row, int n, int k, int *ids, float *vals)
{
    int m = 0;

    for (int i = 0; i < n; i++) {
        int j;

        if (m == k && row[i] <= vals[m - 1])
            continue;
        j = m < k ? m++ : k - 1;
        while (j > 0 && vals[j - 1] < row[i]) {
            ids[j] = ids[j - 1];
            vals[j] = vals[j - 1];
            j--;
        }
        ids[j] = i;
        vals[j] = row[i];
    }
    return m;
}

/* Host head: candidates of logits row `row` of this level's batch.  A
 * chain (k = 1) needs only the argmax and its log-probability: the row
 * is left as it is (a fifth of a chain's host draft went to the whole
 * row's log-softmax and the top-k insertion). */
static void spec_row_topk(spec_t *spec, float *logits, int row, int k)
{
    if (k == 1) {
        int best;
        float lse = spec_logsumexp(logits, spec->vocab, spec->probs, &best);

        spec->top_ids[row] = best;
        spec->top_logp[row] = logits[best] - lse;
        spec->top_n[row] = 1;
        return;
    }
    spec_log_softmax(logits, spec->vocab, spec->probs);
    spec->top_n[row] = spec_topk(logits, spec->vocab, k,
                                 spec->top_ids + (size_t)row * k,
                                 spec->top_logp + (size_t)row * k);
}

/* Selects s's best `tokens` nodes and lays out the verification chunk:
 * v_tokens/v_pos/v_mask of 1 + n_sel entries. */
static void spec_tree_layout(spec_seq_t *s, int tokens)
{
    int cached = engine_seq_cached(s->seq);
    int *order = s->by_score;
    int n_sel, t1;

    /* the best `tokens` nodes, deterministic order (spec_tree.h) */
    n_sel = spec_tree_pick(s->nodes, s->n_nodes, tokens, order);
    s->n_sel = n_sel;
    /* verification order = node index order (parents first) */
    t1 = 1;
    for (int i = 0; i < s->n_nodes; i++) {
        if (s->nodes[i].vidx <= 0)
            continue;
        BT_ASSERT(s->nodes[i].vidx == t1);
        s->v_tokens[t1] = s->nodes[i].token;
        s->v_pos[t1] = cached + s->nodes[i].depth;
        t1++;
    }
    BT_ASSERT(t1 == n_sel + 1);
    s->v_tokens[0] = engine_seq_tokens(s->seq)[cached];
    s->v_pos[0] = cached;
    memset(s->v_mask, 0, (size_t)t1 * t1);
    s->v_mask[0] = 1;
    for (int i = 0; i < s->n_nodes; i++) {
        const spec_node_t *nd = &s->nodes[i];
        uint8_t *row;

        if (nd->vidx <= 0)
            continue;
        row = s->v_mask + (size_t)nd->vidx * t1;
        row[0] = 1;
        row[nd->vidx] = 1;
        for (int a = nd->parent; a >= 0; a = s->nodes[a].parent)
            row[s->nodes[a].vidx] = 1;
    }
}

/* Level 1: candidates from every drafting sequence's root feature. */
static bt_status_t spec_draft_roots(spec_t *spec, spec_seq_t **ds, int nd,
                                    int k)
{
#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL) {
        int *states = spec->dtok, *zero = spec->dpos;

        for (int i = 0; i < nd; i++) {
            states[i] = ds[i]->state;
            zero[i] = 0;
            spec->top_n[i] = k;
        }
        return cuda_draft_topk(spec->dev, nd, states, zero, k,
                               spec->top_ids, spec->top_logp, NULL);
    }
#endif
    {
        bt_status_t status = spec_hb_reserve(spec, nd, nd);

        if (status != BT_OK)
            return status;
    }
    for (int i = 0; i < nd; i++)
        memcpy(spec->hb_feat + (size_t)i * spec->dim, ds[i]->root_feat,
               sizeof(float) * (size_t)spec->dim);
    spec_head_logits(spec->head, spec->hb_feat, nd, spec->hb_logits);
    for (int i = 0; i < nd; i++)
        spec_row_topk(spec, spec->hb_logits + (size_t)i * spec->vocab, i, k);
    return BT_OK;
}

/* Lays out s's frontier for level d as batch rows from row r0: tokens,
 * positions and the tree mask (its ancestors among the expanded nodes
 * and itself); the device head's row records, or the host head's input
 * features and part si (spec_level_run runs them). */
static void spec_level_rows(spec_t *spec, spec_seq_t *s, int si, int d,
                            int r0)
{
    int cached = engine_seq_cached(s->seq);
    int width = s->n_exp + s->n_front;
    uint8_t *mask = spec->dmask + (size_t)si * spec->mask_stride;

    memset(mask, 0, (size_t)s->n_front * width);
    for (int r = 0; r < s->n_front; r++) {
        spec_node_t *nd = &s->nodes[s->frontier[r]];

        spec->dtok[r0 + r] = nd->token;
        spec->dpos[r0 + r] = cached + d - 1;
        for (int a = nd->parent; a >= 0; a = s->nodes[a].parent)
            mask[(size_t)r * width + s->nodes[a].feat] = 1;
        mask[(size_t)r * width + s->n_exp + r] = 1;
    }
#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL) {
        cuda_draft_row_t *rows = spec->lrows;

        for (int r = 0; r < s->n_front; r++) {
            spec_node_t *nd = &s->nodes[s->frontier[r]];
            cuda_draft_row_t *row = &rows[r0 + r];

            row->state = s->state;
            row->token = nd->token;
            row->pos = cached + d - 1;
            row->slot = s->draft_len + s->n_exp + r;
            row->ctx = s->draft_len;
            row->kv_len = s->draft_len + width;
            row->mask = mask + (size_t)r * width;
            row->feat = nd->parent < 0 ? 0
                                       : 1 + s->nodes[nd->parent].feat;
            row->out = 1 + s->n_exp + r;
        }
        return;
    }
#endif
    /* host head: this sequence's rows join the level's one pass
     * (spec_level_run) as part si */
    for (int r = 0; r < s->n_front; r++) {
        spec_node_t *nd = &s->nodes[s->frontier[r]];
        const float *in = nd->parent < 0
            ? s->root_feat
            : s->exp_feat + (size_t)s->nodes[nd->parent].feat * spec->dim;

        memcpy(spec->hb_feat + (size_t)(r0 + r) * spec->dim, in,
               sizeof(float) * (size_t)spec->dim);
    }
    spec->stats.head_rows += (uint64_t)s->n_front;
    /* a lone row whose ancestors are every expanded node (a chain) sees
     * the whole level: no mask, so the head takes the decode attention */
    bool chain = s->n_front == 1;
    if (chain) {
        int n_anc = 0;

        for (int a = s->nodes[s->frontier[0]].parent; a >= 0;
             a = s->nodes[a].parent)
            n_anc++;
        chain = n_anc == s->n_exp;
    }
    spec->hb_parts[si] = (spec_head_part_t){
        &s->kv, s->n_front, s->draft_len, s->draft_len + s->n_exp,
        chain ? NULL : mask };
}

/* Host head: one pass over the level's rows of every drafting sequence
 * (laid out by spec_level_rows, parts in ds order), then each row's
 * candidates; the outputs go to each sequence's expanded features. */
static bt_status_t spec_level_run(spec_t *spec, spec_seq_t **ds, int nd,
                                  int n_rows, int k)
{
    int n_parts = 0;
    bt_status_t status;

    for (int i = 0; i < nd; i++)
        if (ds[i]->lrow0 >= 0)
            spec->hb_parts[n_parts++] = spec->hb_parts[i];
    status = spec_head_forward_parts(spec->head, n_parts, spec->hb_parts,
                                     spec->hb_feat, spec->dtok, spec->dpos,
                                     spec->hb_out, spec->hb_logits);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < nd; i++) {
        spec_seq_t *s = ds[i];

        if (s->lrow0 < 0)
            continue;
        memcpy(s->exp_feat + (size_t)s->n_exp * spec->dim,
               spec->hb_out + (size_t)s->lrow0 * spec->dim,
               sizeof(float) * (size_t)s->n_front * spec->dim);
    }
    for (int r = 0; r < n_rows; r++)
        spec_row_topk(spec, spec->hb_logits + (size_t)r * spec->vocab, r, k);
    return BT_OK;
}

#ifdef BATON_HAVE_CUDA
/* The device draft loop: levels 2..depth of every tree on the device
 * (cuda_draft_tree) from the level-1 candidates in top_ids / top_logp
 * rows 0..nd-1, when every sequence grows the same depth and the shape
 * fits; *done_p false otherwise (the host path then runs).  The nodes
 * come back exactly as the host path would have built them (same rows,
 * same head passes, spec_tree.h's steps on the device), and the layout
 * below re-selects from them with the same function. */
static bt_status_t spec_draft_loop_dev(spec_t *spec, spec_seq_t **ds,
                                       int nd, int topk, int depth,
                                       bool *done_p)
{
    cuda_draft_tree_seq_t *tq;
    int max_dl = 0, node_cap;
    size_t need;
    bt_status_t status;

    *done_p = false;
    if (depth < 2)
        return BT_OK;
    for (int i = 0; i < nd; i++) {
        if (ds[i]->depth_lim != depth)
            return BT_OK;
        max_dl = BT_MAX(max_dl, ds[i]->draft_len);
    }
    if (!cuda_draft_tree_ok(spec->dev, nd, depth, topk, max_dl))
        return BT_OK;
    node_cap = cuda_draft_tree_nodes(depth, topk);
    if (node_cap > spec->node_cap)
        return BT_OK;
    need = (size_t)nd * node_cap;
    if (spec->loop_seqs == NULL) {
        spec->loop_seqs = bt_calloc((size_t)spec->max_seqs,
                                    sizeof(cuda_draft_tree_seq_t),
                                    "spec_loop");
        spec->loop_nsel = bt_calloc((size_t)spec->max_seqs, sizeof(int),
                                    "spec_loop");
        if (spec->loop_seqs == NULL || spec->loop_nsel == NULL)
            return BT_ERR_NO_MEMORY;
    }
    if (need > spec->loop_cap) {
        bt_free(spec->loop_nodes);
        bt_free(spec->loop_order);
        spec->loop_cap = 0;
        spec->loop_nodes = bt_malloc(need * sizeof(spec_node_t),
                                     "spec_loop");
        spec->loop_order = bt_malloc(need * sizeof(int), "spec_loop");
        if (spec->loop_nodes == NULL || spec->loop_order == NULL)
            return BT_ERR_NO_MEMORY;
        spec->loop_cap = need;
    }
    if (nd > spec->max_seqs)
        return BT_OK;
    tq = spec->loop_seqs;
    for (int i = 0; i < nd; i++) {
        tq[i].state = ds[i]->state;
        tq[i].draft_len = ds[i]->draft_len;
        tq[i].cached = engine_seq_cached(ds[i]->seq);
        tq[i].tokens = ds[i]->tokens_plan;
    }
    status = cuda_draft_tree(spec->dev, nd, tq, depth, topk, spec->top_ids,
                             spec->top_logp, spec->loop_nodes,
                             spec->loop_order, spec->loop_nsel);
    if (status != BT_OK)
        return status;
    spec->stats.head_rows += (uint64_t)nd * topk * (depth - 1);
    for (int i = 0; i < nd; i++) {
        spec_seq_t *s = ds[i];

        memcpy(s->nodes, spec->loop_nodes + (size_t)i * node_cap,
               (size_t)node_cap * sizeof(spec_node_t));
        s->n_nodes = node_cap;
        s->n_exp = (depth - 1) * topk;
        s->n_front = 0;
    }
    *done_p = true;
    return BT_OK;
}
#endif

/* Grows the draft trees of nd sequences (EAGLE-2), level by level with
 * one head call per level for all of them, and lays out each one's
 * verification chunk (s->n_sel draft tokens of at most s->tokens_plan). */
static bt_status_t spec_draft_all(spec_t *spec, spec_seq_t **ds, int nd,
                                  const spec_shape_t *shape)
{
    int topk = BT_MIN(shape->topk, spec->vocab);
    int max_depth = 0;
    bt_status_t status;

#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL) /* feeding + level 1 in one head call */
        status = spec_flush_roots_dev(spec, ds, nd, topk);
    else
#endif
        status = spec_flush_many(spec, ds, nd);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < nd; i++) {
        spec_seq_t *s = ds[i];

        BT_ASSERT(s->pend_pos == engine_seq_cached(s->seq) &&
                  s->draft_len <= s->pend_pos);
        s->n_nodes = 0;
        s->n_exp = 0;
        /* deeper than the token budget is unused */
        s->depth_lim = BT_MIN(shape->depth, s->tokens_plan);
        max_depth = BT_MAX(max_depth, s->depth_lim);
    }

#ifdef BATON_HAVE_CUDA
    if (spec->dev != NULL && spec->dev_loop) {
        bool done = false;

        status = spec_draft_loop_dev(spec, ds, nd, topk, max_depth, &done);
        if (status != BT_OK)
            return status;
        if (done) {
            for (int i = 0; i < nd; i++)
                spec_tree_layout(ds[i], ds[i]->tokens_plan);
            return BT_OK;
        }
    }
#endif
    /* level 1: the roots' children (device head: already taken) */
    if (spec->dev == NULL) {
        status = spec_draft_roots(spec, ds, nd, topk);
        if (status != BT_OK)
            return status;
    }
    for (int i = 0; i < nd; i++) {
        spec_seq_t *s = ds[i];

        s->n_front = spec_tree_first_level(
            s->nodes, &s->n_nodes, spec->top_ids + (size_t)i * topk,
            spec->top_logp + (size_t)i * topk, spec->top_n[i], s->frontier);
    }

    for (int d = 1; d < max_depth; d++) {
        int n_rows = 0;

#ifdef BATON_HAVE_CUDA
        if (spec->dev != NULL) {
            status = spec_lrows_reserve(spec, nd * topk);
            if (status != BT_OK)
                return status;
        } else
#endif
        {
            status = spec_hb_reserve(spec, nd * topk, nd * topk);
            if (status != BT_OK)
                return status;
        }
        for (int i = 0; i < nd; i++) {
            spec_seq_t *s = ds[i];

            s->lrow0 = -1;
            if (d >= s->depth_lim || s->n_front == 0)
                continue;
            s->lrow0 = n_rows;
            spec_level_rows(spec, s, i, d, n_rows);
            n_rows += s->n_front;
        }
        if (n_rows == 0)
            break;
        if (spec->dev == NULL) {
            status = spec_level_run(spec, ds, nd, n_rows, topk);
            if (status != BT_OK)
                return status;
        }
#ifdef BATON_HAVE_CUDA
        if (spec->dev != NULL) {
            spec->stats.head_rows += (uint64_t)n_rows;
            status = cuda_draft_forward(spec->dev, n_rows, spec->lrows, NULL,
                                        0, topk, spec->top_ids,
                                        spec->top_logp, NULL, NULL);
            if (status != BT_OK)
                return status;
            for (int r = 0; r < n_rows; r++)
                spec->top_n[r] = topk;
        }
#endif
        for (int i = 0; i < nd; i++) {
            spec_seq_t *s = ds[i];
            int cand[SPEC_MAX_TOPK * SPEC_MAX_TOPK];
            int n_front = s->n_front;

            if (s->lrow0 < 0)
                continue;
            /* children of the frontier, then the topk best new nodes
             * as the next frontier (spec_tree.h) */
            s->n_front = spec_tree_next_level(
                s->nodes, &s->n_nodes, s->frontier, n_front, s->n_exp,
                spec->top_ids + (size_t)s->lrow0 * topk,
                spec->top_logp + (size_t)s->lrow0 * topk,
                spec->top_n + s->lrow0, topk, d, topk, cand);
            s->n_exp += n_front;
        }
    }

    for (int i = 0; i < nd; i++)
        spec_tree_layout(ds[i], ds[i]->tokens_plan);
    return BT_OK;
}

// ----------------------------------------------------------------------------
// verification

/* Pool slot (block * block_size + offset) of sequence slot s. */
static int spec_pool_slot(spec_t *spec, const int *blocks, int s)
{
    int bs = backend_kv_layout(engine_backend(spec->engine))->block_size;

    return blocks[s / bs] * bs + s % bs;
}

/* Draws from probs (vocab) restricted to what is left, mass `mass`. */
static int spec_draw(spec_t *spec, sampler_t *smp, const float *probs,
                     float mass, int fallback)
{
    float r, cum = 0.0f;
    int last = -1;

    if (!(mass > 1e-12f))
        return fallback;
    r = sampler_uniform(smp) * mass;
    for (int i = 0; i < spec->vocab; i++) {
        if (probs[i] <= 0.0f)
            continue;
        cum += probs[i];
        last = i;
        if (r < cum)
            return i;
    }
    return last >= 0 ? last : fallback;
}

/* Lowest index of the largest value of row (greedy's tie rule). */
static int spec_argmax(const float *row, int n)
{
    int best = 0;

    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

/* One step of the walk down s's verified tree from node cur (-1: the
 * root), whose target logits are verification row `row`: *next_p = the
 * accepted child, or -1 and *tok_p = the bonus token.
 *   - sampling: recursive rejection sampling over cur's children, best
 *     draft score first (child c accepted with probability p(c) of what
 *     is left; on rejection p loses c); the bonus is drawn from the rest;
 *   - greedy verified on the device: the child equal to the target's
 *     argmax, else that argmax;
 *   - spec_test_force_accept (benchmarks): the best-scored child is
 *     accepted with the forced probability, whatever the target says;
 *     the bonus is the target's greedy token. */
static bt_status_t spec_walk(spec_t *spec, spec_seq_t *s, sampler_t *smp,
                             int cur, int row, int *next_p, int *tok_p)
{
    const float *lrow = spec->logits + (size_t)(s->row0 + row) * spec->vocab;
    float mass = 1.0f;
    int best = 0;

    *next_p = -1;
    if (spec->force_rate >= 0.0) {
        for (int i = 0; i < s->n_sel; i++)
            if (s->nodes[s->by_score[i]].parent == cur) {
                if (spec__rng_uniform(&spec->force_rng) < spec->force_rate)
                    *next_p = s->by_score[i];
                break;
            }
        if (*next_p < 0)
            *tok_p = s->use_amax ? spec->amax[s->row0 + row]
                                 : spec_argmax(lrow, spec->vocab);
        return BT_OK;
    }
    if (s->use_amax) {
        int t = spec->amax[s->row0 + row];

        for (int i = 0; i < s->n_sel; i++) {
            const spec_node_t *c = &s->nodes[s->by_score[i]];

            if (c->parent == cur && (c->token == t || spec->wrong_accept)) {
                *next_p = s->by_score[i];
                return BT_OK;
            }
        }
        *tok_p = t;
        return BT_OK;
    }
    sampler_probs(smp, lrow, spec->probs);
    for (int i = 1; i < spec->vocab; i++)
        if (spec->probs[i] > spec->probs[best])
            best = i;
    /* children of cur, best draft score first */
    for (int i = 0; i < s->n_sel; i++) {
        const spec_node_t *c = &s->nodes[s->by_score[i]];
        float p;

        if (c->parent != cur)
            continue;
        p = spec->probs[c->token];
        if (p > 0.0f && (spec->wrong_accept ||
                         sampler_uniform(smp) * mass < p)) {
            *next_p = s->by_score[i];
            return BT_OK;
        }
        mass -= p;
        spec->probs[c->token] = 0.0f;
    }
    *tok_p = spec_draw(spec, smp, spec->probs, mass, best);
    return BT_OK;
}

/* Accepts the longest path of s's verified tree by recursive rejection
 * sampling; commits the tokens, compacts KV, queues features.  Writes the
 * new tokens to out; returns how many. */
static bt_status_t spec_accept(spec_t *spec, spec_seq_t *s, int *out,
                               int *n_out_p)
{
    sampler_t *smp = engine_seq_sampler(s->seq);
    int cached = engine_seq_cached(s->seq);
    int n_blocks;
    const int *blocks = engine_seq_blocks(s->seq, &n_blocks);
    int cur = -1, n_acc = 0, path[SPEC_MAX_DEPTH + 1];
    int vrow[SPEC_MAX_DEPTH + 2]; /* rows of the kept features */
    int n_out = 0;
    bt_status_t status;

    for (;;) {
        int row = cur < 0 ? 0 : s->nodes[cur].vidx;
        int next = -1, tok = 0;

        status = spec_walk(spec, s, smp, cur, row, &next, &tok);
        if (status != BT_OK)
            return status;
        if (next < 0) { /* bonus token */
            status = engine_seq_commit(spec->engine, s->seq, &tok, 1,
                                       cached);
            if (status != BT_OK)
                return status;
            out[n_out++] = tok;
            break;
        }
        status = engine_seq_commit(spec->engine, s->seq,
                                   &s->nodes[next].token, 1, cached);
        if (status != BT_OK)
            return status;
        out[n_out++] = s->nodes[next].token;
        path[n_acc++] = next;
        cur = next;
    }

    /* keep the accepted K/V: root stays at slot cached, the node at
     * depth j moves from slot cached + vidx to cached + j */
    vrow[0] = 0;
    for (int j = 0; j < n_acc; j++) {
        int v = s->nodes[path[j]].vidx;

        vrow[j + 1] = v;
        if (v != j + 1) { /* moved by spec_step after every accept */
            spec->mv_src[spec->n_mv] = spec_pool_slot(spec, blocks,
                                                      cached + v);
            spec->mv_dst[spec->n_mv++] = spec_pool_slot(spec, blocks,
                                                        cached + j + 1);
        }
    }
    status = engine_seq_commit(spec->engine, s->seq, NULL, 0,
                               cached + 1 + n_acc);
    if (status != BT_OK)
        return status;
    status = spec_push_rows(spec, s, s->row0, vrow, 1 + n_acc);
    if (status != BT_OK)
        return status;
    *n_out_p = n_out;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// the step

static int spec_bucket(int n)
{
    return n <= 1 ? 0 : n <= 4 ? 1 : n <= 16 ? 2 : 3;
}

/* Picks this step's arm for a bucket.  Plain decoding is the baseline:
 * every plain step measures it, at no cost.  A speculative arm is tried
 * in an episode of SPEC_EPISODE measured steps, cheapest arm first (a
 * bigger one only while the next smaller one reaches SPEC_LADDER of
 * plain, so a losing chain of 2 rules out the trees); an arm that beats
 * plain by SPEC_ENTER, or a speculative default by SPEC_WIN, becomes the
 * default, and plain is then tried the same way (it wins back by
 * SPEC_WIN).  Every lost try multiplies the arm's wait (x8 for a clear
 * loss, which also ends the try after one step; x2 for a close one; up
 * to SPEC_EXPLORE_MAX steps, practically never), so where speculation
 * does not pay its cost vanishes.  Sets spec->lazy: no feature work
 * while plain runs and no try is within SPEC_WARM steps. */
static int spec_pick_arm(spec_t *spec, int b)
{
    uint64_t step = spec->bucket_steps[b]++;
    int best = spec->best_arm[b], cand = -1;
    uint64_t due = UINT64_MAX;

    if (spec->ep_arm[b] >= 0) { /* an episode runs until measured */
        /* a re-check of plain decoding runs it as plain decoding runs
         * (lazy: no hidden rows, no feature work), or the baseline it
         * measures is the slower plain-with-features step and a losing
         * arm keeps winning (stories260K at batch 1: a chain of 1 held
         * at 0.92x); the draft cache attends around the gap, and the
         * next speculative step decodes plainly once to fetch its root */
        spec->lazy = spec->ep_arm[b] == 0;
        return spec->ep_arm[b];
    }
    if (spec->arm_n[b][0] < SPEC_BASELINE_STEPS && best == 0) {
        spec->lazy = spec->arm_n[b][0] + SPEC_WARM < SPEC_BASELINE_STEPS;
        return 0;
    }
    /* the candidate: plain when speculating, else the smallest arm that
     * the ladder allows above the default */
    for (int a = 0; a < SPEC_N_ARMS; a++) {
        int below = a - 1; /* the next smaller arm that is tried */

        while (below > 0 && spec->arm_dup[below])
            below--;
        if (a == best || spec->arm_dup[a])
            continue;
        if (below > 0 && below > best &&
            !(spec->arm_n[b][below] > 0 &&
              spec->arm_rate[b][below] >= SPEC_LADDER *
                                              spec->arm_rate[b][0]))
            continue;
        if (spec->next_explore[b][a] < due) {
            due = spec->next_explore[b][a];
            cand = a;
        }
    }
    if (cand >= 0 && step >= due) {
        spec->ep_arm[b] = cand;
        spec->ep_left[b] = SPEC_EPISODE;
        /* an arm's first try runs one unmeasured episode first */
        spec->ep_warm[b] = spec->arm_n[b][cand] == 0 && cand != 0
                               ? SPEC_EPISODE : 0;
        spec->ep_tokens[b] = 0.0;
        spec->ep_ns[b] = 0.0;
        spec->lazy = cand == 0; /* as above */
        return cand;
    }
    spec->lazy = best == 0 && (cand < 0 || due > step + SPEC_WARM);
    return best;
}

/* Books one measured step of `arm` (tokens in ns) for bucket b. */
static void spec_measure(spec_t *spec, int b, int arm, int tokens,
                         double ns)
{
    double rate = tokens / BT_MAX(ns * 1e-9, 1e-12);
    uint64_t step = spec->bucket_steps[b];
    double r;
    bool win, clear;

    if (arm == 0 && spec->ep_arm[b] != 0) { /* the running baseline */
        double w;

        if (spec->plain_skip[b] < SPEC_PLAIN_SKIP) {
            spec->plain_skip[b]++;
            return;
        }
        w = BT_MAX(SPEC_EMA_PLAIN, 1.0 / (spec->arm_n[b][0] + 1));

        spec->arm_rate[b][0] = (1.0 - w) * spec->arm_rate[b][0] + w * rate;
        spec->arm_n[b][0]++;
        return;
    }
    if (arm != spec->ep_arm[b] && arm != spec->best_arm[b])
        return;
    if (arm != spec->ep_arm[b]) { /* the speculative default */
        spec->arm_rate[b][arm] = (1.0 - SPEC_EMA_PLAIN) *
                                     spec->arm_rate[b][arm] +
                                 SPEC_EMA_PLAIN * rate;
        return;
    }
    if (spec->ep_warm[b] > 0) {
        spec->ep_warm[b]--;
        return;
    }
    spec->ep_tokens[b] += tokens;
    spec->ep_ns[b] += ns;
    r = spec->ep_tokens[b] / BT_MAX(spec->ep_ns[b] * 1e-9, 1e-12);
    clear = r < SPEC_CLEAR * spec->arm_rate[b][spec->best_arm[b]];
    if (--spec->ep_left[b] > 0 && !clear)
        return;
    /* the episode is over: compare with the default arm */
    spec->arm_rate[b][arm] = spec->arm_n[b][arm] == 0
        ? r
        : (1.0 - SPEC_EMA) * spec->arm_rate[b][arm] + SPEC_EMA * r;
    spec->arm_n[b][arm]++;
    spec->ep_arm[b] = -1;
    win = arm == 0
        ? spec->arm_rate[b][0] * SPEC_WIN >
              spec->arm_rate[b][spec->best_arm[b]]
        : spec->arm_rate[b][arm] >
              (spec->best_arm[b] == 0 ? SPEC_ENTER : SPEC_WIN) *
                  spec->arm_rate[b][spec->best_arm[b]];
    BT_LOG_DEBUG("SPEC", "bucket %d step %llu arm %d try: %.0f tok/s (ema "
                 "%.0f) vs default %d %.0f: %s", b, (unsigned long long)step,
                 arm, r, spec->arm_rate[b][arm],
                 spec->best_arm[b], spec->arm_rate[b][spec->best_arm[b]],
                 win ? "wins" : "loses");
    if (win) {
        int old = spec->best_arm[b];

        spec->best_arm[b] = arm;
        if (arm == 0 && old != 0) {
            /* plain took back over: the speculative default lost its
             * tenure, which counts as a lost try (its wait doubles and
             * is never reset by its wins, so an arm that wins early in
             * the sequences and loses over them tries less and less:
             * aidreams260K at batch 8 otherwise oscillated) */
            spec->explore_gap[b][old] =
                BT_MIN(2 * spec->explore_gap[b][old],
                       (uint64_t)SPEC_EXPLORE_MAX);
            spec->next_explore[b][old] = step + spec->explore_gap[b][old];
        } else {
            /* re-check the old default soon */
            spec->explore_gap[b][old] = SPEC_EXPLORE_FIRST / 2;
            spec->next_explore[b][old] = step + SPEC_EXPLORE_FIRST;
        }
    } else {
        /* a clear loss waits 8x longer, a close one 2x */
        spec->explore_gap[b][arm] = BT_MIN((clear ? 8 : 2) *
                                               spec->explore_gap[b][arm],
                                           (uint64_t)SPEC_EXPLORE_MAX);
        spec->next_explore[b][arm] = step + spec->explore_gap[b][arm];
    }
}

#ifdef BATON_HAVE_CUDA
/* After a forward: where its hidden rows are on the device (features
 * on the device), checked against the rows asked for. */
static bt_status_t spec_fwd_rows(spec_t *spec, int rows)
{
    spec->fwd_hidden = NULL;
    spec->fwd_rows = 0;
    if (!spec->feat_dev)
        return BT_OK;
    spec->fwd_hidden = cuda_backend_hidden(engine_backend(spec->engine),
                                           &spec->fwd_map, &spec->fwd_rows);
    if (spec->fwd_hidden == NULL || spec->fwd_rows != rows)
        return BT_ERROR(BT_ERR_INTERNAL, "SPEC",
                        "the target kept %d hidden rows on the device, "
                        "%d asked", spec->fwd_rows, rows);
    return BT_OK;
}

/* A wide tree step on cuda (more logits rows than the backend samples on
 * the device in one chunk, which would bring every whole row to the
 * host): the backend returns hidden rows only, the draft's copy of the
 * final norm and classifier gives every row's argmax on the device, and
 * only the rows that sample (not plain argmax) get whole logits rows;
 * completing plain rows that sample draw on the host. */
static bt_status_t spec_forward_wide(spec_t *spec, spec_seq_t **seqs, int n,
                                     const backend_batch_t *batch, int rows)
{
    int n_full = 0;
    bt_status_t status;

    status = backend_forward(engine_backend(spec->engine), batch, NULL,
                             spec->feat_dev ? NULL : spec->hidden);
    if (status != BT_OK)
        return status;
    status = spec_fwd_rows(spec, rows);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = seqs[i];
        sampler_t *smp = engine_seq_sampler(s->seq);

        if (s->mode == SPEC_MODE_SKIP || s->n_rows == 0)
            continue;
        if (s->mode == SPEC_MODE_TREE) {
            if (!s->use_amax)
                for (int r = 0; r < s->take; r++)
                    spec->full_rows[n_full++] = s->row0 + r;
        } else if (spec->row_smp[s->row0 + s->n_rows - 1] != NULL &&
                   !sampler_is_argmax(smp)) {
            spec->full_rows[n_full++] = s->row0 + s->n_rows - 1;
        }
    }
    if (spec->feat_dev) /* the rows are still on the device */
        status = cuda_draft_target_argmax_dev(spec->dev, rows,
                                              spec->fwd_hidden, spec->fwd_map,
                                              spec->amax, n_full,
                                              spec->full_rows, spec->logits);
    else
        status = cuda_draft_target_argmax(spec->dev, rows, spec->hidden,
                                          spec->amax, n_full, spec->full_rows,
                                          spec->logits);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n; i++) { /* completing rows that sample */
        spec_seq_t *s = seqs[i];
        int last = s->row0 + s->n_rows - 1;

        if (s->mode == SPEC_MODE_SKIP || s->mode == SPEC_MODE_TREE ||
            s->n_rows == 0 || spec->row_smp[last] == NULL ||
            sampler_is_argmax(spec->row_smp[last]))
            continue;
        spec->amax[last] = sampler_sample(spec->row_smp[last],
                                          spec->logits +
                                              (size_t)last * spec->vocab);
    }
    spec->stats.logits_rows += (uint64_t)n_full;
    return BT_OK;
}
#endif

bt_status_t spec_step(spec_t *spec, spec_seq_t **seqs, int n, int *n_out,
                      int *out)
{
    const backend_config_t *bcfg = &engine_config(spec->engine)->backend;
    int max_step = spec_max_step_tokens(spec);
    int left = bcfg->max_batch_tokens, n_dec = 0, n_b = 0, rows = 0;
    int n_draft = 0;
    bool need_hidden, need_logits = false;
    int arm = -1, produced = 0;
    bool any_prefill = false;
    spec_shape_t shape;
    backend_batch_t batch;
    uint64_t t0 = bt_time_ns(), t1, t2;
#ifdef BATON_HAVE_CUDA
    uint64_t gpu0;
#endif
    bt_status_t status;

    if (n <= 0 || n > bcfg->max_seqs)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "step over %d sequences (1..%d allowed)", n,
                        bcfg->max_seqs);
    /* copies queued by a step that failed half way point at rows no
     * longer there: drop them (those sequences draft from stale stash
     * rows once, nothing worse) */
    spec->n_st = 0;
    for (int i = 0; i < n; i++) {
        int pending = engine_seq_len(seqs[i]->seq) -
                      engine_seq_cached(seqs[i]->seq);
        n_out[i] = 0;
        n_dec += pending == 1;
    }
    if (spec->fixed) {
        shape = spec->fixed_shape;
        spec->lazy = shape.tokens == 0;
    } else {
        arm = spec_pick_arm(spec, spec_bucket(n_dec));
        shape = spec->arms[arm];
    }

    /* plan: mode, blocks and the drafted tree of every sequence */
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = seqs[i];
        int cached = engine_seq_cached(s->seq);
        int pending = engine_seq_len(s->seq) - cached;
        int tokens;

        s->mode = SPEC_MODE_SKIP;
        s->drafted = 0;
        if (pending <= 0 || left <= 0)
            continue;
        if (cached + 1 > spec->max_ctx)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "sequence %d would exceed the context of %d", i,
                            spec->max_ctx);
        if (s->pend_pos + s->n_pend != cached) {
            /* tokens cached without their features (KV imported or the
             * sequence stepped outside): leave a gap in the draft cache,
             * decode this step plainly, draft again from the next */
            status = spec_flush(spec, s);
            if (status != BT_OK)
                return status;
            s->pend_pos = cached;
            if (pending == 1) {
                s->mode = SPEC_MODE_PLAIN;
                s->take = 1;
                goto reserve;
            }
        }
        if (pending > 1) {
            s->mode = SPEC_MODE_PREFILL;
            s->take = BT_MIN(pending, left);
            any_prefill = true;
        } else {
            tokens = BT_MIN(shape.tokens, BT_MIN(left - 1,
                                                 spec->max_ctx - cached - 1));
            if (s->max_slots > 0)
                tokens = BT_MIN(tokens, s->max_slots - cached - 1);
            s->mode = SPEC_MODE_PLAIN;
            s->take = 1;
            if (tokens > 0 && (spec->dev == NULL || s->state >= 0) &&
                engine_seq_reserve(spec->engine, s->seq,
                                   cached + 1 + tokens) == BT_OK) {
                /* drafted below, all sequences together; until then the
                 * budget counts the most it may take */
                s->mode = SPEC_MODE_TREE;
                s->tokens_plan = tokens;
                s->take = 1 + tokens;
                spec->dseqs[n_draft++] = s;
            }
        }
reserve:
        status = engine_seq_reserve(spec->engine, s->seq, cached + s->take);
        if (status != BT_OK)
            return status;
        left -= s->take;
    }

    /* every tree of the step, level by level over all sequences */
    if (n_draft > 0) {
        status = spec_draft_all(spec, spec->dseqs, n_draft, &shape);
        if (status != BT_OK)
            return status;
        for (int i = 0; i < n_draft; i++) {
            spec->dseqs[i]->take = 1 + spec->dseqs[i]->n_sel;
            spec->dseqs[i]->drafted = spec->dseqs[i]->n_sel;
        }
    }

    t1 = bt_time_ns();
    spec->stats.draft_ns += t1 - t0;
#ifdef BATON_HAVE_CUDA
    gpu0 = cuda_backend_gpu_ns(engine_backend(spec->engine));
#endif

    /* one target forward for every sequence, through
     * backend_forward_sample as engine_step does: ids are picked where
     * the logits are (the device argmax for cuda), and a step without a
     * tree while speculation is off (lazy) asks for exactly what
     * engine_step asks for: one logits row per completing sequence, no
     * hidden rows, no logits to the host (the decode graph on cuda) */
    need_hidden = !spec->lazy || n_draft > 0;
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = seqs[i];
        sampler_t *smp = engine_seq_sampler(s->seq);
        backend_seq_t *bs;
        int nb;

        s->use_amax = false;
        if (s->mode == SPEC_MODE_SKIP)
            continue;
        bs = &spec->bseqs[n_b++];
        memset(bs, 0, sizeof(*bs));
        bs->n_tokens = s->take;
        bs->ctx_len = engine_seq_cached(s->seq);
        bs->block_table = engine_seq_blocks(s->seq, &nb);
        if (s->mode == SPEC_MODE_TREE) {
            bs->tokens = s->v_tokens;
            bs->positions = s->v_pos;
            bs->mask = s->v_mask;
            bs->n_logits = s->take;
            /* greedy trees take the target's argmax ids; the others walk
             * whole logits rows (rejection sampling) */
            s->use_amax = !spec->host_verify && sampler_is_argmax(smp);
            for (int r = 0; r < s->take; r++)
                spec->row_smp[rows + r] = s->use_amax ? smp : NULL;
            need_logits |= !s->use_amax;
        } else {
            bool complete = bs->ctx_len + s->take == engine_seq_len(s->seq);

            bs->tokens = engine_seq_tokens(s->seq) + bs->ctx_len;
            bs->n_logits = need_hidden ? s->take : complete ? 1 : 0;
            for (int r = 0; r < bs->n_logits; r++)
                spec->row_smp[rows + r] = NULL;
            if (complete)
                spec->row_smp[rows + bs->n_logits - 1] = smp;
        }
        s->row0 = rows;
        s->n_rows = bs->n_logits;
        rows += bs->n_logits;
    }
    if (n_b == 0)
        return BT_OK;
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = n_b;
    batch.seqs = spec->bseqs;
    batch.keep_hidden = need_hidden && spec->feat_dev;
#ifdef BATON_HAVE_CUDA
    spec->fwd_hidden = NULL; /* set again by a forward that keeps them */
    spec->fwd_rows = 0;
    if (spec->dev != NULL && n_draft > 0 && rows > spec->wide_rows &&
        !spec->host_verify) {
        status = spec_forward_wide(spec, seqs, n, &batch, rows);
        need_logits = false; /* only the rows that need them */
    } else
#endif
    {
        status = backend_forward_sample(engine_backend(spec->engine),
                                        &batch, spec->row_smp, spec->amax,
                                        need_logits ? spec->logits : NULL,
                                        need_hidden && !spec->feat_dev
                                            ? spec->hidden : NULL);
#ifdef BATON_HAVE_CUDA
        if (status == BT_OK && need_hidden)
            status = spec_fwd_rows(spec, rows);
#endif
    }
    if (status != BT_OK)
        return status;
    spec->stats.fwd_calls++;
    if (need_hidden)
        spec->stats.hidden_rows += (uint64_t)rows;
    if (need_logits)
        spec->stats.logits_rows += (uint64_t)rows;
    t2 = bt_time_ns();
    spec->stats.verify_ns += t2 - t1;
#ifdef BATON_HAVE_CUDA
    spec->stats.verify_gpu_ns +=
        cuda_backend_gpu_ns(engine_backend(spec->engine)) - gpu0;
#endif

    /* accept, commit, feed the draft state */
    spec->n_mv = 0;
    for (int i = 0; i < n; i++) {
        spec_seq_t *s = seqs[i];
        int *o = out + (size_t)i * max_step;
        int cached = engine_seq_cached(s->seq);

        switch (s->mode) {
        case SPEC_MODE_TREE:
            status = spec_accept(spec, s, o, &n_out[i]);
            if (status != BT_OK)
                return status;
            spec->stats.verify_seqs++;
            spec->stats.verify_tokens += (uint64_t)n_out[i];
            spec->stats.draft_tokens += (uint64_t)(s->take - 1);
            produced += n_out[i];
            break;
        case SPEC_MODE_PLAIN:
        case SPEC_MODE_PREFILL: {
            bool complete = cached + s->take == engine_seq_len(s->seq);

            if (complete) {
                o[0] = spec->amax[s->row0 + s->n_rows - 1];
                n_out[i] = 1;
            }
            status = engine_seq_commit(spec->engine, s->seq, o, n_out[i],
                                       cached + s->take);
            if (status != BT_OK)
                return status;
            status = spec_push_rows(spec, s, s->row0, NULL, s->take);
            if (status != BT_OK)
                return status;
            if (s->mode == SPEC_MODE_PLAIN) {
                spec->stats.plain_seqs++;
                produced += n_out[i];
            }
            break;
        }
        default:
            break;
        }
    }
#ifdef BATON_HAVE_CUDA
    /* the step's kept features, into the stash before the next forward */
    status = spec_stash_run(spec);
    if (status != BT_OK)
        return status;
#endif
    /* keep the accepted K/V: one slot copy for the whole batch (every
     * read before every write, so moves may chain) */
    status = backend_kv_copy_slots(engine_backend(spec->engine), spec->n_mv,
                                   spec->mv_src, spec->mv_dst);
    if (status != BT_OK)
        return status;
    spec->stats.steps++;
    spec->stats.accept_ns += bt_time_ns() - t2;
    if (arm >= 0 && !any_prefill && produced > 0)
        spec_measure(spec, spec_bucket(n_dec), arm, produced,
                     (double)(bt_time_ns() - t0));
    return BT_OK;
}

bt_status_t spec_seq_import(spec_t *spec, spec_seq_t *s, const float *hidden,
                            int n)
{
    int cached = engine_seq_cached(s->seq);
    bool lazy;
    bt_status_t status;

    if (n < 0 || n > cached)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "%d imported hidden rows for %d cached tokens", n,
                        cached);
    if (s->pend_pos + s->n_pend != cached - n) {
        status = spec_flush(spec, s);
        if (status != BT_OK)
            return status;
        s->pend_pos = cached - n;
    }
    lazy = spec->lazy; /* shipped features are kept even while off */
    spec->lazy = false;
    status = spec_push(spec, s, hidden, n);
    spec->lazy = lazy;
    return status;
}

void spec_seq_set_max_slots(spec_seq_t *sseq, int max_slots)
{
    sseq->max_slots = BT_MAX(0, max_slots);
}

int spec_seq_last_drafted(const spec_seq_t *sseq)
{
    return sseq->drafted;
}

bt_status_t spec_seq_next(spec_t *spec, spec_seq_t *s, int *tok_p)
{
    int n_out = 0;
    bt_status_t status;

    while (s->q_len == 0) {
        status = spec_step(spec, &s, 1, &n_out, s->queue);
        if (status != BT_OK)
            return status;
        s->q_head = 0;
        s->q_len = n_out;
    }
    *tok_p = s->queue[s->q_head++];
    s->q_len--;
    return BT_OK;
}
