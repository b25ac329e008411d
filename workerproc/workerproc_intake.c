/*
 * workerproc_intake.c - the prefill intake both prefill roles share (see
 * workerproc_intake.h).
 */
#include "workerproc_intake.h"

#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "model/tokenizer.h"
#include "workerproc.h"

/* Byte-level stand-in tokenizer of the null model. */
static bt_status_t null_encode(const uint8_t *text, size_t len, bool bos,
                               int **ids_p, int *n_p)
{
    int *ids = bt_malloc((len + 1) * sizeof(int), "prefill_tokens");
    int n = 0;

    if (ids == NULL)
        return BT_ERR_NO_MEMORY;
    if (bos)
        ids[n++] = 1;
    for (size_t i = 0; i < len; i++)
        ids[n++] = 3 + text[i];
    *ids_p = ids;
    *n_p = n;
    return BT_OK;
}

/* Compiles `spec` for the engine's vocabulary into p and replays the
 * tokens generated before a failover (the tail of p->tokens). */
static bt_status_t intake_grammar(const workerproc_intake_t *in,
                                  const char *spec, workerproc_prompt_t *p,
                                  char *err, size_t err_len)
{
    const grammar_vocab_t *vocab = NULL;

    if (in->engine == NULL) {
        snprintf(err, err_len, "structured output needs a model (this "
                 "worker runs the null model)");
        return BT_ERR_INVALID_ARG;
    }
    if (engine_grammar_vocab(in->engine, &vocab) != BT_OK ||
        grammar_create_spec(spec, vocab, &p->grammar) != BT_OK ||
        grammar_replay(p->grammar, p->tokens + p->n_tokens - p->n_resumed,
                       p->n_resumed, &p->gstate) != BT_OK) {
        snprintf(err, err_len, "structured output: %s", bt_error_last());
        return BT_ERR_INVALID_ARG;
    }
    p->gmask = bt_malloc(sizeof(uint64_t) * grammar_mask_words(vocab),
                         "prefill_grammar");
    if (p->gmask == NULL) {
        snprintf(err, err_len, "out of memory");
        return BT_ERR_NO_MEMORY;
    }
    return BT_OK;
}

bt_status_t workerproc_intake_prompt(const workerproc_intake_t *in,
                                     const Baton__PrefillTask *m,
                                     workerproc_prompt_t *p,
                                     Baton__ErrorCode *code_p, char *err,
                                     size_t err_len)
{
    bt_status_t status = BT_OK;

    memset(p, 0, sizeof(*p));
    *code_p = BATON__ERROR_CODE__ERROR_INVALID;
    if (m->n_prompt_ids > 0) {
        p->tokens = bt_malloc(m->n_prompt_ids * sizeof(int),
                              "prefill_tokens");
        if (p->tokens != NULL)
            memcpy(p->tokens, m->prompt_ids, m->n_prompt_ids * sizeof(int));
        p->n_tokens = (int)m->n_prompt_ids;
        status = p->tokens ? BT_OK : BT_ERR_NO_MEMORY;
    } else if (m->has_prompt_text && m->prompt_text.len > 0) {
        if (in->engine == NULL) {
            status = null_encode(m->prompt_text.data, m->prompt_text.len,
                                 m->add_bos, &p->tokens, &p->n_tokens);
        } else if (engine_tokenizer(in->engine) == NULL) {
            snprintf(err, err_len, "worker has no tokenizer: send prompt "
                     "ids");
            goto fail;
        } else {
            status = tok_encode(engine_tokenizer(in->engine),
                                (const char *)m->prompt_text.data,
                                m->prompt_text.len, m->add_bos, &p->tokens,
                                &p->n_tokens);
        }
    } else {
        snprintf(err, err_len, "empty prompt");
        goto fail;
    }
    if (status == BT_ERR_NO_MEMORY) {
        *code_p = BATON__ERROR_CODE__ERROR_INTERNAL;
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    if (status != BT_OK) {
        snprintf(err, err_len, "cannot tokenize the prompt: %s",
                 bt_error_last());
        goto fail;
    }
    for (int i = 0; i < p->n_tokens; i++) {
        if (p->tokens[i] < 0 || p->tokens[i] >= in->vocab) {
            snprintf(err, err_len, "prompt id %d at %d is outside the "
                     "vocabulary (%d)", p->tokens[i], i, in->vocab);
            goto fail;
        }
    }
    if (p->n_tokens < 1 || p->n_tokens >= in->max_context) {
        *code_p = BATON__ERROR_CODE__ERROR_TOO_LONG;
        snprintf(err, err_len, "prompt of %d tokens does not fit the "
                 "context (%d)", p->n_tokens, in->max_context);
        goto fail;
    }
    if (in->reserved_tokens > 0 && p->n_tokens > in->reserved_tokens) {
        *code_p = BATON__ERROR_CODE__ERROR_TOO_LONG;
        snprintf(err, err_len, "prompt of %d tokens exceeds its KV "
                 "reservation", p->n_tokens);
        goto fail;
    }
    p->n_resumed = m->has_n_generated ? (int)m->n_generated : 0;
    if (p->n_resumed < 0 || p->n_resumed >= p->n_tokens) {
        snprintf(err, err_len, "%d resumed tokens of a %d-token prompt",
                 p->n_resumed, p->n_tokens);
        goto fail;
    }
    if (m->grammar != NULL && m->grammar[0] != '\0' &&
        intake_grammar(in, m->grammar, p, err, err_len) != BT_OK)
        goto fail;
    return BT_OK;

fail:
    workerproc_prompt_cleanup(p);
    return BT_ERR_INVALID_ARG;
}

void workerproc_prompt_cleanup(workerproc_prompt_t *p)
{
    bt_free(p->tokens);
    p->tokens = NULL;
    p->n_tokens = 0;
    grammar_destroy(&p->grammar);
    bt_free(p->gmask);
    p->gmask = NULL;
}

bt_status_t workerproc_intake_sampler(const sampler_params_t *sp, int vocab,
                                      const workerproc_prompt_t *p,
                                      sampler_t **sampler_p)
{
    sampler_t *sampler = NULL;
    bt_status_t status = sampler_create(sp, vocab, &sampler);

    if (status != BT_OK)
        return status;
    if (p->grammar != NULL) {
        status = grammar_mask(p->grammar, p->gstate, p->gmask);
        if (status != BT_OK) {
            sampler_destroy(&sampler);
            return status;
        }
        sampler_set_mask(sampler, p->gmask);
    }
    for (int i = 0; i < p->n_tokens; i++)
        sampler_observe(sampler, p->tokens[i]);
    /* Tokens generated before a failover drew from the same stream. */
    sampler_skip(sampler, p->n_resumed);
    *sampler_p = sampler;
    return BT_OK;
}

size_t workerproc_intake_first_text(engine_t *engine,
                                    const workerproc_prompt_t *p, int first,
                                    bool skip_special, char *buf,
                                    size_t len)
{
    const tok_t *tok = engine != NULL ? engine_tokenizer(engine) : NULL;
    tok_stream_t *stream = NULL;
    size_t n = 0;

    if (tok == NULL || p->n_tokens < 1 ||
        tok_stream_create(tok, p->tokens[p->n_tokens - 1], &stream) != BT_OK)
        return 0;
    tok_stream_set_skip_special(stream, skip_special);
    if (tok_stream_push(stream, first, buf, len, &n) != BT_OK)
        n = 0;
    tok_stream_destroy(&stream);
    return n;
}

void workerproc_prefill_done_logprobs(Baton__PrefillDone *done,
                                      const sampler_logprobs_t *lp)
{
    if (lp == NULL)
        return;
    done->has_first_logprob = 1;
    done->first_logprob = lp->logprob;
    done->n_first_top_ids = (size_t)lp->n_top;
    done->first_top_ids = (int32_t *)lp->top_ids;
    done->n_first_top_logprobs = (size_t)lp->n_top;
    done->first_top_logprobs = (float *)lp->top_logprobs;
}

void workerproc_prefill_done_prompt_logprobs(Baton__PrefillDone *done,
                                             const sampler_prompt_lp_t *plp)
{
    size_t n;

    if (plp == NULL)
        return;
    n = (size_t)plp->n - 1;
    done->n_prompt_logprobs = n;
    done->prompt_logprobs = plp->lps;
    done->n_prompt_top_ids = n * (size_t)plp->k;
    done->prompt_top_ids = (int32_t *)plp->top_ids;
    done->n_prompt_top_logprobs = done->n_prompt_top_ids;
    done->prompt_top_logprobs = plp->top_lps;
}

void workerproc_prefill_done_init(Baton__PrefillDone *done, uint64_t id,
                                  const workerproc_prompt_t *p, int first,
                                  const char *text, size_t text_len,
                                  uint64_t epoch, const uint8_t *cap,
                                  size_t cap_len, uint64_t compute_us,
                                  uint64_t transfer_us)
{
    done->has_request_id = 1;
    done->request_id = id;
    done->has_ok = 1;
    done->ok = 1;
    done->n_prompt_ids = (size_t)p->n_tokens;
    done->prompt_ids = p->tokens;
    done->has_first_token = 1;
    done->first_token = first;
    if (text_len > 0) {
        done->has_first_text = 1;
        done->first_text.data = (uint8_t *)text;
        done->first_text.len = text_len;
    }
    done->has_epoch = 1;
    done->epoch = epoch;
    done->has_capability = cap_len > 0;
    done->capability.data = (uint8_t *)cap;
    done->capability.len = cap_len;
    done->has_compute_us = 1;
    done->compute_us = compute_us;
    done->has_transfer_us = 1;
    done->transfer_us = transfer_us;
}
