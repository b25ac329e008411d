/*
 * router_client.c - the client side of the router: GenerateRequest
 * admission (validation, the bounded queue, OVERLOADED at once over the
 * bound), Cancel, StatusRequest (workers, pair transports, counters),
 * and every reply a client gets (token chunks, Finished with usage and
 * timings, errors).  Each request's id is (client routing id, client
 * request id).
 */
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "params_proto.h"
#include "router_int.h"

// ---------------------------------------------------------------------------
// Replies and the outbox (issue 42)

/* The outbox entry of connection id[0..len), made when absent (a full
 * table is flushed first). */
static router_outbox_t *outbox_get(router_t *r, const uint8_t *id,
                                   size_t len)
{
    router_outbox_t *ob;

    for (int i = r->n_outbox - 1; i >= 0; i--) {
        ob = &r->outbox[i];
        if (ob->id_len == len && memcmp(ob->id, id, len) == 0)
            return ob;
    }
    if (r->n_outbox == ROUTER_OUTBOX_CONNS)
        router__client_flush(r);
    ob = &r->outbox[r->n_outbox++];
    memcpy(ob->id, id, len);
    ob->id_len = len;
    return ob;
}

static void outbox_send(router_t *r, router_outbox_t *ob)
{
    size_t n = ob->batch.n;

    if (n > 0 && proto_batch_send_client(&ob->batch, r->client_sock, ob->id,
                                         ob->id_len, true) != BT_OK)
        BT_LOG_WARN("NET", "cannot reach a client: %zu replies lost", n);
}

void router__client_flush(router_t *r)
{
    for (int i = 0; i < r->n_outbox; i++)
        outbox_send(r, &r->outbox[i]);
    r->n_outbox = 0;
}

void router__client_outbox_cleanup(router_t *r)
{
    for (int i = 0; i < ROUTER_OUTBOX_CONNS; i++)
        proto_batch_cleanup(&r->outbox[i].batch);
    r->n_outbox = 0;
}

/* Sends a reply of `req`: into its connection's outbox when its client
 * takes batches (GenerateRequest.accept_batch), else at once.  A reply
 * too large for a batch, or one that cannot be queued, goes at once
 * after what the outbox holds for that connection, so the order a
 * client sees is always the order replies were made. */
static void send_client(router_t *r, router_req_t *req,
                        Baton__ClientMessage *msg)
{
    router_outbox_t *ob;
    size_t len;

    if (req->batch_ok) {
        ob = outbox_get(r, req->client_id, req->client_id_len);
        msg->version = BT_PROTO_VERSION;
        len = baton__client_message__get_packed_size(msg);
        if (proto_batch_is_full(&ob->batch, len))
            outbox_send(r, ob);
        if (len <= PROTO_BATCH_MAX_BYTES &&
            proto_batch_add_client(&ob->batch, msg) == BT_OK)
            return;
        outbox_send(r, ob);
    }
    if (proto_client_send(r->client_sock, req->client_id, req->client_id_len,
                          msg) != BT_OK)
        BT_LOG_WARN("NET", "cannot reach client of request %llu",
                    (unsigned long long)req->id);
}

void router__send_chunk(router_t *r, router_req_t *req, int index,
                        const int *ids, int n, const uint8_t *text,
                        size_t text_len)
{
    router__send_chunk_lp(r, req, index, ids, n, text, text_len, NULL);
}

void router__send_chunk_lp(router_t *r, router_req_t *req, int index,
                           const int *ids, int n, const uint8_t *text,
                           size_t text_len, const router_chunk_lp_t *lp)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__TokenChunk c = BATON__TOKEN_CHUNK__INIT;

    if (lp != NULL && lp->n_prompt > 0) {
        size_t np = (size_t)lp->n_prompt - 1;
        c.n_prompt_ids = (size_t)lp->n_prompt;
        c.prompt_ids = (int32_t *)lp->prompt_ids;
        c.n_prompt_logprobs = np;
        c.prompt_logprobs = (float *)lp->prompt_logprobs;
        c.n_prompt_top_ids = np * (size_t)lp->pk;
        c.prompt_top_ids = (int32_t *)lp->prompt_top_ids;
        c.n_prompt_top_logprobs = c.n_prompt_top_ids;
        c.prompt_top_logprobs = (float *)lp->prompt_top_logprobs;
    }
    if (lp != NULL && lp->logprobs != NULL && n > 0) {
        c.n_logprobs = (size_t)n;
        c.logprobs = (float *)lp->logprobs;
        c.n_top_ids = (size_t)n * (size_t)lp->k;
        c.top_ids = (int32_t *)lp->top_ids;
        c.n_top_logprobs = c.n_top_ids;
        c.top_logprobs = (float *)lp->top_logprobs;
    }

    r->metrics.generated_tokens += (uint64_t)(n > 0 ? n : 0);
    c.has_client_request_id = 1;
    c.client_request_id = req->client_rid;
    c.has_index = 1;
    c.index = (uint32_t)index;
    c.n_ids = (size_t)n;
    c.ids = (int32_t *)ids;
    if (text != NULL && text_len > 0) {
        c.has_text = 1;
        c.text.data = (uint8_t *)text;
        c.text.len = text_len;
    }
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_CHUNK;
    msg.chunk = &c;
    send_client(r, req, &msg);
    if (req->t_first == 0) {
        req->t_first = bt_time_ns();
        bt_prom_hist_observe(&r->metrics.ttft,
                             (double)(req->t_first - req->t_arrival) * 1e-9);
    }
}

static uint64_t us_between(uint64_t a, uint64_t b)
{
    return (a != 0 && b > a) ? (b - a) / 1000 : 0;
}

void router__send_finished(router_t *r, router_req_t *req,
                           Baton__FinishReason reason)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Finished f = BATON__FINISHED__INIT;
    Baton__Usage u = BATON__USAGE__INIT;
    Baton__Timings t = BATON__TIMINGS__INIT;
    uint64_t now = bt_time_ns();

    f.has_client_request_id = 1;
    f.client_request_id = req->client_rid;
    f.has_reason = 1;
    f.reason = reason;
    u.has_prompt_tokens = 1;
    u.prompt_tokens = (uint32_t)req->n_prompt;
    u.has_completion_tokens = 1;
    u.completion_tokens = (uint32_t)req->n_generated;
    t.has_queue_us = 1;
    t.queue_us = us_between(req->t_arrival, req->t_granted);
    t.has_prefill_us = 1;
    t.prefill_us = us_between(req->t_prefill_sent, req->t_prefill_done);
    t.has_transfer_us = 1;
    t.transfer_us = req->transfer_us;
    t.has_decode_us = 1;
    t.decode_us = us_between(req->t_prefill_done, now);
    t.has_ttft_us = 1;
    t.ttft_us = us_between(req->t_arrival, req->t_first);
    t.has_total_us = 1;
    t.total_us = us_between(req->t_arrival, now);
    t.has_retries = 1;
    t.retries = (uint32_t)req->retries;
    t.has_preemptions = 1;
    t.preemptions = (uint32_t)req->preemptions;
    f.usage = &u;
    f.timings = &t;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_FINISHED;
    msg.finished = &f;
    send_client(r, req, &msg);
}

void router__send_req_error(router_t *r, router_req_t *req,
                            Baton__ErrorCode code, const char *text)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Error e = BATON__ERROR__INIT;

    e.has_client_request_id = 1;
    e.client_request_id = req->client_rid;
    e.has_code = 1;
    e.code = code;
    e.message = (char *)text;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_ERROR;
    msg.error = &e;
    send_client(r, req, &msg); /* after its chunks, when batched */
}

// ---------------------------------------------------------------------------
// Overload

#define ROUTER_RETRY_MIN_MS 1000u  /* shortest retry hint */
#define ROUTER_RETRY_MAX_MS 30000u /* longest retry hint */

/* An OVERLOADED error carrying a retry hint (Error.retry_after_ms). */
static void send_overloaded(router_t *r, const uint8_t *cid, size_t cid_len,
                            uint64_t rid, uint32_t retry_ms, const char *text)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Error e = BATON__ERROR__INIT;

    e.has_client_request_id = 1;
    e.client_request_id = rid;
    e.has_code = 1;
    e.code = BATON__ERROR_CODE__ERROR_OVERLOADED;
    e.message = (char *)text;
    e.has_retry_after_ms = 1;
    e.retry_after_ms = retry_ms;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_ERROR;
    msg.error = &e;
    proto_client_send(r->client_sock, cid, cid_len, &msg);
}

static uint32_t retry_hint_ms(uint64_t waited_ns)
{
    uint64_t ms = waited_ns / 1000000ull;

    return (uint32_t)BT_MIN(BT_MAX(ms, ROUTER_RETRY_MIN_MS),
                            ROUTER_RETRY_MAX_MS);
}

/* Ends, as OVERLOADED, every first attempt (never granted, never retried)
 * that has waited in the queue longer than max_queue_wait_ms while the
 * cluster serves: the wait a client sees stays bounded, and the workers
 * stay busy with the requests that remain.  Requests waiting for a
 * worker to exist at all, and re-queued ones (failover), are left to the
 * queue timeout.  Returns how long the oldest shed one had waited (0:
 * none).  Runs when a request arrives (never from the tick: there it
 * would also end requests waiting out a worker failover, which is not
 * overload), never inside a loop that holds a request pointer. */
static uint64_t shed_stale(router_t *r, uint64_t now)
{
    uint64_t bound = (uint64_t)r->cfg.max_queue_wait_ms * 1000000ull;
    uint64_t oldest = 0;

    if (r->cfg.max_queue_wait_ms <= 0 || r->n_queued == 0 ||
        !router__can_serve(r))
        return 0;
    for (int i = r->n_queued - 1; i >= 0; i--) {
        router_req_t *req = r->queue[i];
        uint64_t waited = now - req->t_arrival;
        char text[128];

        if (req->retries > 0 || req->t_granted != 0 || waited <= bound)
            continue;
        snprintf(text, sizeof(text), "overloaded: waited %llu ms in the "
                 "queue (bound %d ms); retry later",
                 (unsigned long long)(waited / 1000000ull),
                 r->cfg.max_queue_wait_ms);
        send_overloaded(r, req->client_id, req->client_id_len,
                        req->client_rid, retry_hint_ms(waited), text);
        r->failed++;
        r->metrics.failed[BATON__ERROR_CODE__ERROR_OVERLOADED]++;
        oldest = BT_MAX(oldest, waited);
        router__req_destroy(r, req); /* takes it out of the queue */
    }
    return oldest;
}

/* --tokenizer (issue 38): req's text prompt encoded exactly as a worker
 * encodes PrefillTask.prompt_text (tok_encode with the request's add_bos),
 * so the kv-aware pick and KvReserve see its ids on the first try.  They
 * stay the router's guess (ids_from_text) until a worker's PrefillDone
 * confirms them; a worker of another tokenizer identity gets the text.
 * Text that does not encode, or encodes past the protocol's bound, stays
 * a text prompt: the worker answers it as without --tokenizer; so does
 * text over --tokenize-max-bytes (the cost is about linear in bytes, and
 * this is the router's one thread). */
static void req_tokenize_text(router_t *r, router_req_t *req, bool add_bos)
{
    int *ids = NULL;
    int n = 0;

    if (r->tok == NULL || req->text_len > (size_t)r->cfg.tokenize_max_bytes)
        return;
    if (tok_encode(r->tok, (const char *)req->prompt_text, req->text_len,
                   add_bos, &ids, &n) != BT_OK) {
        BT_LOG_DEBUG("ROUTER", "text prompt not tokenized here (%s): the "
                     "worker tokenizes it", bt_error_last());
        return;
    }
    if (n <= 0 || (size_t)n > PROTO_MAX_PROMPT_TOKENS) {
        bt_free(ids);
        return;
    }
    req->prompt_ids = ids;
    req->n_prompt = n;
    req->ids_from_text = true;
}

static void on_generate(router_t *r, const uint8_t *cid, size_t cid_len,
                        const Baton__GenerateRequest *g)
{
    uint64_t now = bt_time_ns(), shed;
    router_req_t *req;
    params_t params; /* checked only: req keeps the wire's fields */
    char err[512];
    uint64_t rid = g->client_request_id;
    uint32_t max_ctx, vocab;
    bt_status_t status;

#define REJECT(_code, ...)                                                  \
    do {                                                                    \
        proto_client_send_error(r->client_sock, cid, cid_len, rid, _code,   \
                                __VA_ARGS__);                               \
        r->failed++;                                                        \
        r->metrics.rejected[(_code) % ROUTER_METRICS_CODES]++;              \
        return;                                                             \
    } while (0)

    if (r->draining || r->stop)
        REJECT(BATON__ERROR_CODE__ERROR_DRAINING, "router is draining");
    status = proto_generate_validate(g, err, sizeof(err));
    if (status != BT_OK)
        REJECT(BATON__ERROR_CODE__ERROR_INVALID, "%s", err);
    /* The parameter contract, checked here as everywhere (params.h):
     * refused now, not by the worker after the request queued. */
    status = params_from_generate(g, &params, err, sizeof(err), NULL);
    if (status != BT_OK)
        REJECT(BATON__ERROR_CODE__ERROR_INVALID, "%s", err);
    max_ctx = router__cluster_max_context(r);
    if (max_ctx > 0 && g->n_prompt_ids >= max_ctx)
        REJECT(BATON__ERROR_CODE__ERROR_TOO_LONG,
               "prompt of %zu tokens does not fit the context (%u)",
               g->n_prompt_ids, max_ctx);
    vocab = router__cluster_min_vocab(r);
    for (size_t i = 0; vocab > 0 && i < g->n_prompt_ids; i++)
        if ((uint32_t)g->prompt_ids[i] >= vocab)
            REJECT(BATON__ERROR_CODE__ERROR_INVALID,
                   "prompt id %d at %zu is outside the vocabulary (%u)",
                   g->prompt_ids[i], i, vocab);
    {
        /* Issue 37: a class no registered worker serves fails now */
        router_pool_t pools[ROUTER_MAX_POOLS];
        int n_pools = router__pools(r, pools);

        if (router__class_unservable(r, pools, n_pools,
                                     proto_precision_find(g->precision), err,
                                     sizeof(err)))
            REJECT(BATON__ERROR_CODE__ERROR_NO_WORKERS, "%s", err);
    }
    if (router__req_find_client(r, cid, cid_len, rid) != NULL)
        REJECT(BATON__ERROR_CODE__ERROR_DUPLICATE,
               "request id %llu already in flight", (unsigned long long)rid);
    if (r->n_queued >= r->cfg.max_queue ||
        (r->cfg.max_inflight > 0 && r->n_live >= r->cfg.max_inflight)) {
        send_overloaded(r, cid, cid_len, rid, ROUTER_RETRY_MIN_MS,
                        "overloaded: queue full; retry later");
        r->failed++;
        r->metrics.rejected[BATON__ERROR_CODE__ERROR_OVERLOADED]++;
        return;
    }
    /* Requests queued past the wait bound: they go, and this one would
     * wait as long, so it is refused at once (the client hears within
     * the bound, not after minutes in the queue). */
    shed = shed_stale(r, now);
    if (shed > 0) {
        send_overloaded(r, cid, cid_len, rid, retry_hint_ms(shed),
                        "overloaded: the queue wait is over its bound; "
                        "retry later");
        r->failed++;
        r->metrics.rejected[BATON__ERROR_CODE__ERROR_OVERLOADED]++;
        return;
    }

    if (r->n_live + 1 > r->queue_cap) {
        /* The queue array can hold every live request (retries go back
         * into it), so it grows with them. */
        int cap = BT_MAX(r->queue_cap * 2, r->n_live + 64);
        router_req_t **q = bt_realloc(r->queue, (size_t)cap * sizeof(*q),
                                      "router_queue");
        if (q == NULL)
            REJECT(BATON__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        r->queue = q;
        r->queue_cap = cap;
    }
    req = bt_calloc(1, sizeof(*req), "router_req");
    if (req == NULL)
        REJECT(BATON__ERROR_CODE__ERROR_INTERNAL, "out of memory");
    req->id = ++r->next_req_id;
    memcpy(req->client_id, cid, cid_len);
    req->client_id_len = cid_len;
    req->client_rid = rid;
    if (g->n_prompt_ids > 0) {
        req->prompt_ids = bt_malloc(g->n_prompt_ids * sizeof(int),
                                    "router_prompt");
        if (req->prompt_ids != NULL)
            memcpy(req->prompt_ids, g->prompt_ids,
                   g->n_prompt_ids * sizeof(int));
        req->n_prompt = (int)g->n_prompt_ids;
    } else {
        req->prompt_text = bt_malloc(g->prompt.len, "router_prompt");
        if (req->prompt_text != NULL)
            memcpy(req->prompt_text, g->prompt.data, g->prompt.len);
        req->text_len = g->prompt.len;
        if (req->prompt_text != NULL)
            req_tokenize_text(r, req, g->add_bos);
    }
    if (g->n_stop_ids > 0) {
        req->stop_ids = bt_malloc(g->n_stop_ids * sizeof(int), "router_stop");
        if (req->stop_ids != NULL)
            memcpy(req->stop_ids, g->stop_ids, g->n_stop_ids * sizeof(int));
        req->n_stop = (int)g->n_stop_ids;
    }
    /* shape checked by proto_generate_validate; compiled by the workers */
    if (g->grammar != NULL && g->grammar[0] != '\0')
        req->grammar = bt_strdup(g->grammar, "router_grammar");
    if ((req->prompt_ids == NULL && req->prompt_text == NULL) ||
        (req->n_stop > 0 && req->stop_ids == NULL) ||
        (g->grammar != NULL && g->grammar[0] != '\0' &&
         req->grammar == NULL)) {
        bt_free(req->prompt_ids);
        bt_free(req->prompt_text);
        bt_free(req->stop_ids);
        bt_free(req->grammar);
        bt_free(req);
        REJECT(BATON__ERROR_CODE__ERROR_INTERNAL, "out of memory");
    }
    req->add_bos = g->add_bos;
    if (g->sampling != NULL) {
        req->sampling = *g->sampling;
    } else {
        Baton__SamplingParams sp = BATON__SAMPLING_PARAMS__INIT;
        req->sampling = sp;
    }
    req->sampling.base.unknown_fields = NULL;
    req->sampling.base.n_unknown_fields = 0;
    req->max_tokens = g->max_tokens > 0 ? g->max_tokens : ROUTER_MAX_TOKENS;
    if (g->n_stop_strings > 0) {
        req->stop_strings = bt_calloc(g->n_stop_strings,
                                      sizeof(*req->stop_strings),
                                      "router_stop");
        for (size_t i = 0; req->stop_strings && i < g->n_stop_strings; i++) {
            ProtobufCBinaryData *d = &req->stop_strings[i];
            d->data = bt_malloc(g->stop_strings[i].len, "router_stop");
            if (d->data == NULL)
                break;
            memcpy(d->data, g->stop_strings[i].data, g->stop_strings[i].len);
            d->len = g->stop_strings[i].len;
            req->n_stop_strings++;
        }
    }
    req->ignore_eos = g->ignore_eos;
    req->want_text = g->want_text;
    req->precision = proto_precision_find(g->precision); /* validated */
    req->batch_ok = g->accept_batch;

    req->priority = g->priority;
    req->tenant = router__tenant_slot(r, g->tenant);
    req->weight = g->has_tenant_weight ? g->tenant_weight : 1;
    if (g->has_cache_salt && g->cache_salt.len > 0) {
        /* validated: at most PROTO_MAX_CACHE_SALT; an empty one has no
         * data pointer, and memcpy from NULL is undefined even for 0 */
        memcpy(req->cache_salt, g->cache_salt.data, g->cache_salt.len);
        req->cache_salt_len = g->cache_salt.len;
    }
    req->t_arrival = bt_time_ns();
    if (g->deadline_ms > 0)
        req->deadline_ns = req->t_arrival + (uint64_t)g->deadline_ms * 1000000ull;
    router__req_admit(r, req);
    r->metrics.admitted++;
#undef REJECT
}

static void on_cancel(router_t *r, const uint8_t *cid, size_t cid_len,
                      const Baton__Cancel *c)
{
    router_req_t *req =
        router__req_find_client(r, cid, cid_len, c->client_request_id);

    if (req == NULL)
        return; /* already finished: nothing to do */
    BT_LOG_DEBUG("ROUTER", "request %llu cancelled by the client",
                 (unsigned long long)req->id);
    router__req_release_workers(r, req);
    router__send_finished(r, req, BATON__FINISH_REASON__FINISH_CANCELLED);
    r->completed++;
    r->metrics.finished[BATON__FINISH_REASON__FINISH_CANCELLED]++;
    router__req_destroy(r, req);
}

static void on_status_request(router_t *r, const uint8_t *cid, size_t cid_len,
                              const Baton__StatusRequest *s)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__ClusterStatus cs = BATON__CLUSTER_STATUS__INIT;
    Baton__WorkerStatus ws[ROUTER_MAX_WORKERS];
    Baton__WorkerStatus *wp[ROUTER_MAX_WORKERS];
    char gpu[ROUTER_MAX_WORKERS][64];
    Baton__PairTransport *pairs = NULL, **pp = NULL;
    int n = 0, n_pairs = 0;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        Baton__WorkerStatus init = BATON__WORKER_STATUS__INIT;
        if (!w->used)
            continue;
        ws[n] = init;
        ws[n].name = w->name;
        ws[n].has_role = 1;
        ws[n].role = (uint32_t)w->role;
        ws[n].has_free_kv_blocks = 1;
        ws[n].free_kv_blocks = w->hb_free_kv;
        ws[n].has_total_kv_blocks = 1;
        ws[n].total_kv_blocks = w->total_kv;
        ws[n].has_running = 1;
        ws[n].running = w->assigned;
        ws[n].has_outstanding_tokens = 1;
        ws[n].outstanding_tokens = w->outstanding;
        ws[n].has_draining = 1;
        ws[n].draining = w->draining;
        ws[n].has_served = 1;
        ws[n].served = w->served;
        ws[n].has_can_prefill = 1;
        ws[n].can_prefill = w->can_prefill;
        ws[n].has_prefix_cached_blocks = w->has_prefix;
        ws[n].prefix_cached_blocks = w->prefix_cached;
        ws[n].has_prefix_hit_rate = w->has_prefix;
        ws[n].prefix_hit_rate = w->prefix_hit_rate;
        ws[n].has_prefix_host_cached_blocks = w->has_prefix_host;
        ws[n].prefix_host_cached_blocks = w->prefix_host_cached;
        ws[n].host_id = w->host_id;
        ws[n].precision = w->precision;
        ws[n].kv_dtype = w->kv_dtype;
        snprintf(gpu[n], sizeof(gpu[n]), "%s", "");
        if (w->has_gpu)
            snprintf(gpu[n], sizeof(gpu[n]), "cuda:%d %s%s", w->gpu_device,
                     w->gpu_bus, w->gpu_ipc ? " ipc" : "");
        ws[n].gpu = gpu[n];
        wp[n] = &ws[n];
        n++;
    }
    /* The transport of every usable prefill/decode pair (and of every
     * aggregated worker with itself). */
    {
        int np = 0, nd = 0, cap;
        for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
            const router_worker_t *w = &r->workers[i];
            np += w->used && (w->role == BATON__ROLE__ROLE_PREFILL ||
                              w->can_prefill);
            nd += w->used && w->role == BATON__ROLE__ROLE_DECODE;
        }
        cap = BT_MIN(np * nd, 1024);
        if (cap > 0) {
            pairs = bt_calloc((size_t)cap, sizeof(*pairs), "router_status");
            pp = bt_calloc((size_t)cap, sizeof(*pp), "router_status");
        }
        for (int i = 0; pairs && pp && i < ROUTER_MAX_WORKERS; i++) {
            router_worker_t *p = &r->workers[i];
            if (!p->used || !(p->role == BATON__ROLE__ROLE_PREFILL ||
                              p->can_prefill))
                continue;
            for (int k = 0; k < ROUTER_MAX_WORKERS && n_pairs < cap; k++) {
                router_worker_t *d = &r->workers[k];
                Baton__KvTransport t;
                if (!d->used || d->role != BATON__ROLE__ROLE_DECODE)
                    continue;
                if (p->role != BATON__ROLE__ROLE_PREFILL && p != d)
                    continue; /* aggregated workers prefill for themselves */
                if (!router__pair_matches(p, d))
                    continue; /* another pool: never paired */
                t = router__choose_transport(p, d, r->kv_mode);
                baton__pair_transport__init(&pairs[n_pairs]);
                pairs[n_pairs].prefill = p->name;
                pairs[n_pairs].decode = d->name;
                pairs[n_pairs].has_transport = 1;
                pairs[n_pairs].transport = (uint32_t)t;
                pairs[n_pairs].name = (char *)router__transport_name(t);
                if (t == BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC &&
                    p->has_gpu && d->has_gpu &&
                    strcmp(p->gpu_bus, d->gpu_bus) != 0)
                    pairs[n_pairs].name = (char *)"cuda-ipc(p2p)"; /* NVLink */
                pp[n_pairs] = &pairs[n_pairs];
                n_pairs++;
            }
        }
    }
    cs.n_transports = (size_t)n_pairs;
    cs.transports = pp;
    cs.kv_transport_mode = (char *)r->cfg.kv_transport;
    cs.has_client_request_id = 1;
    cs.client_request_id = s->client_request_id;
    cs.n_workers = (size_t)n;
    cs.workers = wp;
    cs.has_queued = 1;
    cs.queued = (uint32_t)r->n_queued;
    cs.has_in_flight = 1;
    cs.in_flight = (uint32_t)(r->n_live - r->n_queued);
    cs.has_completed = 1;
    cs.completed = r->completed;
    cs.has_failed = 1;
    cs.failed = r->failed;
    cs.has_max_context = 1;
    cs.max_context = router__cluster_max_context(r);
    cs.security = r->curve ? "curve" : r->cfg.insecure ? "insecure"
                                                       : "loopback";
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS;
    msg.status = &cs;
    proto_client_send(r->client_sock, cid, cid_len, &msg);
    bt_free(pairs);
    bt_free(pp);
}

void router__handle_client(router_t *r, bt_zmq_msg_t *zm)
{
    const uint8_t *cid;
    size_t cid_len;
    Baton__ClientMessage *msg = NULL;
    char err[256];
    bt_status_t status;

    if (zm->n_frames < 2 || zm->n_frames > 2 || zm->n_dropped != 0) {
        if (zm->n_frames >= 1)
            proto_client_send_error(r->client_sock,
                                    bt_zmq_frame_data(zm, 0),
                                    bt_zmq_frame_size(zm, 0), 0,
                                    BATON__ERROR_CODE__ERROR_MALFORMED,
                                    "expected one frame per message");
        return;
    }
    cid = bt_zmq_frame_data(zm, 0);
    cid_len = bt_zmq_frame_size(zm, 0);
    if (cid_len > sizeof(((router_req_t *)0)->client_id))
        return;
    status = proto_client_decode(bt_zmq_frame_data(zm, 1),
                                 bt_zmq_frame_size(zm, 1), &msg, err,
                                 sizeof(err));
    if (status == BT_ERR_UNSUPPORTED) {
        uint64_t rid = msg->body_case == BATON__CLIENT_MESSAGE__BODY_GENERATE
                           ? msg->generate->client_request_id
                           : 0;
        proto_client_send_error(r->client_sock, cid, cid_len, rid,
                                BATON__ERROR_CODE__ERROR_VERSION, "%s", err);
        proto_client_free(&msg);
        return;
    }
    if (status != BT_OK) {
        BT_LOG_DEBUG("NET", "client message rejected: %s", err);
        proto_client_send_error(r->client_sock, cid, cid_len, 0,
                                BATON__ERROR_CODE__ERROR_MALFORMED, "%s", err);
        return;
    }
    switch (msg->body_case) {
    case BATON__CLIENT_MESSAGE__BODY_GENERATE:
        on_generate(r, cid, cid_len, msg->generate);
        break;
    case BATON__CLIENT_MESSAGE__BODY_CANCEL:
        on_cancel(r, cid, cid_len, msg->cancel);
        break;
    case BATON__CLIENT_MESSAGE__BODY_STATUS_REQUEST:
        on_status_request(r, cid, cid_len, msg->status_request);
        break;
    default:
        proto_client_send_error(r->client_sock, cid, cid_len, 0,
                                BATON__ERROR_CODE__ERROR_MALFORMED,
                                "unexpected message from a client");
        break;
    }
    proto_client_free(&msg);
}
