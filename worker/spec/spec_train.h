/*
 * spec_train.h - fits an EAGLE draft head to a target model on the CPU.
 *
 * Self-distillation (EAGLE trains on the target's own features): the
 * target samples its own text from BOS; one more forward over each text
 * records the features f[t] (last hidden state after the final norm).
 * The head reads (f[t] + noise, x[t+1]) and is fitted with AdamW to
 *     loss = w_feat * smoothL1(h, f[t+1])            (mean over elements)
 *          + w_tok  * CE(softmax(W_cls f[t+1]), softmax(W_cls h))
 * (EAGLE: w_feat 1, w_tok 0.1, uniform feature noise, gradient clipping
 * 0.5).  Forward and backward of the fusion layer and the decoder layer
 * are written out by hand (spec_train.c); tests check the gradient
 * against finite differences.
 */
#ifndef BT_WORKER_SPEC_SPEC_TRAIN_H
#define BT_WORKER_SPEC_SPEC_TRAIN_H

#include <stdint.h>

#include "bt_status.h"
#include "engine.h"
#include "spec_head.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_tokens;      /* training tokens to sample (default 32768) */
    int seq_len;       /* tokens per sampled text (0 = min(128, context)) */
    int epochs;        /* passes over the data (default 8) */
    int batch_seqs;    /* texts per optimizer step (default 8) */
    float lr;          /* AdamW peak learning rate (default 0.01) */
    float weight_decay;/* AdamW decoupled decay (default 0) */
    float w_feat;      /* feature regression weight (default 1) */
    float w_tok;       /* token cross-entropy weight (default 0.1) */
    float noise;       /* uniform feature noise half-width (default 0.1) */
    float temperature; /* sampling temperature of the texts (default 1) */
    float clip;        /* gradient norm clip (default 0.5, 0 = off) */
    uint64_t seed;     /* sampling and noise seed (default 1) */
    int n_threads;     /* training threads (0 = all cores) */
    int verbose;       /* log one line per epoch */
} spec_train_config_t;

void spec_train_config_init(spec_train_config_t *cfg);

/* Sampled texts with the target's features. */
typedef struct spec_train_data_s spec_train_data_t;

/* Samples cfg->n_tokens tokens of text from the engine's model (texts
 * from BOS, each ends at seq_len tokens or at BOS/EOS) and records their
 * features.  Uses the engine's sequences and KV pool; leaves none
 * behind. */
bt_status_t spec_train_data_create(engine_t *engine,
                                   const spec_train_config_t *cfg,
                                   spec_train_data_t **data_p);
void spec_train_data_destroy(spec_train_data_t **data_p);
int spec_train_data_tokens(const spec_train_data_t *data);
int spec_train_data_texts(const spec_train_data_t *data);

typedef struct {
    double first_loss;  /* mean loss of the first epoch */
    double last_loss;   /* mean loss of the last epoch */
    double last_top1;   /* last epoch: head argmax == target argmax rate */
    double seconds;     /* training wall time */
} spec_train_report_t;

/* Fits `head` in place.  rep may be NULL. */
bt_status_t spec_train(spec_head_t *head, const spec_train_data_t *data,
                       const spec_train_config_t *cfg,
                       spec_train_report_t *rep);

/* Loss over one text of n_tok tokens (tokens, feats (n_tok, dim)) and,
 * when grad is not NULL, its gradient added to grad (the flat parameter
 * layout of spec_head_params).  noise (n_tok - 1, dim) is added to the
 * input features, or NULL.  *top1_p (may be NULL) gets the number of
 * rows whose head argmax equals the target's.  For the trainer and the
 * gradient-check test. */
bt_status_t spec_train_loss(spec_head_t *head, const int *tokens,
                            const float *feats, int n_tok,
                            const float *noise, float w_feat, float w_tok,
                            float *grad, double *loss_p, int *top1_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SPEC_SPEC_TRAIN_H */
