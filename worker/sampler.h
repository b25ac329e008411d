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
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The parameter contract's sampling part (params/params.h): its fields,
 * defaults and bounds are the ones baton-http, the router and the CLI
 * check. */
typedef params_sampling_t sampler_params_t;

/* params_sampling_init. */
void sampler_params_init(sampler_params_t *params);

/* params_sampling_validate, logging the refusal (BT_ERR_INVALID_ARG with
 * the contract's message naming the bad field). */
bt_status_t sampler_params_validate(const sampler_params_t *params);

typedef struct sampler_s sampler_t;

bt_status_t sampler_create(const sampler_params_t *params, int vocab_size,
                           sampler_t **sampler_p);
void sampler_destroy(sampler_t **sampler_p);

/* Records a token as seen (prompt tokens for the repetition penalty, and
 * every generated token). */
void sampler_observe(sampler_t *sampler, int token);

/* Picks the next token from `logits` (vocab_size floats, not modified).
 * Does not observe the result; the caller does.  With params.logprobs it
 * also computes the token's logprobs (sampler_last_logprobs): a device
 * backend then sends the whole row (sampler_need is SAMPLER_NEED_ROW). */
int sampler_sample(sampler_t *sampler, float *logits);

/* Probability distribution the sampler draws from, after penalties,
 * temperature and truncation (speculative rejection sampling needs it).
 * `probs` has vocab_size floats; greedy gives a one-hot row. */
void sampler_probs(sampler_t *sampler, const float *logits, float *probs);

/* ---- log-probabilities (issue 39) ----
 * Of the raw model distribution: log_softmax of the logits as the model
 * gave them, before penalties, grammar mask, temperature and truncation
 * (vLLM's default), so the numbers say what the model thinks, not how
 * the token was drawn. */
typedef struct {
    float logprob;                           /* the token's */
    int n_top;                               /* alternatives below */
    int top_ids[PARAMS_MAX_LOGPROBS];        /* (n_top) most likely first,
                                              * ties: lower id first */
    float top_logprobs[PARAMS_MAX_LOGPROBS]; /* (n_top) */
} sampler_logprobs_t;

/* Computes `token`'s logprob and the n_top (<= PARAMS_MAX_LOGPROBS) most
 * likely ids of the row `logits` (vocab floats, not modified).  Used by
 * the sampler and for prompt positions (echo), so both agree. */
void sampler_logprobs_row(const float *logits, int vocab, int token,
                          int n_top, sampler_logprobs_t *out);

/* The last sampler_sample()'s token logprobs (with params.top_logprobs
 * alternatives), or NULL when the params ask for none.  Valid until the
 * next sample. */
const sampler_logprobs_t *sampler_last_logprobs(const sampler_t *sampler);

/* A prompt's logprobs (echo / prompt_logprobs), gathered chunk by chunk
 * from the logits rows of every prompt position: position p's logprob
 * (p >= 1; position 0 has none) comes from the row after position p-1. */
typedef struct {
    int n;          /* prompt tokens */
    int k;          /* alternatives per position, 0..PARAMS_MAX_LOGPROBS */
    float *lps;     /* (n - 1) position p's at index p - 1 */
    int *top_ids;   /* (n - 1, k) most likely first */
    float *top_lps; /* (n - 1, k) */
} sampler_prompt_lp_t;

bt_status_t sampler_prompt_lp_create(int n, int k,
                                     sampler_prompt_lp_t **plp_p);
void sampler_prompt_lp_destroy(sampler_prompt_lp_t **plp_p);

/* Scores n_rows logits rows (vocab floats each): row r holds the logits
 * after prompt position pos0 + r (tokens: the prompt).  Rows past the
 * prompt's last position are ignored. */
void sampler_prompt_lp_rows(sampler_prompt_lp_t *plp, const float *logits,
                            int vocab, const int *tokens, int pos0,
                            int n_rows);

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

/* Structured output (worker/grammar/): from now on only tokens whose bit
 * is set in `allowed` can be drawn (bit t of word t / 64; (vocab_size +
 * 63) / 64 words); the others' logits become -inf after the penalties.
 * Borrowed: the caller keeps it alive and rewrites it between steps (the
 * engine writes each step's grammar mask there); NULL allows all.  While
 * set, the sampler asks for the whole row on the host (sampler_need is
 * SAMPLER_NEED_ROW, sampler_is_argmax and sampler_is_dist are false), so
 * a GPU backend copies the row back and the mask applies there. */
void sampler_set_mask(sampler_t *sampler, const uint64_t *allowed);

/* ---- sampling from a device's top candidates (backend_forward_sample) ----
 * A backend that samples on a GPU asks what the host needs for the next
 * row, computes it there, and copies back only that. */
typedef enum {
    SAMPLER_NEED_ARGMAX = 0, /* greedy, no penalties: the row's argmax */
    SAMPLER_NEED_TOP,        /* top candidates + normalizer usually do
                              * (sampler_sample_top); else the full row */
    SAMPLER_NEED_ROW         /* the full row: penalties, or truncation that
                              * the candidates cannot reproduce (plain
                              * temperature, top-k without top-p) */
} sampler_need_t;

/* Logprobs need the whole row on the host as the grammar mask does: a
 * vocab-sized device-to-host copy per step (about 0.5 MB for a 128K
 * vocabulary), the price of exact numbers. */
sampler_need_t sampler_need(const sampler_t *sampler);

float sampler_temperature(const sampler_t *sampler);

/* Samples exactly as sampler_sample would on the whole row, from the
 * row's k largest logits only, when that gives the same result; returns
 * false (random stream untouched) when the whole row is needed.
 * ids/logits: the k largest logits of the row and their ids, ordered by
 * logit descending then id ascending (k = min(K, vocab)); sum: over the
 * whole row, sum of expf((logit - logits[0]) / temperature) (in double;
 * sampler_sample adds the same terms in id order, so a device's sum may
 * differ in the last bits: probabilities then agree within float
 * rounding).  Exact cases: top-p (the nucleus lies among the
 * candidates), min-p (the k-th candidate is below the cut), top-k 1.
 * On success one uniform is drawn, as in sampler_sample. */
bool sampler_sample_top(sampler_t *sampler, const int *ids,
                        const float *logits, int k, double sum, int *token);

/* ---- sampling on a device from the whole row (cuda_sample_dist) ----
 * For rows that the candidates above cannot do (a nucleus beyond them,
 * plain temperature): the device draws from the whole distribution with
 * the sampler's own uniform, and the host advances the stream.  The
 * token is the exact inverse CDF at that uniform, where sampler_sample
 * walks a float running sum: the two agree except when the uniform lies
 * within float rounding of a cumulative boundary (the contract in
 * worker/cuda/cuda_sample.h). */

/* The sampler's parameters (read-only). */
const sampler_params_t *sampler_params(const sampler_t *sampler);

/* The value the next sampler_uniform() returns, without drawing it. */
float sampler_uniform_peek(const sampler_t *sampler);

/* True when the sampler's steps can be done on the device from the whole
 * row: temperature > 0, no penalties, and not top-k > 1 without top-p
 * (whose draw order is the host quickselect's). */
bool sampler_is_dist(const sampler_t *sampler);

/* A backend's memo of where this request's last row was sampled: wide =
 * its nucleus lay beyond the device's top candidates.  A request's rows
 * change slowly from step to step, so a backend sends a wide request's
 * next row straight to the whole distribution instead of paying for the
 * candidates, a miss and a second round trip (cuda_sample.c).  Only a
 * route: the token is the same distribution's either way.  false at
 * creation. */
void sampler_set_wide(sampler_t *sampler, bool wide);
bool sampler_wide(const sampler_t *sampler);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SAMPLER_H */
