/*
 * params.h - the one contract for a request's sampling and stop
 * parameters: one struct, one table of bounds, one validator.
 *
 * Every place a request enters baton checks it here: baton-http (its JSON
 * body), the router (a GenerateRequest), both workers (the task the router
 * sends) and `baton run` / `baton generate` (options).  A value is then
 * accepted or refused everywhere, with the same message, quoted from the
 * bounds table (issue 41: a repetition penalty of 20 used to pass
 * baton-http and the router and be refused by the prefill worker).
 *
 * This module sits below the engine: it needs common/ (and proto/ for the
 * conversions in params_proto.h), never the model, tokenizer or backends,
 * so the router and baton-http link it without the engine.
 */
#ifndef BT_PARAMS_PARAMS_H
#define BT_PARAMS_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PARAMS_MAX_STOP_IDS 64      /* a request's stop ids (the model's EOS
                                     * ids are added to them: keep room) */
#define PARAMS_MAX_STOP_STRINGS 16  /* a request's stop strings */
#define PARAMS_MAX_STOP_LEN 256     /* bytes of one stop string */
#define PARAMS_MAX_TOKENS (1 << 30) /* max_tokens; 0 = until the context */
#define PARAMS_MAX_LOGPROBS 20      /* top alternatives per token (OpenAI's
                                     * and vLLM's limit) */

/* What the sampler reads: the SamplingParams message of proto/client.proto
 * field for field (params_proto.h converts).  worker/sampler.h's
 * sampler_params_t is this type. */
typedef struct {
    float temperature;        /* 0 = greedy (argmax) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off, (0, 1] */
    float min_p;              /* 0 = off, [0, 1] */
    float repetition_penalty; /* 1 = off, (0, 10] (HF/CTRL semantics) */
    float presence_penalty;   /* 0 = off, [-2, 2] (OpenAI semantics) */
    float frequency_penalty;  /* 0 = off, [-2, 2] */
    uint64_t seed;            /* random stream; same seed, same output */
    bool skip_special_tokens; /* special tokens (BOS, EOS, control
                               * tokens) print as nothing (default) */
    /* Log-probabilities (issue 39): those of the raw model distribution,
     * log_softmax(logits) before penalties, temperature, truncation and
     * grammar masks (vLLM's default "raw_logprobs"), so they do not
     * depend on how the token was drawn. */
    bool logprobs;            /* each generated token's logprob */
    int top_logprobs;         /* and its top alternatives, 0..20 */
    bool prompt_logprobs;     /* each prompt token's logprob (echo) */
    int prompt_top_logprobs;  /* and its top alternatives, 0..20 */
} params_sampling_t;

/* A stop string: bytes, not NUL-terminated, not owned. */
typedef struct {
    const char *data;
    size_t len;
} params_str_t;

/* The whole contract of one request: sampling, stopping, output. */
typedef struct {
    params_sampling_t sampling;
    int max_tokens;           /* 0 = until the context is full */
    int stop_ids[PARAMS_MAX_STOP_IDS]; /* (n_stop_ids) besides the model's
                               * EOS ids */
    int n_stop_ids;
    params_str_t stop_strings[PARAMS_MAX_STOP_STRINGS]; /* (n_stop_strings)
                               * borrowed */
    int n_stop_strings;
    bool ignore_eos;          /* the model's EOS ids do not stop */
    bool echo;                /* the response starts with the prompt
                               * (completions; a front end's job: the
                               * router and workers never see it) */
} params_t;

/* Defaults: greedy, no truncation, no penalties, seed 0, special tokens
 * skipped; no stop conditions, max_tokens 0. */
void params_sampling_init(params_sampling_t *s);
void params_init(params_t *p);

/* ---- the bounds table ----
 * One row per numeric parameter: the single source of every limit and of
 * the messages that quote it (tests/params/ checks each row's edges). */
typedef struct {
    const char *name;   /* the parameter's name everywhere (JSON, CLI
                         * option without "--" and with '-', proto) */
    double min;         /* lower bound */
    double max;         /* upper bound */
    bool min_open;      /* min itself is refused: (min, max] */
    double def;         /* the default */
    const char *off;    /* what the default means ("off", "greedy") */
} params_bound_t;

/* The table (n_p: its rows). */
const params_bound_t *params_bounds(int *n_p);

/* The row named `name`, NULL when none. */
const params_bound_t *params_bound(const char *name);

/* ---- the validator ----
 * Checks every field against the table and the stop lists against their
 * sizes.  BT_ERR_INVALID_ARG with `err` (err_len bytes, may be NULL) set to
 * a message naming the parameter and its bounds, e.g. "repetition_penalty
 * is 20, must be in (0, 10]", and *param_p (may be NULL) to the name.
 * Logs nothing: callers decide whether a refusal is an error to log. */
bt_status_t params_sampling_validate(const params_sampling_t *s, char *err,
                                     size_t err_len, const char **param_p);
bt_status_t params_validate(const params_t *p, char *err, size_t err_len,
                            const char **param_p);

/* Checks one value of a table row (`name` must be a row); the message is
 * the validator's.  For front ends that read a value before the struct. */
bt_status_t params_check(const char *name, double value, char *err,
                         size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* BT_PARAMS_PARAMS_H */
