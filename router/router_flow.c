/*
 * router_flow.c - the request state machine of the push model:
 *   QUEUED     -> dispatch: the policy picks decode D and prefill P,
 *                 KvReserve to D                          -> RESERVING
 *   RESERVING  -> KvGrant: PrefillTask to P (transport chosen per
 *                 pair); refused: back to the queue       -> PREFILLING
 *   PREFILLING -> PrefillDone: the first token goes to the client at
 *                 once (through the stop matcher), KvReady to D
 *                                                         -> DECODING
 *   DECODING   -> TokenOut: relayed by index (never twice) until the
 *                 finish; TaskError fails the request.
 * Worker failures send a request back to QUEUED (router_request.c).
 */
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "kv/kv_link_choose.h"
#include "router_int.h"
#include "stop.h"

_Static_assert(ROUTER_STOP_HELD_MAX >= STOP_MAX_STRING_LEN,
               "the router keeps any held-back stop text");

/* Predicted seconds to worker w's first token for a prompt of n_tokens
 * with `cached` of them cached there: its queued prompt tokens and this
 * prompt's uncached ones at its measured prefill rate (`rate`). */
static double predicted_ttft(const router_worker_t *w, int cached,
                             int n_tokens, double rate)
{
    int todo = n_tokens - BT_MAX(0, BT_MIN(cached, n_tokens - 1));

    return ((double)w->outstanding + (double)todo) / rate;
}

/* --aggregate ttft (conditional disaggregation, issue 36): true when
 * aggregated worker a would give the first token sooner than prefill
 * worker p.  Both rates are the workers' measured prefill tokens/s (an
 * aggregated worker's includes the decode rows its steps carry); one
 * that has not prefilled yet is taken at p's rate, and with p's unknown
 * too the prefill worker keeps it (as fallback does).  The hand-off
 * (tens of microseconds to milliseconds) is left out. */
static bool ttft_local_sooner(const router_worker_t *p, int p_cached,
                              const router_worker_t *a, int a_cached,
                              int n_tokens)
{
    double p_rate = p->prefill_tps;
    double a_rate = a->prefill_tps > 0 ? a->prefill_tps : p_rate;

    if (p_rate <= 0)
        return false;
    return predicted_ttft(a, a_cached, n_tokens, a_rate) <
           predicted_ttft(p, p_cached, n_tokens, p_rate);
}

/* Picks the workers for req (n_tokens of prompt): the aggregated worker
 * or the prefill/decode pair of one pool (router_pool.c) that the policy
 * prefers, among the workers of the class it asked.  When the policy's
 * prefill worker has no decode worker of its pool with room, another
 * pool of the class may have both.  *cached_p / *p_cached_p: the prompt
 * tokens the policy expects cached on d / p.  False when none can take
 * it now. */
static bool pick_pair(router_t *r, const router_req_t *req, int n_tokens,
                      const router_pool_t *pools, int n_pools,
                      router_worker_t **p_p, router_worker_t **d_p,
                      int *cached_p, int *p_cached_p)
{
    router_class_t want = { req->precision, "" };
    router_class_t pair;
    router_worker_t *p = NULL, *d = NULL;

    if (r->aggregate == 2) /* always: aggregated workers first */
        d = r->policy->pick_decode(r, req, n_tokens, true, &want, cached_p);
    if (d != NULL) {
        p = d;
    } else {
        p = r->policy->pick_prefill(r, req, &want, p_cached_p);
        if (p != NULL && r->aggregate == 3) {
            /* ttft: an aggregated worker prefills it when its first token
             * is predicted sooner than the prefill worker's */
            router_worker_t *a = r->policy->pick_decode(r, req, n_tokens,
                                                        true, &want,
                                                        cached_p);
            if (a != NULL && ttft_local_sooner(p, *p_cached_p, a,
                                               *cached_p, n_tokens))
                d = p = a;
        }
        if (p == NULL && r->aggregate >= 1) {
            /* No prefill worker: a --role both decode worker prefills
             * its own request (aggregated mode). */
            d = r->policy->pick_decode(r, req, n_tokens, true, &want,
                                       cached_p);
            p = d;
        }
        if (p == NULL)
            return false;
        if (d == NULL) {
            pair = router__worker_class(p);
            d = r->policy->pick_decode(r, req, n_tokens, false, &pair,
                                       cached_p);
        }
    }
    for (int k = 0; d == NULL && k < n_pools; k++) {
        const router_pool_t *pool = &pools[k];
        router_worker_t *p2;

        if (pool->n_prefill == 0 || pool->n_decode + pool->n_both == 0 ||
            (req->precision[0] != '\0' &&
             strcmp(pool->precision, req->precision) != 0) ||
            (strcmp(pool->precision, p->precision) == 0 &&
             strcmp(pool->kv_dtype, p->kv_dtype) == 0))
            continue;
        pair.precision = pool->precision;
        pair.kv_dtype = pool->kv_dtype;
        p2 = r->policy->pick_prefill(r, req, &pair, p_cached_p);
        if (p2 == NULL)
            continue;
        d = r->policy->pick_decode(r, req, n_tokens, false, &pair, cached_p);
        if (d != NULL)
            p = p2;
    }
    if (d == NULL)
        return false;
    BT_ASSERT(router__pair_matches(p, d));
    *p_p = p;
    *d_p = d;
    return true;
}

/* True when req's prompt ids may go to prefill worker p: ids the client
 * sent or a worker confirmed, or the router's --tokenizer encoding of
 * its text when p encodes with a tokenizer of the same identity (the
 * same bytes: the same ids).  Otherwise p gets the text, and the ids
 * stay a routing guess that no KV reservation is matched against. */
static bool req_ids_for(const router_t *r, const router_req_t *req,
                        const router_worker_t *p)
{
    return req->prompt_ids != NULL &&
           (!req->ids_from_text ||
            (r->tok_id != 0 && p->tokenizer_id == r->tok_id));
}

/* True when `precision` is in blocked[0..n): a request of that class
 * waits, so later ones of it wait behind it. */
static bool class_blocked(const char *const *blocked, int n,
                          const char *precision)
{
    for (int i = 0; i < n; i++)
        if (strcmp(blocked[i], precision) == 0)
            return true;
    return false;
}

void router__dispatch(router_t *r)
{
    uint64_t now = bt_time_ns();
    router_pool_t pools[ROUTER_MAX_POOLS];
    int n_pools = router__pools(r, pools);
    const char *blocked[ROUTER_MAX_POOLS + 1]; /* classes waiting */
    int n_blocked = 0;

    for (int i = 0; i < r->n_queued;) {
        router_req_t *req = r->queue[i];
        router_worker_t *p, *d;
        Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
        Baton__KvReserve res = BATON__KV_RESERVE__INIT;
        int n_tokens, blocks, cached = 0, p_cached = 0;
        int *ids = NULL;
        char why[512];

        if (req->retry_at_ns > now) {
            i++;
            continue;
        }
        n_tokens = router__req_prefill_tokens(req);
        /* Issue 36: a request no decode worker could ever hold fails
         * now (ERROR_TOO_LONG) instead of retrying until the queue
         * timeout; one that fits a pool but not its free blocks stays
         * queued below (head-of-line, priority order kept). */
        if (router__req_never_fits(r, req,
                                   req->prompt_ids != NULL &&
                                   !req->ids_from_text ? n_tokens : 1,
                                   why, sizeof(why))) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_TOO_LONG, why);
            continue; /* removed from the queue: queue[i] is the next */
        }
        /* Issue 37: no pool serves its precision class (the workers that
         * did left): it fails now, not at the queue timeout. */
        if (router__class_unservable(r, pools, n_pools, req->precision, why,
                                     sizeof(why))) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_NO_WORKERS,
                             why);
            continue;
        }
        /* Head-of-line per class: a request that waits holds back the
         * later ones that could take its workers (its own class, or any
         * class), not those of another class. */
        if (req->precision[0] == '\0' && n_blocked > 0)
            return;
        if (class_blocked(blocked, n_blocked, req->precision)) {
            i++;
            continue;
        }
        if (!pick_pair(r, req, req->prompt_ids ? n_tokens : 1, pools,
                       n_pools, &p, &d, &cached, &p_cached)) {
            if (req->precision[0] == '\0' || n_blocked == ROUTER_MAX_POOLS)
                return; /* head-of-line: keep priority order */
            blocked[n_blocked++] = req->precision;
            i++;
            continue;
        }
        /* A text prompt: the worker's tokens, at most one a byte.  The
         * router's --tokenizer ids count only for a prefill worker that
         * takes them (req_ids_for): another tokenizer's may be more. */
        req->reserved_by_ids = req->ids_from_text && req_ids_for(r, req, p);
        if (!req_ids_for(r, req, p)) {
            n_tokens = router__req_text_tokens(req);
            if (d->max_context > 0)
                n_tokens = BT_MIN(n_tokens, (int)d->max_context);
        }
        /* counted as d counts it: the estimate of its free blocks then
         * holds back the next requests of this pass as d will */
        blocks = (int)BT_MIN(router__blocks_to_admit(d, req, n_tokens),
                             (int64_t)INT_MAX);
        router__queue_remove(r, req); /* shifts queue[i+1..] down */
        router__queue_dispatched(r, req);
        req->prefill_uid = p->uid;
        req->decode_uid = d->uid;
        /* The prefill work: the prefilling worker (aggregated or a
         * prefill worker, issue 38) skips the prefix the kv-aware pick
         * found cached there, so its load (and the phase deadline)
         * counts only the rest; otherwise a busy worker holding a hot
         * prefix looks heavier than it is and the prefix loses its
         * worker. */
        if (p != d)
            cached = p_cached;
        req->task_tokens = (uint64_t)n_tokens -
            (uint64_t)BT_MAX(0, BT_MIN(cached, n_tokens - 1));
        req->reserved_blocks = blocks;
        req->state = ROUTER_REQ_RESERVING;
        req->attempt++;
        router__req_phase_deadline(r, req);
        p->outstanding += req->task_tokens;
        p->assigned++;
        p->served++;
        d->assigned++;
        d->served++;
        d->pending_reserve += blocks;
        d->est_free_kv -= blocks;
        /* a hand-off to a worker whose receive room was full probes it */
        req->recv_probe = p != d && d->recv_probing;
        d->recv_probe_out |= req->recv_probe;
        res.has_request_id = 1;
        res.request_id = req->id;
        res.has_n_tokens = 1;
        res.n_tokens = (uint32_t)n_tokens;
        res.has_max_total_tokens = 1;
        res.max_total_tokens = (uint32_t)BT_MIN(
            (int64_t)n_tokens + req->max_tokens - req->n_generated,
            (int64_t)UINT32_MAX);
        /* The link the hand-off will take (local when d prefills it):
         * the decode worker arms only that one, so a prompt prefilled
         * there or sent inline maps no receive window.  A link writing
         * through a receive area (staged UCX) also says kv_stage, for
         * decode workers that predate kv_transport. */
        req->announced = router__choose_transport(p, d, r->kv_mode);
        res.has_kv_transport = 1;
        res.kv_transport = req->announced;
        if (kv_link_wants_recv_area((int)req->announced)) {
            res.has_kv_stage = 1;
            res.kv_stage = 1;
        }
        res.has_attempt = 1;
        res.attempt = req->attempt;
        /* Disaggregated: the decode worker pins what its prefix cache
         * holds of the prompt and the hand-off skips it (issue 38).  A
         * worker that prefills its own request matches at the task. */
        if (p != d && req_ids_for(r, req, p) &&
            n_tokens == req->n_prompt + req->n_generated) {
            ids = bt_malloc((size_t)n_tokens * sizeof(int), "router_task_ids");
            if (ids != NULL) {
                memcpy(ids, req->prompt_ids,
                       (size_t)req->n_prompt * sizeof(int));
                if (req->n_generated > 0)
                    memcpy(ids + req->n_prompt, req->generated,
                           (size_t)req->n_generated * sizeof(int));
                res.n_prompt_ids = (size_t)n_tokens;
                res.prompt_ids = ids;
                res.has_cache_salt = req->cache_salt_len > 0;
                res.cache_salt.data = req->cache_salt;
                res.cache_salt.len = req->cache_salt_len;
            }
        }
        msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_RESERVE;
        msg.kv_reserve = &res;
        router__send_control(r, d, &msg);
        bt_free(ids);
        BT_LOG_DEBUG("ROUTER", "request %llu -> prefill %s, decode %s (%d "
                     "tokens, %d blocks)", (unsigned long long)req->id,
                     p->name, d->name, n_tokens, blocks);
    }
}

static bool is_stop(const int *ids, int n, int tok)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == tok)
            return true;
    return false;
}

/* True when the request's text goes through a stop-string matcher. */
static bool req_matches_text(const router_req_t *req)
{
    return req->want_text && req->n_stop_strings > 0;
}

/* Runs the prefill-sampled token `tok` (its text text[0..len)) through
 * the request's stop matcher (stop ids `stops` and its stop strings, as
 * the decode worker builds it), continuing from the request's held-back
 * text: empty at the first token, after a failover what the failed
 * decode worker last reported.  So a stop string inside the first token,
 * or one that starts there and ends in a later token, is found exactly
 * as in `baton run`.  Writes the text to show now to `out` (bt_malloc'ed,
 * the caller frees it), keeps the new held-back text in req, and sets
 * *reason_p (STOP_NONE, STOP_EOS or STOP_STRING).  BT_ERR_NO_MEMORY, or
 * BT_ERR_INVALID_ARG for stop strings the matcher refuses. */
static bt_status_t req_stop_feed(router_req_t *req, const int *stops,
                                 int n_stops, int tok, const uint8_t *text,
                                 size_t len, char **out_p, size_t *out_len,
                                 stop_reason_t *reason_p)
{
    char strs[STOP_MAX_STRINGS][STOP_MAX_STRING_LEN + 1];
    stop_config_t cfg;
    stop_t *stop = NULL;
    const char *held;
    size_t cap = len + req->n_stop_held + 1, n_held;
    char *out;
    bt_status_t status;

    stop_config_init(&cfg);
    cfg.max_tokens = INT32_MAX; /* the router counts tokens itself */
    for (int i = 0; i < n_stops && cfg.n_ids < STOP_MAX_IDS; i++)
        cfg.ids[cfg.n_ids++] = stops[i];
    for (int i = 0; i < req->n_stop_strings && cfg.n_strings <
                                                   STOP_MAX_STRINGS; i++) {
        size_t slen = req->stop_strings[i].len;
        if (slen == 0 || slen > STOP_MAX_STRING_LEN)
            continue; /* skipped by the decode worker too */
        memcpy(strs[cfg.n_strings], req->stop_strings[i].data, slen);
        strs[cfg.n_strings][slen] = '\0';
        cfg.strings[cfg.n_strings] = strs[cfg.n_strings];
        cfg.n_strings++;
    }
    status = stop_create(&cfg, &stop);
    if (status != BT_OK)
        return status;
    status = stop_prime(stop, req->stop_held, req->n_stop_held);
    out = bt_malloc(cap, "router_stop_text");
    if (status == BT_OK && out == NULL)
        status = BT_ERR_NO_MEMORY;
    if (status != BT_OK) {
        bt_free(out);
        stop_destroy(&stop);
        return status;
    }
    *reason_p = stop_feed(stop, tok, (const char *)text, len, out, cap,
                          out_len);
    held = stop_held(stop, &n_held);
    req->n_stop_held = BT_MIN(n_held, sizeof(req->stop_held));
    memcpy(req->stop_held, held, req->n_stop_held);
    stop_destroy(&stop);
    *out_p = out;
    return BT_OK;
}

void router__on_kv_grant(router_t *r, router_worker_t *w, Baton__KvGrant *g)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillTask task = BATON__PREFILL_TASK__INIT;
    Baton__KvEndpoint route = BATON__KV_ENDPOINT__INIT;
    const router_endpoint_t *ep;
    router_req_t *req = router__req_find(r, g->request_id);
    router_worker_t *p;
    int stops[PROTO_MAX_STOP + ROUTER_MAX_EOS];
    int *ids = NULL;
    int n_ids = 0;

    if (req == NULL || req->state != ROUTER_REQ_RESERVING ||
        req->decode_uid != w->uid || !g->has_attempt ||
        g->attempt != req->attempt) {
        /* The request is gone or moved on (this grant answers an earlier
         * attempt): free the blocks. */
        if (g->ok)
            router__send_kv_release(r, w, g->request_id, g->epoch);
        r->stale_msgs++;
        return;
    }
    w->pending_reserve -= req->reserved_blocks;
    if (req->recv_probe) { /* the probe is answered */
        req->recv_probe = false;
        w->recv_probe_out = false;
    }
    /* room again: no more probes once no refusal came for a while
     * (until then reservations go one at a time, each on the last's
     * answer: opening at the first ok sent every queued request) */
    if (g->ok && bt_time_ns() - w->recv_refused_ns > ROUTER_RECV_FULL_WAIT_NS)
        w->recv_probing = false;
    if (g->has_free_blocks)
        w->est_free_kv = (int64_t)g->free_blocks - w->pending_reserve;
    if (!g->ok) {
        /* Pool full: wait for blocks (bounded by the queue timeout). */
        if (!g->has_free_blocks)
            w->est_free_kv = 0;
        r->metrics.kv_refusals++;
        req->reserved_blocks = 0;
        if (g->has_recv_full && g->recv_full) {
            /* The receive area is full, not the pool: the worker is
             * closed to hand-offs until its heartbeat tells of room
             * freed since this refusal (maybe already heard) or the
             * wait passes, so the requests behind this one are not all
             * refused in turn; this one may take another decode worker
             * now. */
            w->recv_probing = true;
            w->recv_refused_ns = bt_time_ns();
            w->recv_full_until =
                g->has_recv_frees && g->recv_frees < w->recv_frees
                    ? 0
                    : bt_time_ns() + ROUTER_RECV_FULL_WAIT_NS;
            router__req_requeue(r, req, false, 0);
            return;
        }
        router__req_requeue(r, req, false, ROUTER_KV_RETRY_NS);
        return;
    }
    req->state = ROUTER_REQ_PREFILLING; /* reserve counted no more */
    req->epoch = g->epoch;
    if (req->epoch == 0) { /* epochs fence every later message: required */
        router__send_kv_release(r, w, req->id, 0);
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                         "decode worker granted KV without an epoch");
        return;
    }
    if (g->has_cached_blocks && g->cached_blocks >= g->n_block_ids) {
        /* the hand-off always moves the last token's block */
        router__send_kv_release(r, w, req->id, req->epoch);
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                         "decode worker granted KV holding the whole prompt");
        return;
    }
    if (req->t_granted == 0) /* the first grant ends the queue wait */
        bt_prom_hist_observe(&r->metrics.queue_wait,
                             (double)(bt_time_ns() - req->t_arrival) * 1e-9);
    req->t_granted = bt_time_ns();
    p = router__worker_by_uid(r, req->prefill_uid);
    if (p == NULL || !router__worker_is_usable(p)) {
        /* another prefill worker of the decode worker's pool */
        router_class_t pair = router__worker_class(w);
        int p_cached = 0; /* task_tokens stays the first pick's */

        router__req_unassign_prefill(r, req);
        p = r->policy->pick_prefill(r, req, &pair, &p_cached);
        if (p == NULL && r->aggregate >= 1 && w->can_prefill)
            p = w; /* aggregated: the decode worker prefills it */
        if (p != NULL && req->reserved_by_ids && !req_ids_for(r, req, p))
            p = NULL; /* it would tokenize the text: maybe past the
                         reservation sized by the router's ids */
        if (p == NULL) {
            router__send_kv_release(r, w, req->id, req->epoch);
            req->state = ROUTER_REQ_RESERVING;
            router__req_requeue(r, req, false, ROUTER_KV_RETRY_NS);
            return;
        }
        req->prefill_uid = p->uid;
        p->outstanding += req->task_tokens;
        p->assigned++;
    }
    task.has_request_id = 1;
    task.request_id = req->id;
    if (req_ids_for(r, req, p)) {
        n_ids = req->n_prompt + req->n_generated;
        ids = bt_malloc((size_t)n_ids * sizeof(int), "router_task_ids");
        if (ids == NULL) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
                             "out of memory");
            return;
        }
        memcpy(ids, req->prompt_ids, (size_t)req->n_prompt * sizeof(int));
        if (req->n_generated > 0) /* generated is NULL until then */
            memcpy(ids + req->n_prompt, req->generated,
                   (size_t)req->n_generated * sizeof(int));
        task.n_prompt_ids = (size_t)n_ids;
        task.prompt_ids = ids;
    } else {
        task.has_prompt_text = 1;
        task.prompt_text.data = req->prompt_text;
        task.prompt_text.len = req->text_len;
    }
    task.has_add_bos = 1;
    task.add_bos = req->add_bos;
    task.sampling = &req->sampling;
    task.grant = g;
    task.decode_name = w->name;
    task.has_n_generated = 1;
    task.n_generated = (uint32_t)req->n_generated;
    task.n_stop_ids = (size_t)router__req_stop_ids(req, w, stops);
    task.stop_ids = (int32_t *)stops;
    task.has_ignore_eos = 1;
    task.ignore_eos = req->ignore_eos;
    task.has_max_tokens = 1;
    task.max_tokens = (uint32_t)req->max_tokens;
    task.grammar = req->grammar;
    task.has_cache_salt = req->cache_salt_len > 0;
    task.cache_salt.data = req->cache_salt;
    task.cache_salt.len = req->cache_salt_len;
    /* Staged UCX needs the receive-area ids of this grant (the decode
     * worker gives none when it was not asked or has no receiver). */
    req->transport = router__choose_transport_ex(
        p, w, r->kv_mode,
        g->n_stage_block_ids > 0 &&
            g->n_stage_block_ids == g->n_block_ids - g->cached_blocks);
    /* Only the announced link was armed: another (the prefill worker
     * was re-picked, the receive area was not granted) would write
     * where nothing waits for it, so the KV goes inline. */
    if (kv_link_endpoint_id((int)req->transport) !=
            kv_link_endpoint_id((int)req->announced) &&
        req->transport != BATON__KV_TRANSPORT__KV_TRANSPORT_LOCAL) {
        BT_LOG_DEBUG("ROUTER", "request %llu: %s was armed, not %s: KV "
                     "inline", (unsigned long long)req->id,
                     router__transport_name(req->announced),
                     router__transport_name(req->transport));
        req->transport = BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE;
    }
    task.has_transport = 1;
    task.transport = req->transport;
    /* The route: the decode worker's endpoint for that link, opaque
     * here (the prefill worker's link parses it). */
    ep = router__worker_endpoint(w, req->transport);
    if (ep != NULL) {
        route.has_transport = 1;
        route.transport = (Baton__KvTransport)ep->transport;
        route.has_desc = 1;
        route.desc.data = ep->desc;
        route.desc.len = ep->len;
        task.route = &route;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK;
    msg.prefill_task = &task;
    router__send_control(r, p, &msg);
    req->t_prefill_sent = bt_time_ns();
    router__req_phase_deadline(r, req);
    bt_free(ids);
}

void router__on_prefill_done(router_t *r, router_worker_t *w,
                             Baton__PrefillDone *done)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvReady ready = BATON__KV_READY__INIT;
    router_req_t *req = router__req_find(r, done->request_id);
    router_worker_t *d;
    router_chunk_lp_t lp;
    int stops[PROTO_MAX_STOP + ROUTER_MAX_EOS];
    int n_stops, first, n_tokens;
    int *tokens;
    const uint8_t *text;
    size_t text_len;
    char *shown = NULL;
    stop_reason_t reason;

    /* A late answer for a request that moved on: an earlier attempt of
     * a re-queued request can fail after the new attempt reached the same
     * prefill worker (its hand-off went to a decode worker that died);
     * the grant's epoch tells the two apart, and without that check the
     * stale failure cost the healthy attempt a retry. */
    if (req == NULL || req->state != ROUTER_REQ_PREFILLING ||
        req->prefill_uid != w->uid ||
        (done->has_epoch && done->epoch != req->epoch))
        return;
    d = router__worker_by_uid(r, req->decode_uid);
    router__req_unassign_prefill(r, req);
    if (!done->ok) {
        Baton__ErrorCode code = done->has_error_code
                                    ? done->error_code
                                    : BATON__ERROR_CODE__ERROR_WORKER;
        if (code == BATON__ERROR_CODE__ERROR_WORKER && d != NULL) {
            /* The worker, not the request, failed: try again.  A failed
             * hand-off is put on the decode worker: if it has died, the
             * liveness check's drop of it later is this same failure. */
            router__send_kv_release(r, d, req->id, req->epoch);
            req->failed_uid = d->uid;
            router__req_requeue(r, req, true, 0); /* may free req */
            return;
        }
        router__req_fail(r, req, code,
                         done->error ? done->error : "prefill failed");
        return;
    }
    if (d == NULL) { /* decode died meanwhile: prefill again */
        router__req_requeue(r, req, true, 0);
        return;
    }
    req->t_prefill_done = bt_time_ns();
    req->transfer_us += done->transfer_us;
    if (req->ids_from_text && done->n_prompt_ids == (size_t)req->n_prompt &&
        memcmp(done->prompt_ids, req->prompt_ids,
               (size_t)req->n_prompt * sizeof(int)) == 0) {
        req->ids_from_text = false; /* the worker encoded them the same */
    } else if (req->ids_from_text) {
        /* A worker of another tokenizer had the text: its ids are the
         * prompt (what it computed); the router's guess goes. */
        BT_LOG_DEBUG("ROUTER", "request %llu: the prefill worker's ids "
                     "differ from --tokenizer's (%zu vs %d): its are kept",
                     (unsigned long long)req->id, done->n_prompt_ids,
                     req->n_prompt);
        bt_free(req->prompt_ids);
        req->prompt_ids = NULL;
        req->n_prompt = 0;
        req->ids_from_text = false;
    }
    if (req->prompt_ids == NULL) {
        if (done->n_prompt_ids == 0) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                             "prefill returned no prompt ids");
            return;
        }
        req->prompt_ids = bt_malloc(done->n_prompt_ids * sizeof(int),
                                    "router_prompt");
        if (req->prompt_ids == NULL) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
                             "no memory");
            return;
        }
        memcpy(req->prompt_ids, done->prompt_ids,
               done->n_prompt_ids * sizeof(int));
        req->n_prompt = (int)done->n_prompt_ids;
    }
    /* The first chunk's logprobs: the first token's, and the prompt's
     * once per request (a resumed attempt recomputes them: not again). */
    memset(&lp, 0, sizeof(lp));
    if (done->has_first_logprob &&
        done->n_first_top_ids == done->n_first_top_logprobs) {
        lp.logprobs = &done->first_logprob;
        lp.top_ids = done->first_top_ids;
        lp.top_logprobs = done->first_top_logprobs;
        lp.k = (int)done->n_first_top_ids;
    }
    if (!req->plp_sent && req->sampling.prompt_logprobs &&
        req->n_prompt >= 1 &&
        done->n_prompt_logprobs >= (size_t)req->n_prompt - 1) {
        size_t np = done->n_prompt_logprobs;
        if (done->n_prompt_top_ids != done->n_prompt_top_logprobs ||
            (np > 0 && done->n_prompt_top_ids % np != 0)) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                             "prefill sent malformed prompt logprobs");
            return;
        }
        lp.prompt_ids = req->prompt_ids;
        lp.n_prompt = req->n_prompt;
        lp.prompt_logprobs = done->prompt_logprobs;
        lp.prompt_top_ids = done->prompt_top_ids;
        lp.prompt_top_logprobs = done->prompt_top_logprobs;
        lp.pk = np > 0 ? (int)(done->n_prompt_top_ids / np) : 0;
        req->plp_sent = true;
        /* a resumed attempt (failover) need not compute them again */
        req->sampling.prompt_logprobs = 0;
    } else if (!req->plp_sent && req->sampling.prompt_logprobs) {
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                         "prefill sent no prompt logprobs");
        return;
    }
    first = done->first_token;
    n_stops = router__req_stop_ids(req, d, stops);
    text = req->want_text && done->has_first_text ? done->first_text.data
                                                  : NULL;
    text_len = text != NULL ? done->first_text.len : 0;
    reason = is_stop(stops, n_stops, first) ? STOP_EOS : STOP_NONE;
    if (req_matches_text(req)) {
        /* The first token goes through the same matcher state as every
         * later one (the decode worker continues from stop_held). */
        bt_status_t status = req_stop_feed(req, stops, n_stops, first, text,
                                           text_len, &shown, &text_len,
                                           &reason);
        if (status != BT_OK) {
            router__req_fail(r, req,
                             status == BT_ERR_NO_MEMORY
                                 ? BATON__ERROR_CODE__ERROR_INTERNAL
                                 : BATON__ERROR_CODE__ERROR_INVALID,
                             "bad stop conditions");
            return;
        }
        text = (const uint8_t *)shown;
    }
    if (reason == STOP_EOS) {
        /* Not emitted; text a failed decode worker held back goes out. */
        if (text_len > 0 || lp.n_prompt > 0)
            router__send_chunk_lp(r, req, req->n_generated, NULL, 0, text,
                                  text_len, &lp);
        bt_free(shown);
        router__send_kv_release(r, d, req->id, req->epoch);
        router__req_complete(r, req, BATON__FINISH_REASON__FINISH_STOP);
        return;
    }
    if (!router__req_append_generated(req, &first, 1)) {
        bt_free(shown);
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
                         "no memory");
        return;
    }
    if (reason == STOP_NONE && req->n_generated >= req->max_tokens &&
        shown != NULL) {
        /* The end: held-back text shows (text_len + held <= cap). */
        memcpy(shown + text_len, req->stop_held, req->n_stop_held);
        text_len += req->n_stop_held;
        req->n_stop_held = 0;
    }
    router__send_chunk_lp(r, req, req->n_generated - 1, &first, 1, text,
                          text_len, &lp);
    bt_free(shown);
    if (reason == STOP_STRING || req->n_generated >= req->max_tokens) {
        router__send_kv_release(r, d, req->id, req->epoch);
        router__req_complete(r, req,
                             reason == STOP_STRING
                                 ? BATON__FINISH_REASON__FINISH_STOP
                                 : BATON__FINISH_REASON__FINISH_LENGTH);
        return;
    }
    n_tokens = req->n_prompt + req->n_generated;
    tokens = bt_malloc((size_t)n_tokens * sizeof(int), "router_ready");
    if (tokens == NULL) {
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
                         "no memory");
        return;
    }
    memcpy(tokens, req->prompt_ids, (size_t)req->n_prompt * sizeof(int));
    memcpy(tokens + req->n_prompt, req->generated,
           (size_t)req->n_generated * sizeof(int));
    ready.has_request_id = 1;
    ready.request_id = req->id;
    ready.has_epoch = 1;
    ready.epoch = req->epoch;
    ready.n_tokens = (size_t)n_tokens;
    ready.tokens = tokens;
    ready.has_n_prompt = 1;
    ready.n_prompt = (uint32_t)req->n_prompt;
    ready.has_n_generated = 1;
    ready.n_generated = (uint32_t)req->n_generated;
    ready.sampling = &req->sampling;
    ready.has_max_tokens = 1;
    ready.max_tokens = (uint32_t)req->max_tokens;
    ready.n_stop_ids = (size_t)n_stops;
    ready.stop_ids = (int32_t *)stops;
    ready.has_ignore_eos = 1;
    ready.ignore_eos = req->ignore_eos;
    ready.has_want_text = 1;
    ready.want_text = req->want_text;
    ready.n_kv_inline = done->n_kv_inline; /* forwarded without a copy */
    ready.kv_inline = done->kv_inline;
    /* The capability the prefill worker presented, relayed as it came:
     * the decode worker judges it (issue 42). */
    ready.has_capability = done->has_capability;
    ready.capability = done->capability;
    ready.has_spec_feature = done->has_spec_feature; /* EAGLE hand-off */
    ready.spec_feature = done->spec_feature;
    ready.n_stop_strings = (size_t)req->n_stop_strings;
    ready.stop_strings = req->stop_strings;
    ready.grammar = req->grammar;
    ready.has_cache_salt = req->cache_salt_len > 0;
    ready.cache_salt.data = req->cache_salt;
    ready.cache_salt.len = req->cache_salt_len;
    if (req->n_stop_held > 0) {
        ready.has_stop_held = 1;
        ready.stop_held.data = (uint8_t *)req->stop_held;
        ready.stop_held.len = req->n_stop_held;
    }
    ready.has_transport = 1;
    ready.transport = done->n_kv_inline > 0
                          ? BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE
                          : req->transport;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_READY;
    msg.kv_ready = &ready;
    r->metrics.handoffs[(unsigned)ready.transport %
                        ROUTER_METRICS_TRANSPORTS]++;
    router__send_control(r, d, &msg);
    req->state = ROUTER_REQ_DECODING;
    router__req_phase_deadline(r, req); /* the next token's */
    bt_free(tokens);
}

void router__on_token_out(router_t *r, router_worker_t *w,
                          const Baton__TokenOut *out)
{
    router_req_t *req = router__req_find(r, out->request_id);
    int skip, n;

    /* Only the current attempt speaks: the worker it went to, in the
     * state that expects tokens, with the epoch of its grant.  Anything
     * else comes from an attempt the router gave up (a paused worker
     * that woke up, a sequence of an earlier registration) and is
     * dropped: never relayed, never appended. */
    if (req == NULL || req->state != ROUTER_REQ_DECODING ||
        req->decode_uid != w->uid || !out->has_epoch ||
        out->epoch != req->epoch) {
        r->stale_msgs++;
        return;
    }
    skip = req->n_generated - (int)out->index;
    if (skip < 0) {
        /* Tokens are missing between what the client has and this
         * chunk: appending would hand the client a wrong sequence.  The
         * attempt is abandoned; the request resumes from what the client
         * has, elsewhere or here. */
        BT_LOG_WARN("ROUTER", "request %llu: token gap (have %d, got index "
                    "%u): attempt abandoned, resuming", (unsigned long long)
                    req->id, req->n_generated, out->index);
        router__send_cancel_task(r, w, req->id);
        req->failed_uid = w->uid;
        router__req_requeue(r, req, true, 0);
        return;
    }
    if (out->n_logprobs > 0 &&
        (out->n_logprobs != out->n_ids ||
         out->n_top_ids != out->n_top_logprobs ||
         out->n_top_ids % out->n_ids != 0)) {
        /* never relay numbers that cannot be matched to their ids */
        router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                         "decode worker sent malformed logprobs");
        return;
    }
    router__req_phase_deadline(r, req); /* it moves: the next token's */
    n = (int)out->n_ids - skip;
    /* The decode worker's matcher state, for a failover. */
    req->n_stop_held = 0;
    if (out->has_stop_held && out->stop_held.len < sizeof(req->stop_held)) {
        memcpy(req->stop_held, out->stop_held.data, out->stop_held.len);
        req->n_stop_held = out->stop_held.len;
    }
    if (n <= 0 && skip == 0 && out->has_text && out->text.len > 0)
        /* No ids, only text (held back until a stop id ended it). */
        router__send_chunk(r, req, req->n_generated, NULL, 0, out->text.data,
                           out->text.len);
    if (n > 0) {
        int index = req->n_generated;
        if (!router__req_append_generated(req, out->ids + skip, n)) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
                             "no memory");
            return;
        }
        /* Text of a partly duplicated chunk cannot be split: drop it. */
        if (out->n_logprobs > 0) {
            int k = (int)(out->n_top_ids / out->n_ids);
            router_chunk_lp_t lp;
            memset(&lp, 0, sizeof(lp));
            lp.logprobs = out->logprobs + skip;
            lp.top_ids = out->top_ids + (size_t)skip * k;
            lp.top_logprobs = out->top_logprobs + (size_t)skip * k;
            lp.k = k;
            router__send_chunk_lp(r, req, index, out->ids + skip, n,
                                  skip == 0 && out->has_text
                                      ? out->text.data : NULL,
                                  out->text.len, &lp);
        } else {
            router__send_chunk(r, req, index, out->ids + skip, n,
                               skip == 0 && out->has_text ? out->text.data
                                                          : NULL,
                               out->text.len);
        }
    }
    if (out->has_finish && out->finish != BATON__FINISH_REASON__FINISH_NONE)
        router__req_complete(r, req, out->finish);
}

void router__on_task_error(router_t *r, router_worker_t *w,
                           const Baton__TaskError *te)
{
    router_req_t *req = router__req_find(r, te->request_id);
    const char *why = te->message ? te->message : "worker error";

    if (req == NULL ||
        (req->prefill_uid != w->uid && req->decode_uid != w->uid) ||
        (te->has_epoch && te->epoch != 0 && te->epoch != req->epoch)) {
        r->stale_msgs++; /* about an attempt that was given up */
        return;
    }
    if (te->has_retry && te->retry && req->state == ROUTER_REQ_DECODING &&
        req->decode_uid == w->uid) {
        /* Given back (its decode worker's pool ran short past its
         * promise): the worker dropped it and its KV; the next attempt
         * recomputes the prompt and the tokens streamed so far, as after
         * a worker failure, but this is no failure.  Bounded: a pool
         * that never holds it fails it. */
        if (++req->preemptions <= ROUTER_MAX_PREEMPTIONS) {
            r->metrics.preemptions++;
            BT_LOG_DEBUG("ROUTER", "request %llu given back by %s after %d "
                         "tokens: re-queued", (unsigned long long)req->id,
                         w->name, req->n_generated);
            router__req_requeue(r, req, false, 0);
            return;
        }
        why = "preempted too often: the decode workers' KV pools are too "
              "small for this request at this load";
    }
    if (req->state == ROUTER_REQ_DECODING && req->decode_uid == w->uid)
        req->state = ROUTER_REQ_QUEUED; /* the decode already dropped it */
    router__req_fail(r, req,
                     te->has_code ? te->code : BATON__ERROR_CODE__ERROR_WORKER,
                     why);
}
