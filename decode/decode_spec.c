/*
 * decode_spec.c - speculative decoding (--spec-head): the draft head
 * and its buffers, the shipped feature a request drafts from, and the
 * spec step over the running batch.
 */
#include "decode_int.h"

#include <string.h>

/* --spec-head: the draft head, the speculative decoder and its step
 * buffers. */
bt_status_t decode__spec_setup(decode_t *dec)
{
    int max_step;
    bt_status_t status;

    if (dec->cfg.spec_head == NULL)
        return BT_OK;
    if (dec->engine == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "DECODE",
                        "--spec-head needs a model");
    status = spec_head_load(engine_model(dec->engine), dec->cfg.spec_head,
                            &dec->head);
    if (status != BT_OK)
        return status;
    status = spec_create(dec->engine, dec->head, &dec->cfg.spec, &dec->spec);
    if (status != BT_OK)
        return status;
    max_step = spec_max_step_tokens(dec->spec);
    dec->dim = model_config(engine_model(dec->engine))->dim;
    dec->sseqs = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->sseqs),
                           "decode_spec");
    dec->n_out = bt_calloc((size_t)dec->max_seqs, sizeof(int), "decode_spec");
    dec->out = bt_calloc((size_t)dec->max_seqs * (size_t)max_step,
                         sizeof(int), "decode_spec");
    dec->hidden = bt_malloc((size_t)dec->max_seqs * (size_t)dec->dim *
                                sizeof(float), "decode_spec");
    dec->feat = bt_malloc((size_t)dec->dim * sizeof(float), "decode_spec");
    if (dec->sseqs == NULL || dec->n_out == NULL || dec->out == NULL ||
        dec->hidden == NULL || dec->feat == NULL)
        return BT_ERR_NO_MEMORY;
    BT_LOG_INFO("SPEC", "speculative decoding with %s: depth %d, top-k %d, "
                "%d tokens, %s", dec->cfg.spec_head, dec->cfg.spec.depth,
                dec->cfg.spec.topk, dec->cfg.spec.tokens,
                dec->cfg.spec.adaptive ? "adaptive" : "fixed tree");
    return BT_OK;
}

void decode__spec_teardown(decode_t *dec)
{
    if (dec->spec != NULL) {
        spec_stats_t st;
        spec_get_stats(dec->spec, &st);
        BT_LOG_INFO("SPEC", "accept-length: %.2f tree_steps:%llu "
                    "plain_steps:%llu draft_tokens:%llu "
                    "first_step_drafted:%llu first_step_plain:%llu",
                    spec_accept_length(dec->spec),
                    (unsigned long long)st.verify_seqs,
                    (unsigned long long)st.plain_seqs,
                    (unsigned long long)st.draft_tokens,
                    (unsigned long long)dec->first_drafted,
                    (unsigned long long)dec->first_plain);
    }
    spec_destroy(&dec->spec);
    spec_head_destroy(&dec->head);
    bt_free(dec->sseqs);
    bt_free(dec->n_out);
    bt_free(dec->out);
    bt_free(dec->hidden);
    bt_free(dec->feat);
    dec->sseqs = NULL;
    dec->n_out = NULL;
    dec->out = NULL;
    dec->hidden = NULL;
    dec->feat = NULL;
}

/* Speculation-aware hand-off: seeds the draft state of s with the last
 * prompt token's hidden state, computed here (local prefill) or shipped
 * by the prefill worker in KvReady; without one the first step decodes
 * plainly and drafting starts from the next. */
void decode__spec_import_feature(decode_t *dec, decode_seq_t *s,
                                 const decode_resv_t *r,
                                 const Baton__KvReady *m)
{
    const float *f = NULL;

    if (r->feat != NULL) {
        f = r->feat;
    } else if (m->has_spec_feature &&
               m->spec_feature.len == (size_t)dec->dim * sizeof(float)) {
        memcpy(dec->feat, m->spec_feature.data, m->spec_feature.len);
        f = dec->feat;
    } else if (m->has_spec_feature) {
        BT_LOG_WARN("SPEC", "request %llu: spec feature of %zu bytes "
                    "ignored (dim %d)", (unsigned long long)s->id,
                    m->spec_feature.len, dec->dim);
    }
    if (f != NULL && spec_seq_import(dec->spec, s->sseq, f, 1) != BT_OK)
        BT_LOG_WARN("SPEC", "request %llu: feature not imported",
                    (unsigned long long)s->id);
}

/* Speculative decoding: one spec_step over the running batch.  Each
 * sequence first gets the KV slot plain decoding needs (else it waits a
 * step, as in plain mode); the draft tree's extra slots are taken by
 * spec_step only where the pool has them, within the request's
 * admission promise (spec_seq_set_max_slots). */
void decode__step_spec(decode_t *dec)
{
    int n = 0, max_step = spec_max_step_tokens(dec->spec);
    uint64_t now = bt_time_ns(), t_fwd;
    decode_seq_t *s, *next;
    bt_status_t status;

    for (s = dec->seqs; s && n < dec->max_seqs && n < dec->budget; s = next) {
        int cached = engine_seq_cached(s->eseq);
        next = s->next;
        if (engine_seq_reserve(dec->engine, s->eseq, cached + 1) != BT_OK) {
            decode__seq_no_room(dec, s, now);
            continue;
        }
        s->wait_since = 0;
        dec->bmap[n] = s;
        dec->sseqs[n++] = s->sseq;
    }
    if (n == 0)
        return;
    /* not overlapped: the draft and verify forwards count as waiting,
     * the emission below as post */
    memset(&dec->split, 0, sizeof(dec->split));
    t_fwd = bt_time_ns();
    dec->split.build = (double)(t_fwd - dec->turn_t0) * 1e-9;
    status = spec_step(dec->spec, dec->sseqs, n, dec->n_out, dec->out);
    dec->step_ended_ns = bt_time_ns();
    dec->split.wait = (double)(dec->step_ended_ns - t_fwd) * 1e-9;
    dec->steps++;
    if (dec->cfg.metrics != NULL) { /* metrics hook */
        uint64_t gen = 0;
        for (int i = 0; status == BT_OK && i < n; i++)
            gen += (uint64_t)BT_MAX(dec->n_out[i], 0);
        workerproc_metrics_step(dec->cfg.metrics, n,
                                (double)(bt_time_ns() - now) * 1e-9, 0, gen);
    }
    for (int i = 0; i < n; i++) {
        s = dec->bmap[i];
        if (status != BT_OK) {
            decode__seq_fail(dec, s, BATON__ERROR_CODE__ERROR_WORKER,
                             bt_error_last());
            continue;
        }
        if (!s->spec_started && dec->n_out[i] > 0) {
            int drafted = spec_seq_last_drafted(s->sseq);
            s->spec_started = true;
            if (drafted > 0)
                dec->first_drafted++;
            else
                dec->first_plain++;
            BT_LOG_INFO("SPEC", "request %llu first decode step: drafted %d "
                        "accepted %d", (unsigned long long)s->id, drafted,
                        dec->n_out[i] - 1);
        }
        if (dec->n_out[i] > 0 &&
            decode__seq_emit_n(dec, s, dec->out + (size_t)i * max_step,
                               dec->n_out[i]))
            decode__seq_remove(dec, s);
    }
    decode__send_outbox(dec);
    decode__step_split_observe(dec);
}
