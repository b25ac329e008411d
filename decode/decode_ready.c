/*
 * decode_ready.c - KvReady: the hand-off is checked (epoch,
 * capability, tokens, held blocks, the link's arrival) and the request
 * becomes a running sequence in the reservation's blocks.
 */
#include "decode_int.h"

#include <stdio.h>
#include <string.h>

/* Structured output: compiles KvReady's grammar for the engine's
 * vocabulary (or takes over the one this worker's own prefill of the
 * request compiled, with its warm mask cache) and replays the tokens
 * generated so far (after the original prompt: by the prefill worker, or
 * by a decode worker that failed), so the state moves with the request. */
static bt_status_t seq_set_grammar(decode_t *dec, decode_seq_t *s,
                                   decode_resv_t *r, const Baton__KvReady *m,
                                   const char **why)
{
    static char err[256];
    const grammar_vocab_t *vocab = NULL;
    int start = m->has_n_prompt ? (int)m->n_prompt : s->n_tokens;

    if (dec->spec != NULL) {
        /* drafts would be checked against one position's mask only */
        *why = "structured output is not served by a decode worker with "
               "--spec-head (speculative decoding)";
        return BT_ERR_UNSUPPORTED;
    }
    if (r->local_done && r->p.grammar != NULL) {
        /* the same spec: the router sent it in both messages */
        s->grammar = r->p.grammar;
        s->gmask = r->p.gmask;
        r->p.grammar = NULL;
        r->p.gmask = NULL;
    }
    if (start < 1 || start > s->n_tokens ||
        engine_grammar_vocab(dec->engine, &vocab) != BT_OK ||
        (s->grammar == NULL &&
         grammar_create_spec(m->grammar, vocab, &s->grammar) != BT_OK) ||
        grammar_replay(s->grammar, s->tokens + start, s->n_tokens - start,
                       &s->gstate) != BT_OK) {
        snprintf(err, sizeof(err), "structured output: %s",
                 start < 1 || start > s->n_tokens ? "bad prompt length"
                                                  : bt_error_last());
        *why = err;
        return BT_ERR_INVALID_ARG;
    }
    if (s->gmask == NULL)
        s->gmask = bt_malloc(sizeof(uint64_t) * grammar_mask_words(vocab),
                             "decode_grammar");
    if (s->gmask == NULL) {
        *why = "out of memory";
        return BT_ERR_NO_MEMORY;
    }
    sampler_set_mask(s->sampler, s->gmask);
    return BT_OK;
}

/* Writes the inline KV of tokens [0, n) into the reservation's blocks.
 * Every size is checked against the layout (the bytes came from the
 * network). */
/* Inline KV: KvReady's parts into the reservation's blocks. */
static bt_status_t unpack_inline(decode_t *dec, const Baton__KvReady *m,
                                 const int *blocks, int n_blocks, int n)
{
    const uint8_t *parts[2 * 512];
    size_t lens[2 * 512];

    if (dec->links == NULL || m->n_kv_inline > BT_ARRAY_SIZE(parts))
        return BT_ERR_FORMAT;
    for (size_t i = 0; i < m->n_kv_inline; i++) {
        parts[i] = m->kv_inline[i].data;
        lens[i] = m->kv_inline[i].len;
    }
    return kv_link_receiver_unpack(dec->links, parts, lens,
                                   (int)m->n_kv_inline, blocks, n_blocks, n);
}

/* KvReady: the request joins the running batch once its KV is in the
 * reservation's blocks.  Returns true when it kept `msg` (staged KV whose
 * last copies still run: r->pending, retried by decode__arrivals_pending), else
 * the caller frees it. */
bool decode__on_ready(decode_t *dec, Baton__ControlMessage *msg)
{
    const Baton__KvReady *m = msg->kv_ready;
    decode_resv_t *r = decode__resv_find(dec, m->request_id);
    decode_seq_t *s = NULL;
    stop_config_t scfg;
    int n = (int)m->n_tokens, keep;
    const char *why = "out of memory";
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INTERNAL;
    bool arrived = false;

    if (r == NULL || r->epoch != m->epoch) {
        decode__send_task_error(dec, m->request_id, m->epoch,
                                BATON__ERROR_CODE__ERROR_WORKER,
                                "KV reservation expired or stale epoch");
        return false;
    }
    if (!decode__capability_ok(r, &m->capability, m->has_capability)) {
        /* Nothing of it is committed.  The router fails the request on
         * the TaskError below, so the reservation goes now (its blocks
         * quarantined when a remote writer may still hold them) instead
         * of at the KV timeout. */
        decode__cap_rejected(dec);
        if (r->pending == msg)
            r->pending = NULL; /* the caller frees msg */
        decode__resv_free(dec, r, false);
        BT_LOG_WARN("KV", "request %llu: KvReady with a wrong capability "
                    "dropped", (unsigned long long)m->request_id);
        decode__send_task_error(dec, m->request_id, m->epoch,
                                BATON__ERROR_CODE__ERROR_WORKER,
                                "KV capability does not match the reservation");
        return false;
    }
    for (decode_seq_t *o = dec->seqs; o; o = o->next) {
        if (o->id == m->request_id) {
            code = BATON__ERROR_CODE__ERROR_WORKER;
            why = "request already running here";
            goto fail;
        }
    }
    if (r->pending != NULL && r->pending != msg)
        proto_control_free(&r->pending); /* a duplicate: the newer wins */
    r->pending = NULL;
    if (n < 2 || n > dec->max_context + 1 || m->n_generated < 1 ||
        m->n_generated > (uint32_t)n) {
        code = BATON__ERROR_CODE__ERROR_INVALID;
        why = "bad token counts in KvReady";
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (m->tokens[i] < 0 || m->tokens[i] >= dec->vocab) {
            code = BATON__ERROR_CODE__ERROR_INVALID;
            why = "token outside the vocabulary";
            goto fail;
        }
    }
    /* Blocks held at the grant must hold this prompt's first tokens:
     * checked by their chain (the KvReady's salt), never assumed. */
    if (r->held > 0 && !r->local_done &&
        ((int64_t)r->held * dec->block_size >= n - 1 ||
         dec->prefix == NULL ||
         !bt_blockhash_eq(r->held_hash, decode__held_chain(
             dec, workerproc_prefix_root(dec->prefix, m->has_cache_salt,
                                         &m->cache_salt),
             m->tokens, r->held)))) {
        code = BATON__ERROR_CODE__ERROR_WORKER;
        why = "the prompt does not start with the KV blocks held for it";
        goto fail;
    }
    /* The KV of tokens [0, n-1) came from the prefill worker (but for
     * the blocks held here). */
    if (dec->engine != NULL) {
        if (r->local_done) {
            arrived = true; /* prefilled here, in place */
        } else if (r->local) {
            code = BATON__ERROR_CODE__ERROR_WORKER;
            why = "KvReady before the local prefill finished";
            goto fail;
        } else if (m->n_kv_inline > 0) {
            int skip = r->held * dec->block_size;
            if (unpack_inline(dec, m, r->blocks + r->held,
                              r->n_blocks - r->held, n - 1 - skip) != BT_OK) {
                code = BATON__ERROR_CODE__ERROR_MALFORMED;
                why = "inline KV does not match the pool layout";
                goto fail;
            }
            arrived = true;
        } else {
            /* the link the router chose: bounded wait where the data is
             * there already, "not yet" while its last copies run */
            bt_status_t st = dec->links == NULL ? BT_ERR_INVALID_ARG
                : kv_link_receiver_arrived(
                      dec->links, m->has_transport ? (int)m->transport : -1,
                      (int)(r - dec->resv), r->epoch, &why);
            if (st == BT_IN_PROGRESS) {
                uint64_t now = bt_time_ns();
                if (r->pending_since == 0)
                    r->pending_since = now;
                if (now - r->pending_since < DECODE_ARRIVAL_WAIT_NS) {
                    r->pending = msg;
                    return true;
                }
                why = "KV did not arrive in time";
            }
            if (st != BT_OK) {
                code = BATON__ERROR_CODE__ERROR_WORKER;
                if (dec->links == NULL)
                    why = "KV did not arrive";
                goto fail;
            }
            arrived = true;
        }
        if (!r->local_done) /* metrics hook */
            workerproc_metrics_kv_blocks(
                dec->cfg.metrics, false,
                (uint64_t)BT_MAX(BT_DIV_UP(n - 1, dec->block_size) - r->held,
                                 0),
                (uint64_t)r->held);
    }
    if (dec->engine == NULL && m->grammar != NULL && m->grammar[0] != '\0') {
        code = BATON__ERROR_CODE__ERROR_INVALID;
        why = "structured output needs a model (this worker runs the null "
              "model)";
        goto fail;
    }
    s = bt_calloc(1, sizeof(*s), "decode_seq");
    if (s == NULL)
        goto fail;
    s->id = m->request_id;
    s->epoch = r->epoch;
    s->cap = dec->max_context + 1;
    s->tokens = bt_malloc((size_t)s->cap * sizeof(int), "decode_seq");
    s->max_blocks = BT_DIV_UP(s->cap, dec->block_size);
    s->blocks = bt_malloc((size_t)s->max_blocks * sizeof(int), "decode_seq");
    if (s->tokens == NULL || s->blocks == NULL)
        goto fail;
    memcpy(s->tokens, m->tokens, (size_t)n * sizeof(int));
    s->n_tokens = n;
    s->n_cached = n - 1;
    s->n_generated = (int)m->n_generated;
    stop_config_init(&scfg);
    for (size_t i = 0; i < m->n_stop_ids && scfg.n_ids < STOP_MAX_IDS; i++)
        scfg.ids[scfg.n_ids++] = m->stop_ids[i];
    {
        /* Stop strings must be NUL-terminated copies (stop_create copies
         * them again). */
        char strs[STOP_MAX_STRINGS][STOP_MAX_STRING_LEN + 1];
        bt_status_t status;
        for (size_t i = 0; i < m->n_stop_strings &&
                           scfg.n_strings < STOP_MAX_STRINGS; i++) {
            size_t len = m->stop_strings[i].len;
            if (len == 0 || len > STOP_MAX_STRING_LEN)
                continue;
            memcpy(strs[scfg.n_strings], m->stop_strings[i].data, len);
            strs[scfg.n_strings][len] = '\0';
            scfg.strings[scfg.n_strings] = strs[scfg.n_strings];
            scfg.n_strings++;
        }
        scfg.max_tokens = (int)m->max_tokens - s->n_generated;
        if (scfg.max_tokens <= 0)
            scfg.max_tokens = 1;
        status = stop_create(&scfg, &s->stop);
        if (status != BT_OK) {
            code = BATON__ERROR_CODE__ERROR_INVALID;
            why = "bad stop conditions";
            goto fail;
        }
        /* The matcher continues the router's (first token) or a failed
         * worker's state: text still held back from a stop string. */
        if (m->has_stop_held && m->stop_held.len > 0 &&
            stop_prime(s->stop, (const char *)m->stop_held.data,
                       m->stop_held.len) != BT_OK) {
            code = BATON__ERROR_CODE__ERROR_INVALID;
            why = "held-back stop text too long";
            goto fail;
        }
    }
    if (dec->engine != NULL) {
        sampler_params_t sp;
        params_sampling_from_proto(m->sampling, &sp);
        if (dec->spec != NULL && sp.logprobs) {
            /* a verified draft has no per-token rows on the host */
            code = BATON__ERROR_CODE__ERROR_INVALID;
            why = "logprobs are not supported with speculative decoding";
            goto fail;
        }
        if (dec->spec != NULL) {
            /* The engine sequence observes every token in its sampler. */
            if (n > dec->max_context) {
                code = BATON__ERROR_CODE__ERROR_TOO_LONG;
                why = "sequence fills the context";
                goto fail;
            }
            if (engine_seq_create(dec->engine, s->tokens, n, &sp,
                                  &s->eseq) != BT_OK) {
                code = BATON__ERROR_CODE__ERROR_INVALID;
                why = "invalid sampling parameters";
                goto fail;
            }
            sampler_skip(engine_seq_sampler(s->eseq), s->n_generated);
        } else {
            if (sampler_create(&sp, dec->vocab, &s->sampler) != BT_OK) {
                code = BATON__ERROR_CODE__ERROR_INVALID;
                why = "invalid sampling parameters";
                goto fail;
            }
            for (int i = 0; i < n; i++)
                sampler_observe(s->sampler, s->tokens[i]);
            /* The first n_generated tokens were sampled elsewhere
             * (prefill, a failed decode worker): continue their random
             * stream. */
            sampler_skip(s->sampler, s->n_generated);
        }
        if (m->grammar != NULL && m->grammar[0] != '\0' &&
            seq_set_grammar(dec, s, r, m, &why) != BT_OK) {
            code = BATON__ERROR_CODE__ERROR_INVALID;
            goto fail;
        }
        if (m->want_text && engine_tokenizer(dec->engine) != NULL &&
            tok_stream_create(engine_tokenizer(dec->engine), s->tokens[n - 2],
                              &s->stream) == BT_OK) {
            char scratch[256];
            size_t len;
            tok_stream_set_skip_special(s->stream, sp.skip_special_tokens);
            /* The last token's text went out with the prefill's reply. */
            tok_stream_push(s->stream, s->tokens[n - 1], scratch,
                            sizeof(scratch), &len);
        }
    }
    /* Move the reserved blocks to the sequence; trim the estimate. */
    keep = BT_MIN(r->n_blocks, BT_DIV_UP(n, dec->block_size));
    if (s->eseq != NULL) {
        if (engine_seq_adopt_kv(dec->engine, s->eseq, r->blocks, keep,
                                n - 1) != BT_OK) {
            code = BATON__ERROR_CODE__ERROR_WORKER;
            why = "KV reservation does not hold the prompt";
            goto fail;
        }
        /* the engine sequence owns them now */
        memmove(r->blocks, r->blocks + keep,
                (size_t)(r->n_blocks - keep) * sizeof(int));
        r->n_blocks -= keep;
        if (spec_seq_create(dec->spec, s->eseq, &s->sseq) != BT_OK)
            goto fail;
        spec_seq_set_max_slots(s->sseq, r->growth_blocks * dec->block_size);
        decode__spec_import_feature(dec, s, r, m);
    } else {
        memcpy(s->blocks, r->blocks, (size_t)keep * sizeof(int));
        s->n_blocks = keep;
        r->n_blocks -= keep;
        memmove(r->blocks, r->blocks + keep, (size_t)r->n_blocks *
                                                 sizeof(int));
    }
    s->limit_blocks = r->limit_blocks;
    s->borrows = r->limit_blocks < r->growth_blocks;
    if (dec->prefix != NULL) {
        /* Its KV is here and verified (prefilled here, or arrived): its
         * full blocks may serve later prompts. */
        s->pcache = true;
        if (r->local_done)
            s->pcur = r->pcur;
        else
            kv_prefix_cursor_init(&s->pcur, workerproc_prefix_root(
                                      dec->prefix, m->has_cache_salt,
                                      &m->cache_salt));
    }
    if (r->n_blocks > 0)
        kv_allocator_release(dec->kv, r->n_blocks, r->blocks);
    bt_free(r->blocks);
    r->blocks = NULL;
    decode__resv_free(dec, r, true);
    s->next = dec->seqs;
    dec->seqs = s;
    dec->n_seqs++;
    return false;

fail:
    if (s != NULL)
        decode__seq_destroy(dec, s);
    decode__send_task_error(dec, m->request_id, r->epoch, code, why);
    decode__resv_free(dec, r,
                      arrived || dec->links == NULL ||
                          !kv_link_receiver_is_remote(dec->links));
    return false;
}

/* Retries the KvReady messages waiting for their link's last copies. */
void decode__arrivals_pending(decode_t *dec)
{
    DECODE_RESV_FOREACH(dec, i) {
        decode_resv_t *r = &dec->resv[i];
        Baton__ControlMessage *msg;
        if (r->pending == NULL)
            continue;
        msg = r->pending;
        r->pending = NULL;
        if (!decode__on_ready(dec, msg))
            proto_control_free(&msg);
    }
}

bool decode__has_arrivals_pending(const decode_t *dec)
{
    DECODE_RESV_FOREACH(dec, i)
        if (dec->resv[i].pending != NULL)
            return true;
    return false;
}
