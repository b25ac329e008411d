/*
 * params.c - the bounds table and the validator of the parameter
 * contract (params.h).
 */
#include "params.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bt_util.h"

/* The table.  Bounds are those the sampler is exact and fast within:
 * temperature as OpenAI's API (above 2 the output is noise), top_p and
 * min_p as probabilities, repetition_penalty as vLLM's practical range
 * (the penalty divides logits: above 10 a seen token is never picked
 * again), presence/frequency as OpenAI's. */
static const params_bound_t params_table[] = {
    {"temperature", 0, 2, false, 0, "greedy"},
    {"top_k", 0, PARAMS_MAX_TOKENS, false, 0, "off"},
    {"top_p", 0, 1, true, 1, "off"},
    {"min_p", 0, 1, false, 0, "off"},
    {"repetition_penalty", 0, 10, true, 1, "off"},
    {"presence_penalty", -2, 2, false, 0, "off"},
    {"frequency_penalty", -2, 2, false, 0, "off"},
    {"max_tokens", 0, PARAMS_MAX_TOKENS, false, 0,
     "until the context is full"},
    /* alternatives per generated token (chat's top_logprobs; legacy
     * completions' integer `logprobs` and `baton run --logprobs N` are
     * this row under their own name) */
    {"top_logprobs", 0, PARAMS_MAX_LOGPROBS, false, 0, "none"},
    /* vLLM's prompt_logprobs; echo + logprobs N asks for it too */
    {"prompt_logprobs", 0, PARAMS_MAX_LOGPROBS, false, 0, "off"},
};

const params_bound_t *params_bounds(int *n_p)
{
    *n_p = (int)BT_ARRAY_SIZE(params_table);
    return params_table;
}

const params_bound_t *params_bound(const char *name)
{
    for (size_t i = 0; i < BT_ARRAY_SIZE(params_table); i++)
        if (strcmp(params_table[i].name, name) == 0)
            return &params_table[i];
    return NULL;
}

void params_sampling_init(params_sampling_t *s)
{
    memset(s, 0, sizeof(*s));
    s->temperature = (float)params_bound("temperature")->def;
    s->top_k = (int)params_bound("top_k")->def;
    s->top_p = (float)params_bound("top_p")->def;
    s->min_p = (float)params_bound("min_p")->def;
    s->repetition_penalty = (float)params_bound("repetition_penalty")->def;
    s->presence_penalty = (float)params_bound("presence_penalty")->def;
    s->frequency_penalty = (float)params_bound("frequency_penalty")->def;
    s->seed = 0;
    s->skip_special_tokens = true;
}

void params_init(params_t *p)
{
    memset(p, 0, sizeof(*p));
    params_sampling_init(&p->sampling);
    p->max_tokens = (int)params_bound("max_tokens")->def;
}

/* Sets the message and the parameter name of a refusal. */
static bt_status_t params_refuse(const char *param, char *err,
                                 size_t err_len, const char **param_p,
                                 const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bt_status_t params_refuse(const char *param, char *err,
                                 size_t err_len, const char **param_p,
                                 const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && err_len > 0) {
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    if (param_p != NULL)
        *param_p = param;
    return BT_ERR_INVALID_ARG;
}

/* Whether v lies within row b (NaN never does). */
static bool params_in(const params_bound_t *b, double v)
{
    if (!isfinite(v) || v > b->max)
        return false;
    return b->min_open ? v > b->min : v >= b->min;
}

/* Checks v against row b; the message is the one every front end shows. */
static bt_status_t params_check_row(const params_bound_t *b, double v,
                                    char *err, size_t err_len,
                                    const char **param_p)
{
    if (params_in(b, v))
        return BT_OK;
    return params_refuse(b->name, err, err_len, param_p,
                         "%s is %g, must be in %c%.10g, %.10g]", b->name,
                         v, b->min_open ? '(' : '[', b->min, b->max);
}

bt_status_t params_check(const char *name, double value, char *err,
                         size_t err_len)
{
    const params_bound_t *b = params_bound(name);

    if (b == NULL)
        return params_refuse(name, err, err_len, NULL,
                             "%s is not a parameter", name);
    return params_check_row(b, value, err, err_len, NULL);
}

bt_status_t params_sampling_validate(const params_sampling_t *s, char *err,
                                     size_t err_len, const char **param_p)
{
    const struct {
        const char *name;
        double v;
    } v[] = {
        {"temperature", s->temperature},
        {"top_k", s->top_k},
        {"top_p", s->top_p},
        {"min_p", s->min_p},
        {"repetition_penalty", s->repetition_penalty},
        {"presence_penalty", s->presence_penalty},
        {"frequency_penalty", s->frequency_penalty},
        {"top_logprobs", s->top_logprobs},
        {"prompt_logprobs", s->prompt_top_logprobs},
    };

    for (size_t i = 0; i < BT_ARRAY_SIZE(v); i++) {
        bt_status_t status = params_check_row(params_bound(v[i].name),
                                              v[i].v, err, err_len, param_p);
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

bt_status_t params_validate(const params_t *p, char *err, size_t err_len,
                            const char **param_p)
{
    bt_status_t status;

    status = params_sampling_validate(&p->sampling, err, err_len, param_p);
    if (status != BT_OK)
        return status;
    status = params_check_row(params_bound("max_tokens"), p->max_tokens, err,
                              err_len, param_p);
    if (status != BT_OK)
        return status;
    if (p->n_stop_ids < 0 || p->n_stop_ids > PARAMS_MAX_STOP_IDS)
        return params_refuse("stop_token_ids", err, err_len, param_p,
                             "stop_token_ids: at most %d ids",
                             PARAMS_MAX_STOP_IDS);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0)
            return params_refuse("stop_token_ids", err, err_len, param_p,
                                 "stop_token_ids: id %d is negative",
                                 p->stop_ids[i]);
    if (p->n_stop_strings < 0 || p->n_stop_strings > PARAMS_MAX_STOP_STRINGS)
        return params_refuse("stop", err, err_len, param_p,
                             "stop: at most %d stop strings",
                             PARAMS_MAX_STOP_STRINGS);
    for (int i = 0; i < p->n_stop_strings; i++) {
        size_t len = p->stop_strings[i].len;
        if (len == 0 || len > PARAMS_MAX_STOP_LEN ||
            p->stop_strings[i].data == NULL)
            return params_refuse("stop", err, err_len, param_p,
                                 "stop: stop strings must have 1 to %d "
                                 "bytes", PARAMS_MAX_STOP_LEN);
    }
    return BT_OK;
}
