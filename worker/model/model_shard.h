/*
 * model_shard.h - how a model's weights split across tensor-parallel
 * ranks (Megatron style), as pure arithmetic on the config so that the
 * CUDA backend and the CPU tests cut the same slices.
 *
 * Rank r of tp:
 *   - attention is column-parallel by heads: query heads
 *     [r*nh/tp, (r+1)*nh/tp), KV heads [r*nkv/tp, (r+1)*nkv/tp) (GQA
 *     groups stay whole: nh/nkv is the same on every rank), so wq/wk/wv
 *     (and their biases) contribute those heads' rows and the KV pool of
 *     the rank holds only its KV heads;
 *   - wo is row-parallel: the columns of the rank's query heads; each
 *     rank's o-projection is a partial sum of the residual update;
 *   - w_gate / w_up are column-parallel: rows [r*hidden/tp, ...);
 *     w_down row-parallel: the same columns; again a partial sum;
 *   - the classifier is vocab-sharded: rows [r*vs, min(vocab, (r+1)*vs))
 *     with vs = ceil(vocab / tp) (the last shard may be shorter);
 *   - the embedding and every norm are replicated.
 * Summing the partial o and down outputs over the ranks (the all-reduce)
 * gives the unsharded layer.
 */
#ifndef BT_WORKER_MODEL_MODEL_SHARD_H
#define BT_WORKER_MODEL_MODEL_SHARD_H

#include <stdint.h>

#include "bt_status.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_SHARD_MAX_TP 64

/* One rank's share of the model. */
typedef struct {
    int tp;           /* ranks */
    int rank;         /* this rank, 0..tp-1 */
    int head0;        /* first query head */
    int n_heads;      /* query heads (nh / tp) */
    int kv_head0;     /* first KV head */
    int n_kv_heads;   /* KV heads (nkv / tp) */
    int hidden0;      /* first feed-forward row */
    int n_hidden;     /* feed-forward rows (hidden / tp) */
    int vocab0;       /* first classifier row */
    int n_vocab;      /* classifier rows of this rank (may be < vocab_shard) */
    int vocab_shard;  /* ceil(vocab / tp): rows per rank before the last */
} model_shard_t;

/* Which part of a layer (or model) a tensor is, for its slice. */
typedef enum {
    MODEL_PART_WHOLE = 0, /* embedding, norms: replicated */
    MODEL_PART_WQ,        /* rows of the rank's query heads */
    MODEL_PART_WK,        /* rows of the rank's KV heads */
    MODEL_PART_WV,
    MODEL_PART_BQ,        /* elements of the rank's query heads */
    MODEL_PART_BK,        /* elements of the rank's KV heads */
    MODEL_PART_BV,
    MODEL_PART_WO,        /* columns of the rank's query heads */
    MODEL_PART_GATE,      /* rows of the rank's feed-forward slice */
    MODEL_PART_UP,
    MODEL_PART_DOWN,      /* columns of the rank's feed-forward slice */
    MODEL_PART_CLS        /* rows of the rank's vocab slice */
} model_part_t;

/* A sub-matrix of a (rows, cols) row-major tensor: rows [row0, row0 +
 * rows), columns [col0, col0 + cols).  Vectors are (1, n). */
typedef struct {
    int64_t row0, rows;
    int64_t col0, cols;
} model_slice_t;

/* Checks that the model splits over `tp` ranks: 1 <= tp <= 64, query
 * heads, KV heads and the feed-forward size divisible by tp, vocab >= tp.
 * BT_ERR_INVALID_ARG (bad tp) or BT_ERR_UNSUPPORTED naming the size that
 * does not divide, with a message. */
bt_status_t model_shard_check(const model_config_t *cfg, int tp);

/* Rank `rank`'s share (after model_shard_check). */
bt_status_t model_shard_plan(const model_config_t *cfg, int tp, int rank,
                             model_shard_t *sh);

/* The slice of tensor `t` (its full shape) that part `part` gives the
 * rank. */
model_slice_t model_shard_slice(const model_shard_t *sh,
                                const model_config_t *cfg,
                                const model_tensor_t *t, model_part_t part);

/* Copies slice `s` of `model`'s tensor `t` to out (s->rows x s->cols
 * float32, row-major), lazy synthesized tensors included (generated). */
void model_slice_to_f32(const model_t *model, const model_tensor_t *t,
                        const model_slice_t *s, float *out);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_MODEL_SHARD_H */
