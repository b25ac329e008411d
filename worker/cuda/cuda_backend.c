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
 *
 * Files: cuda_backend.c (ranks, create / destroy, the ops table),
 * cuda_weights.c (weights onto the device), cuda_forward.c (the forward
 * pass, decode graphs, sampling on the device), cuda_kv.c (the KV pool's
 * copies and the prefix cache's host tier), cuda_allreduce_bench.c (the
 * tensor-parallel all-reduce benchmark); what they share is
 * cuda_backend_int.h.
 */
#include "cuda_backend_int.h"

// ---------------------------------------------------------------------
// Running work on every rank

/* Runs fn(b, r) on every rank: the caller's thread for one rank (the
 * single-GPU path: no threads, no device switch), the crew for several. */
bt_status_t cuda__each_rank(cuda_backend_t *b, backend_tp_fn fn)
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
bt_status_t cuda__rank_enter(cuda_rank_t *r)
{
    if (r->b->tp == 1)
        return BT_OK;
    return BT_CUDA_STATUS(cudaSetDevice(r->device));
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

int cuda__pow2_ceil(int x)
{
    int p = 1;

    while (p < x)
        p <<= 1;
    return p;
}

static void cuda_destroy(void *impl);

/* Drops every captured graph of the rank (they hold pointers to buffers
 * that are about to move). */
static void cuda_graphs_drop(cuda_rank_t *r)
{
    for (int i = 0; i < r->n_graphs; i++)
        cudaGraphExecDestroy(r->graphs[i].exec);
    r->n_graphs = 0;
}

/* Rank op: (re)allocates the device metadata buffers to the backend's
 * current capacities (after cuda__meta_reserve grew them). */
static bt_status_t cuda_rank_meta_alloc(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    bt_status_t status = cuda__rank_enter(r);

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
bt_status_t cuda__meta_reserve(cuda_backend_t *b, size_t ints,
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
    status = cuda__each_rank(b, cuda_rank_meta_alloc);
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
    r->attn_bps = cuda_attn_decode_blocks_per_sm(
        hd, b->kv8, b->mc.n_heads / b->mc.n_kv_heads);
    status = BT_CUDA_STATUS(cudaStreamCreateWithFlags(&r->stream,
                                                      cudaStreamNonBlocking));
    if (status != BT_OK)
        return status;
    status = worker_gemm_ctx_create(CUDA_GEMM_WS, &r->gemm);
    if (status == BT_OK && b->fp8) /* before any graph capture */
        status = cuda_gemv_fp8_fused_prepare();
    if (status != BT_OK)
        return status;

    status = cuda__weights_load(r, b->op_model);
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
    bt_status_t status = cuda__rank_enter(r);

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
    bt_status_t status = cuda__rank_enter(r);

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
    status = cuda__each_rank(b, cuda_rank_mem_probe);
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
    bt_status_t status = cuda__rank_enter(r);

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
    bt_status_t status = cuda__rank_enter(r);

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
        status = cuda__allreduce_via(r, (size_t)n, path == 1);
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
    b->bucket_max = cuda__pow2_ceil(b->cfg.max_seqs);
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
    status = cuda__each_rank(b, cuda_rank_init);
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
    status = cuda__meta_reserve(b, (size_t)16 * b->max_tok + 4096, 4096);
    if (status != BT_OK)
        goto err;
    status = cuda_size_kv(b);
    if (status != BT_OK)
        goto err;
    status = cuda__each_rank(b, cuda_rank_kv_alloc);
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
            cuda__layer_free(&r->layers[l]);
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
    cuda__host_tier_free(b);          /* tp == 1 too */
    if (b->ranks) /* by the crew, or from here when it never started */
        (void)cuda__each_rank(b, cuda_rank_free);
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
    .forward = cuda__forward,
    .kv_data = cuda__kv_data,
    .kv_copy_block = cuda__kv_copy_block,
    .kv_layout = cuda_kv_layout,
    .kv_copy_slots = cuda__kv_copy_slots_op,
    .kv_data_rank = cuda__kv_data_rank,
    .forward_sample_begin = cuda__forward_sample_begin,
    .forward_sample_end = cuda__forward_sample_end,
    .mem_info = cuda_mem_info,
    .kv_host_copy = cuda__kv_host_copy,
    .host_pin = cuda__host_pin,
    .kv_copy_in = cuda__kv_copy_in,
    .step_quantum = cuda_step_quantum,
};
