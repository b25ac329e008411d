/*
 * params_proto.c - params_t <-> protobuf (params_proto.h).
 */
#include "params_proto.h"

#include <stdio.h>

void params_sampling_from_proto(const Baton__SamplingParams *sp,
                                params_sampling_t *s)
{
    params_sampling_init(s);
    if (sp == NULL)
        return;
    s->temperature = sp->temperature;
    s->top_k = sp->top_k;
    s->top_p = sp->top_p;
    s->min_p = sp->min_p;
    s->repetition_penalty = sp->repetition_penalty;
    s->presence_penalty = sp->presence_penalty;
    s->frequency_penalty = sp->frequency_penalty;
    s->seed = sp->seed;
    s->skip_special_tokens = sp->skip_special_tokens;
    s->logprobs = sp->logprobs;
    s->top_logprobs = sp->top_logprobs;
    s->prompt_logprobs = sp->prompt_logprobs;
    s->prompt_top_logprobs = sp->prompt_top_logprobs;
}

void params_sampling_to_proto(const params_sampling_t *s,
                              Baton__SamplingParams *sp)
{
    baton__sampling_params__init(sp);
    sp->has_temperature = 1;
    sp->temperature = s->temperature;
    sp->has_top_k = 1;
    sp->top_k = s->top_k;
    sp->has_top_p = 1;
    sp->top_p = s->top_p;
    sp->has_min_p = 1;
    sp->min_p = s->min_p;
    sp->has_repetition_penalty = 1;
    sp->repetition_penalty = s->repetition_penalty;
    sp->has_presence_penalty = 1;
    sp->presence_penalty = s->presence_penalty;
    sp->has_frequency_penalty = 1;
    sp->frequency_penalty = s->frequency_penalty;
    sp->has_seed = 1;
    sp->seed = s->seed;
    sp->has_skip_special_tokens = 1;
    sp->skip_special_tokens = s->skip_special_tokens;
    /* absent when off: a message to an older peer stays what it was */
    if (s->logprobs) {
        sp->has_logprobs = 1;
        sp->logprobs = 1;
        sp->has_top_logprobs = 1;
        sp->top_logprobs = s->top_logprobs;
    }
    if (s->prompt_logprobs) {
        sp->has_prompt_logprobs = 1;
        sp->prompt_logprobs = 1;
        sp->has_prompt_top_logprobs = 1;
        sp->prompt_top_logprobs = s->prompt_top_logprobs;
    }
}

bt_status_t params_from_generate(const Baton__GenerateRequest *g,
                                 params_t *p, char *err, size_t err_len,
                                 const char **param_p)
{
    params_init(p);
    params_sampling_from_proto(g->sampling, &p->sampling);
    p->max_tokens = g->max_tokens;
    p->ignore_eos = g->ignore_eos;
    if (g->n_stop_ids > PARAMS_MAX_STOP_IDS) {
        p->n_stop_ids = PARAMS_MAX_STOP_IDS + 1; /* the validator says */
    } else {
        for (size_t i = 0; i < g->n_stop_ids; i++)
            p->stop_ids[i] = g->stop_ids[i];
        p->n_stop_ids = (int)g->n_stop_ids;
    }
    if (g->n_stop_strings > PARAMS_MAX_STOP_STRINGS) {
        p->n_stop_strings = PARAMS_MAX_STOP_STRINGS + 1;
    } else {
        for (size_t i = 0; i < g->n_stop_strings; i++) {
            p->stop_strings[i].data = (const char *)g->stop_strings[i].data;
            p->stop_strings[i].len = g->stop_strings[i].len;
        }
        p->n_stop_strings = (int)g->n_stop_strings;
    }
    return params_validate(p, err, err_len, param_p);
}
