/*
 * cuda_weights.c - the CUDA backend's weights onto the device: converted
 * from the checkpoint's dtype or generated there (synthesized models),
 * q|k|v and gate|up fused, precision fp8's E4M3 linears; freed with the
 * rank (cuda_backend.c says the whole design).
 */
#include "cuda_backend_int.h"

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

void cuda__layer_free(cuda_layer_t *cl)
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

bt_status_t cuda__weights_load(cuda_rank_t *r, const model_t *model)
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
