/*
 * decode_local.c - aggregated mode (--role both): a PrefillTask for one
 * of this worker's reservations is admitted here; step() computes it in
 * chunks and decode__local_prefill_done replies with the first token.
 */
#include "decode_int.h"

#include <stdio.h>
#include <string.h>

/* Queues a PrefillDone in the outbox, as baton-prefill does. */
static void send_prefill_done(decode_t *dec, Baton__PrefillDone *done)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;

    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE;
    msg.prefill_done = done;
    decode__send_msg(dec, &msg);
}

void decode__send_prefill_failure(decode_t *dec, uint64_t id, uint64_t epoch,
                                  Baton__ErrorCode code, const char *text)
{
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;

    workerproc_prefill_failure_init(&done, id, epoch, code, text);
    send_prefill_done(dec, &done);
}

/* PrefillTask for one of our own reservations (the router chose this
 * worker for both roles).  Admits the prompt through the intake it shares
 * with baton-prefill (workerproc_intake.h), then queues it for step(). */
void decode__on_prefill_task(decode_t *dec, const Baton__PrefillTask *m)
{
    const Baton__KvGrant *g = m->grant;
    decode_resv_t *r = decode__resv_find(dec, m->request_id);
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INVALID;
    char err[256];
    workerproc_intake_t in = {
        .engine = dec->engine, .vocab = dec->vocab,
        .max_context = dec->max_context,
    };
    workerproc_prompt_t p;
    const Baton__SamplingParams *sp = m->sampling;

    if (!dec->cfg.can_prefill) {
        decode__send_prefill_failure(dec, m->request_id,
                                     g != NULL ? g->epoch : 0,
                                     BATON__ERROR_CODE__ERROR_WORKER,
                                     "this decode worker does not prefill");
        return;
    }
    if (r == NULL || g == NULL || g->epoch != r->epoch || r->local ||
        r->local_done ||
        !decode__capability_ok(r, &g->capability, g->has_capability)) {
        if (r != NULL && g != NULL && g->epoch == r->epoch &&
            !decode__capability_ok(r, &g->capability, g->has_capability))
            decode__cap_rejected(dec);
        decode__send_prefill_failure(
            dec, m->request_id, g != NULL ? g->epoch : 0,
            BATON__ERROR_CODE__ERROR_WORKER,
            "no matching KV reservation for local prefill");
        return;
    }
    in.reserved_tokens = r->n_blocks * dec->block_size;
    if (workerproc_intake_prompt(&in, m, &p, &code, err, sizeof(err)) !=
        BT_OK) {
        decode__send_prefill_failure(dec, m->request_id, g->epoch, code, err);
        return;
    }
    params_sampling_from_proto(sp, &r->sp);
    if (dec->engine != NULL && sampler_params_validate(&r->sp) != BT_OK) {
        snprintf(err, sizeof(err), "%s", bt_error_last());
        goto fail;
    }
    if (dec->engine != NULL && r->sp.prompt_logprobs) {
        code = BATON__ERROR_CODE__ERROR_INVALID;
        snprintf(err, sizeof(err), "prompt logprobs are not supported with "
                 "speculative decoding");
        if (dec->spec != NULL)
            goto fail;
        sampler_prompt_lp_destroy(&r->plp);
        if (sampler_prompt_lp_create(p.n_tokens, r->sp.prompt_top_logprobs,
                                     &r->plp) != BT_OK) {
            code = BATON__ERROR_CODE__ERROR_WORKER;
            snprintf(err, sizeof(err), "out of memory");
            goto fail;
        }
    }
    r->local = true;
    r->p = p;
    r->n_fed = 0;
    if (dec->prefix != NULL) {
        /* The prompt's leading full blocks cached already (same salt)
         * replace the reserved ones: only the rest is computed.  Not
         * with prompt logprobs: every position's logits are computed
         * then (its blocks are still cached for later requests). */
        bt_blockhash_t root = workerproc_prefix_root(
            dec->prefix, m->has_cache_salt, &m->cache_salt);
        kv_prefix_cursor_init(&r->pcur, root);
        if (r->plp == NULL)
            r->n_hit = workerproc_prefix_adopt(dec->prefix, root, p.tokens,
                                               p.n_tokens, r->blocks,
                                               r->n_blocks);
        r->n_fed = r->n_hit;
        if (r->n_hit > 0)
            BT_LOG_DEBUG("KV", "request %llu: %d of %d prompt tokens "
                         "cached", (unsigned long long)r->id, r->n_hit,
                         p.n_tokens);
    }
    r->t_start = bt_time_ns();
    /* Our own compute, not a remote writer: no arrival timeout. */
    r->expires_ns = UINT64_MAX;
    if (dec->engine == NULL) /* null model: instant */
        decode__local_prefill_done(dec, r, -1, NULL);
    return;

fail:
    workerproc_prompt_cleanup(&p);
    decode__send_prefill_failure(dec, m->request_id, g->epoch, code, err);
}

bool decode__has_local_prefill(const decode_t *dec)
{
    if (!dec->cfg.can_prefill)
        return false;
    DECODE_RESV_FOREACH(dec, i)
        if (dec->resv[i].local)
            return true;
    return false;
}

/* The sampler of a local prompt's first token: it continues the
 * request's random stream, as baton-prefill does.  NULL (failure sent)
 * when the parameters are refused. */
sampler_t *decode__local_prefill_sampler(decode_t *dec, decode_resv_t *r)
{
    sampler_t *sampler = NULL;

    if (workerproc_intake_sampler(&r->sp, dec->vocab, &r->p, &sampler) !=
        BT_OK) {
        decode__send_prefill_failure(dec, r->id, r->epoch,
                                     BATON__ERROR_CODE__ERROR_INVALID,
                                     bt_error_last());
        r->local = false;
        return NULL;
    }
    return sampler;
}

/* A local prompt is computed and its first token sampled (by
 * decode__local_prefill_sampler's sampler; the null model picks it here):
 * reply. */
void decode__local_prefill_done(decode_t *dec, decode_resv_t *r, int first,
                                const sampler_logprobs_t *lp)
{
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;
    char text[256];
    size_t text_len = 0;

    if (dec->engine == NULL) {
        first = proto_null_next_token(r->p.tokens[r->p.n_tokens - 1],
                                      r->p.n_tokens);
        r->n_fed = r->p.n_tokens;
    } else {
        text_len = workerproc_intake_first_text(dec->engine, &r->p, first,
                                                r->sp.skip_special_tokens,
                                                text, sizeof(text));
    }
    r->local = false;
    r->local_done = true;
    /* The reservation's clock starts again: it waited for this worker's
     * own prefill queue, not for a remote writer. */
    r->expires_ns = bt_time_ns() +
                    (uint64_t)dec->cfg.kv_timeout_ms * 1000000ull;
    workerproc_prefill_done_logprobs(&done, lp);
    workerproc_prefill_done_prompt_logprobs(&done, r->plp);
    workerproc_prefill_done_init(&done, r->id, &r->p, first, text, text_len,
                                 r->epoch, r->cap, sizeof(r->cap),
                                 (bt_time_ns() - r->t_start) / 1000, 0);
    send_prefill_done(dec, &done);
}
