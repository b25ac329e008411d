/*
 * cuda_forward.c - the CUDA backend's forward pass: a step's indices up
 * in one copy, the layers' kernels, the logits rows down; decode-only
 * steps replayed from CUDA graphs; sampling on the device
 * (backend_forward_sample).  cuda_backend.c says the whole design.
 */
#include "cuda_backend_int.h"

// ---------------------------------------------------------------------
// The forward pass

size_t cuda__layer_kv_elems(const cuda_backend_t *b)
{
    return (size_t)b->kv.n_blocks * b->kv.block_size * b->kv_dim;
}

bt_status_t cuda__allreduce_via(cuda_rank_t *r, size_t n, bool custom)
{
    cuda_backend_t *b = r->b;

    if (custom)
        return cuda_allreduce_custom(&r->ar, n, r->stream);
    if (b->nccl == NULL)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "all-reduce of %zu floats needs NCCL", n);
    return cuda_nccl_allreduce_f32(b->nccl, r->comm, r->d_x, n, r->stream);
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
    return cuda__allreduce_via(r, n, custom && n % 4 == 0);
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
    if (p->sz.want_hidden && r->rank == 0)
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
    wa.kv_slots = (long long)p->sz.n_pages * b->kv.block_size;
    wa.kv_widened = true;
    status = cuda_kv8_widen_pages(d_kl, d_vl, page, p->d_pages, p->sz.n_pages,
                                  (void *)wa.d_k_cache, (void *)wa.d_v_cache,
                                  r->stream);
    if (status != BT_OK)
        return status;
    return cuda_attn_prefill(&wa, p->d_tiles, p->sz.n_tiles, b->dt, r->stream);
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
    size_t layer_kv_bytes = cuda__layer_kv_elems(b) * b->kv.elem_size;
    int nt = p->sz.nt;
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
    const bool fuse_rope = p->sz.single &&
                           p->sz.n_gen <= CUDA_ROPE_FUSE_MAX_TOK &&
                           !(b->skip & (CUDA_SKIP_ROPE | CUDA_SKIP_ATTN)) &&
                           cuda_attn_decode_rope_ok(&aa, p->sz.n_gen, b->dt);
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
            status = cuda_attn_decode(&aa, p->d_gen, p->sz.n_gen,
                                      p->sz.n_splits, p->sz.split_len,
                                      r->d_ws, b->dt, r->stream);
            if (status != BT_OK)
                return status;
            status = p->sz.n_pages > 0
                         ? cuda_prefill_widened(r, p, &aa, d_kl, d_vl)
                         : cuda_attn_prefill(&aa, p->d_tiles, p->sz.n_tiles,
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

    for (int r0 = 0; r0 < p->sz.n_rows; r0 += b->row_cap) {
        int n = BT_MIN(b->row_cap, p->sz.n_rows - r0);

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

    if (p->sz.nt <= 2)
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
        if (g->bucket == p->sz.nt && g->n_splits == p->sz.n_splits &&
            g->split_len == p->sz.split_len &&
            g->hidden == p->sz.want_hidden && g->single == p->sz.single) {
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
    g->bucket = p->sz.nt;
    g->n_splits = p->sz.n_splits;
    g->split_len = p->sz.split_len;
    g->hidden = p->sz.want_hidden;
    g->single = p->sz.single;
    r->n_graphs++;
    BT_LOG_DEBUG("CUDA", "captured decode graph: bucket %d, %d splits of %d",
                 p->sz.nt, p->sz.n_splits, p->sz.split_len);
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

    status = cuda__rank_enter(r);
    if (status != BT_OK)
        return status;
    memset(&p, 0, sizeof(p));
    p.sz = st->sz;
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
    nt_pad = graph ? cuda__pow2_ceil(nt) : nt;
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
    status = cuda__meta_reserve(b, ints, BT_MAX(mask_total, (size_t)1));
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
    st.sz.n_pages = (int)n_pages;

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

    st.sz.nt = nt_pad;
    st.sz.n_rows = rows_c;
    st.sz.n_gen = n_gen;
    st.sz.n_tiles = n_tiles;
    st.sz.want_hidden = hidden != NULL || batch->keep_hidden;
    st.sz.single = single && batch->on_layer_done == NULL;
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
                              &st.sz.n_splits, &st.sz.split_len);
        if (graph && st.sz.n_splits > 1) {
            /* Round splits up to a power of two so few graphs cover every
             * context length (the extra splits find no keys). */
            int ns = cuda__pow2_ceil(st.sz.n_splits);
            if (ns <= max_splits)
                st.sz.n_splits = ns;
        }
    }
    BT_ASSERT((size_t)pg == n_pages);
    st.meta_ints = off + bt_total + (n_pages > 0 ? n_pages + bt_total : 0);
    st.mask_bytes = mask_total;
    st.batch = batch;
    st.h_logits = logits;
    st.h_hidden = hidden;
    st.no_sync = no_sync && b->tp == 1;
    b->hid_kept = st.sz.want_hidden;
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

bt_status_t cuda__forward(void *impl, const backend_batch_t *batch,
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
bt_status_t cuda__forward_sample_begin(void *impl,
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

bt_status_t cuda__forward_sample_end(void *impl)
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
