/*
 * spec_head.h - an EAGLE draft head: the small network that proposes
 * tokens for speculative decoding.
 *
 * Layout (EAGLE-1/2, SafeAILab/EAGLE eagle/model/cnets1.py): for the
 * token x[t+1] and the target's feature f[t] at position t,
 *     h   = fc([embed(x[t+1]); f[t]])          fc: (dim, 2*dim) + bias
 *     h  += o_proj(attn(rope(q_proj h), rope(k_proj h), v_proj h))
 *                                              (no input norm: layer 0)
 *     h  += down(silu(gate(n)) * up(n)),  n = rmsnorm(h) * post_norm
 * and h predicts the target's feature f[t+1]; the target's own
 * classifier applied to h (no norm, as EAGLE does) drafts x[t+2].
 * A "feature" is the target's last hidden state *after* its final norm
 * (what Hugging Face LlamaModel returns and EAGLE trains on); the
 * backends return it before the norm, so callers apply
 * spec_head_feature() first.
 *
 * The head reuses the target's embedding table, classifier and final
 * norm (borrowed from the model, which must outlive the head) and owns
 * its other weights as one flat float32 array (the trainer updates it in
 * place).  RoPE always uses the half-split layout (Hugging Face, which
 * published heads use) with the target's theta and scaling.
 *
 * Safetensors names, as published EAGLE heads write them: fc.weight,
 * fc.bias, layers.0.self_attn.{q,k,v,o}_proj.weight,
 * layers.0.post_attention_layernorm.weight,
 * layers.0.mlp.{gate,up,down}_proj.weight.  Other tensors in the file
 * (embed_tokens.weight) are ignored; a missing fc.bias reads as zeros.
 *
 * Not thread-safe: one caller at a time per head (it has scratch).
 */
#ifndef BT_WORKER_SPEC_SPEC_HEAD_H
#define BT_WORKER_SPEC_SPEC_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPEC_HEAD_N_TENSORS 10

/* Views of the head's own weights inside its flat parameter array. */
typedef struct {
    float *fc_w;      /* (dim, 2 * dim) input [embedding; feature] */
    float *fc_b;      /* (dim) */
    float *wq;        /* (n_heads * head_dim, dim) */
    float *wk;        /* (n_kv_heads * head_dim, dim) */
    float *wv;        /* (n_kv_heads * head_dim, dim) */
    float *wo;        /* (dim, n_heads * head_dim) */
    float *post_norm; /* (dim) */
    float *w_gate;    /* (hidden_dim, dim) */
    float *w_up;      /* (hidden_dim, dim) */
    float *w_down;    /* (dim, hidden_dim) */
} spec_head_weights_t;

typedef struct spec_head_s spec_head_t;

/* A fresh head for `target`: feed-forward width `hidden_dim` (0 = the
 * target's), weights drawn from a seeded uniform(-1/sqrt(in), 1/sqrt(in))
 * except fc, which starts as [0 | I] so the head begins by passing the
 * feature through (training converges much faster from there). */
bt_status_t spec_head_create(const model_t *target, int hidden_dim,
                             uint64_t seed, spec_head_t **head_p);

/* Loads a head from a safetensors file; shapes must match the target
 * (BT_ERR_FORMAT naming the tensor otherwise). */
bt_status_t spec_head_load(const model_t *target, const char *path,
                           spec_head_t **head_p);

/* Writes the head's own tensors (float32) to a safetensors file. */
bt_status_t spec_head_save(const spec_head_t *head, const char *path);

void spec_head_destroy(spec_head_t **head_p);

const model_config_t *spec_head_config(const spec_head_t *head);
int spec_head_hidden_dim(const spec_head_t *head);
const spec_head_weights_t *spec_head_weights(spec_head_t *head);
/* The flat parameter array (the trainer's view) and its length. */
float *spec_head_params(spec_head_t *head, size_t *n_p);
/* Borrowed target tables, float32. */
const float *spec_head_embedding(const spec_head_t *head);  /* (vocab, dim) */
const float *spec_head_classifier(const spec_head_t *head); /* (vocab, dim) */
const float *spec_head_inv_freq(const spec_head_t *head);   /* (hd / 2) */
const float *spec_head_final_norm(const spec_head_t *head); /* (dim) */

/* Target hidden state (before the final norm) -> EAGLE feature (after):
 * out = rmsnorm(hidden) * final_norm, n rows of dim; out may be hidden. */
void spec_head_feature(const spec_head_t *head, const float *hidden, int n,
                       float *out);

/* The head's own KV cache for one sequence: slots (cap, kv_dim). */
typedef struct {
    float *k;  /* (cap, n_kv_heads * head_dim) */
    float *v;  /* (cap, n_kv_heads * head_dim) */
    int cap;   /* slots */
} spec_head_kv_t;

bt_status_t spec_head_kv_init(const spec_head_t *head, int cap,
                              spec_head_kv_t *kv);
void spec_head_kv_cleanup(spec_head_kv_t *kv);

/* Runs the head over n inputs (feat[i], token[i]) at RoPE positions
 * pos[i].  Input i writes its K/V to slot base + i (base + n <= cap) and
 * attends to every slot in [0, ctx) and to slot ctx + j for
 * j <= base - ctx + i when mask is NULL, or when
 * mask[i * (base - ctx + n) + j] != 0 (a draft tree).  Writes the
 * predicted features to out_feat (n, dim) and, when logits is not NULL,
 * the classifier rows (n, vocab).  BT_ERR_INVALID_ARG when the slots do
 * not fit. */
bt_status_t spec_head_forward(spec_head_t *head, spec_head_kv_t *kv, int n,
                              const float *feat, const int *tokens,
                              const int *pos, int ctx, int base,
                              const uint8_t *mask, float *out_feat,
                              float *logits);

/* One sequence's rows in spec_head_forward_parts: n rows against its
 * own cache, with ctx, base and mask as spec_head_forward takes them. */
typedef struct {
    spec_head_kv_t *kv;
    int n;
    int ctx;
    int base;
    const uint8_t *mask;
} spec_head_part_t;

/* spec_head_forward for several sequences at once: the parts' rows are
 * concatenated in part order in feat, tokens, pos, out_feat and logits.
 * The products run over all rows together (each weight read once for
 * the batch), attention per part; every row's result is bit for bit
 * what spec_head_forward gives it alone. */
bt_status_t spec_head_forward_parts(spec_head_t *head, int n_parts,
                                    const spec_head_part_t *parts,
                                    const float *feat, const int *tokens,
                                    const int *pos, float *out_feat,
                                    float *logits);

/* logits (n, vocab) = classifier . feat (n, dim). */
void spec_head_logits(const spec_head_t *head, const float *feat, int n,
                      float *logits);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SPEC_SPEC_HEAD_H */
