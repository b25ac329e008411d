/*
 * sampler.h - turning a row of logits into the next token.
 *
 * Greedy (temperature 0), temperature, top-k, top-p, min-p, repetition /
 * presence / frequency penalties, and a per-request seed: the same seed
 * and logits always give the same tokens.  One sampler per request; it
 * remembers the tokens seen (for penalties) and its random state.
 */
#ifndef BT_WORKER_SAMPLER_H
#define BT_WORKER_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature;        /* 0 = greedy (argmax) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off, (0, 1] */
    float min_p;              /* 0 = off, [0, 1] */
    float repetition_penalty; /* 1 = off, > 0 (HF/CTRL semantics) */
    float presence_penalty;   /* 0 = off, [-2, 2] (OpenAI semantics) */
    float frequency_penalty;  /* 0 = off, [-2, 2] */
    uint64_t seed;            /* random stream; same seed, same output */
} sampler_params_t;

void sampler_params_init(sampler_params_t *params);

/* BT_ERR_INVALID_ARG with a message naming the bad field. */
bt_status_t sampler_params_validate(const sampler_params_t *params);

typedef struct sampler_s sampler_t;

bt_status_t sampler_create(const sampler_params_t *params, int vocab_size,
                           sampler_t **sampler_p);
void sampler_destroy(sampler_t **sampler_p);

/* Records a token as seen (prompt tokens for the repetition penalty, and
 * every generated token). */
void sampler_observe(sampler_t *sampler, int token);

/* Picks the next token from `logits` (vocab_size floats, modified in
 * place).  Does not observe the result; the caller does. */
int sampler_sample(sampler_t *sampler, float *logits);

/* Probability distribution the sampler draws from, after penalties,
 * temperature and truncation (speculative rejection sampling needs it).
 * `probs` has vocab_size floats; greedy gives a one-hot row. */
void sampler_probs(sampler_t *sampler, const float *logits, float *probs);

/* Advances the random stream as if n tokens had been sampled: a request
 * whose earlier tokens were sampled in another process (prefill, or a
 * decode worker that died) continues the same stream, so a seeded request
 * gives the same tokens in a cluster as in `baton run`. */
void sampler_skip(sampler_t *sampler, int n);

/* A uniform float in [0, 1) from the sampler's stream. */
float sampler_uniform(sampler_t *sampler);

/* True when sampler_sample is the argmax of the raw logits (temperature
 * 0, no penalties): a device can pick the token without the host seeing
 * the logits (speculative verification on the GPU). */
bool sampler_is_argmax(const sampler_t *sampler);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SAMPLER_H */
