/*
 * model_shard.c - tensor-parallel slices of a model (see model_shard.h).
 */
#include "model_shard.h"

#include "bt_error.h"
#include "bt_util.h"
#include "model_synth.h"

bt_status_t model_shard_check(const model_config_t *cfg, int tp)
{
    if (tp < 1 || tp > MODEL_SHARD_MAX_TP)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL",
                        "tensor parallelism %d is outside 1..%d", tp,
                        MODEL_SHARD_MAX_TP);
    if (cfg->n_heads % tp != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "tensor parallelism %d: the model's %d query heads "
                        "do not split evenly over %d ranks", tp,
                        cfg->n_heads, tp);
    if (cfg->n_kv_heads % tp != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "tensor parallelism %d: the model's %d KV heads do "
                        "not split evenly over %d ranks (KV heads are not "
                        "replicated)", tp, cfg->n_kv_heads, tp);
    if (cfg->hidden_dim % tp != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "tensor parallelism %d: the feed-forward size %d "
                        "does not split evenly over %d ranks", tp,
                        cfg->hidden_dim, tp);
    if (cfg->vocab_size < tp)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "tensor parallelism %d: vocabulary of %d is "
                        "smaller than the rank count", tp, cfg->vocab_size);
    return BT_OK;
}

bt_status_t model_shard_plan(const model_config_t *cfg, int tp, int rank,
                             model_shard_t *sh)
{
    bt_status_t status = model_shard_check(cfg, tp);

    if (status != BT_OK)
        return status;
    if (rank < 0 || rank >= tp)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL",
                        "rank %d outside 0..%d", rank, tp - 1);
    sh->tp = tp;
    sh->rank = rank;
    sh->n_heads = cfg->n_heads / tp;
    sh->head0 = rank * sh->n_heads;
    sh->n_kv_heads = cfg->n_kv_heads / tp;
    sh->kv_head0 = rank * sh->n_kv_heads;
    sh->n_hidden = cfg->hidden_dim / tp;
    sh->hidden0 = rank * sh->n_hidden;
    sh->vocab_shard = (int)BT_DIV_UP(cfg->vocab_size, tp);
    sh->vocab0 = BT_MIN(rank * sh->vocab_shard, cfg->vocab_size);
    sh->n_vocab = BT_MIN(cfg->vocab_size - sh->vocab0, sh->vocab_shard);
    return BT_OK;
}

model_slice_t model_shard_slice(const model_shard_t *sh,
                                const model_config_t *cfg,
                                const model_tensor_t *t, model_part_t part)
{
    int64_t hd = cfg->head_dim;
    model_slice_t s = { 0, t->rows, 0, t->cols };

    switch (part) {
    case MODEL_PART_WHOLE:
        break;
    case MODEL_PART_WQ:
        s.row0 = sh->head0 * hd;
        s.rows = sh->n_heads * hd;
        break;
    case MODEL_PART_WK:
    case MODEL_PART_WV:
        s.row0 = sh->kv_head0 * hd;
        s.rows = sh->n_kv_heads * hd;
        break;
    case MODEL_PART_BQ:
        s.col0 = sh->head0 * hd;
        s.cols = sh->n_heads * hd;
        break;
    case MODEL_PART_BK:
    case MODEL_PART_BV:
        s.col0 = sh->kv_head0 * hd;
        s.cols = sh->n_kv_heads * hd;
        break;
    case MODEL_PART_WO:
        s.col0 = sh->head0 * hd;
        s.cols = sh->n_heads * hd;
        break;
    case MODEL_PART_GATE:
    case MODEL_PART_UP:
        s.row0 = sh->hidden0;
        s.rows = sh->n_hidden;
        break;
    case MODEL_PART_DOWN:
        s.col0 = sh->hidden0;
        s.cols = sh->n_hidden;
        break;
    case MODEL_PART_CLS:
        s.row0 = sh->vocab0;
        s.rows = sh->n_vocab;
        break;
    }
    return s;
}

void model_slice_to_f32(const model_t *model, const model_tensor_t *t,
                        const model_slice_t *s, float *out)
{
    model_synth_src_t src;
    bool gen = t->data == NULL && model_synth_tensor(model, t, &src);

    BT_ASSERT(s->row0 >= 0 && s->col0 >= 0 && s->row0 + s->rows <= t->rows &&
              s->col0 + s->cols <= t->cols);
    for (int64_t i = 0; i < s->rows; i++) {
        int64_t off = (s->row0 + i) * t->cols + s->col0;
        float *row = out + i * s->cols;

        if (gen)
            model_synth_to_f32(&src, t->dtype, off, s->cols, row);
        else
            model_tensor_to_f32(t, off, s->cols, row);
    }
}
