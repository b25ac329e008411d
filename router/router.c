/*
 * router.c - the router's event loop, registry and request state machine
 * (see router.h).  One thread; every socket is polled with zmq_poll and a
 * 20 ms tick drives liveness checks, deadlines and dispatch retries.
 */
#include "router.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "router_int.h"
#include "stop.h"

_Static_assert(ROUTER_STOP_HELD_MAX >= STOP_MAX_STRING_LEN,
               "the router keeps any held-back stop text");

#define ROUTER_TICK_MS 20
#define ROUTER_MAX_BURST 4096 /* messages handled per socket per wakeup */

void router_config_init(router_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "tcp://127.0.0.1:5555";
    cfg->control = "tcp://127.0.0.1:5556";
    cfg->policy = "least-loaded";
    cfg->heartbeat_ms = 250;
    cfg->heartbeat_miss = 4;
    cfg->max_queue = 1024;
    cfg->queue_timeout_ms = 30000;
    cfg->drain_timeout_ms = 30000;
    cfg->max_retries = 3;
    cfg->max_inflight = 0;
    cfg->kv_transport = "auto";
    cfg->aggregate = "fallback";
}

// ---------------------------------------------------------------------------
// Registry

static router_worker_t *worker_by_name(router_t *r, const void *name,
                                       size_t len)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        if (w->used && strlen(w->name) == len && memcmp(w->name, name, len) == 0)
            return w;
    }
    return NULL;
}

static router_worker_t *worker_by_uid(router_t *r, uint64_t uid)
{
    if (uid == 0)
        return NULL;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used && r->workers[i].uid == uid)
            return &r->workers[i];
    return NULL;
}

static void send_control(router_t *r, const router_worker_t *w,
                         Baton__ControlMessage *msg)
{
    if (w == NULL)
        return;
    if (proto_control_send(r->control_sock, w->name, strlen(w->name), msg) !=
        BT_OK)
        BT_LOG_WARN("NET", "cannot send %s to worker %s",
                    proto_control_body_name(msg->body_case), w->name);
}

// ---------------------------------------------------------------------------
// Requests: lists, hashes, queue

static size_t client_bucket(const uint8_t *id, size_t len, uint64_t rid)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ id[i]) * 1099511628211ull;
    h ^= rid * 0x9e3779b97f4a7c15ull;
    return (size_t)(h % ROUTER_HASH_BUCKETS);
}

static router_req_t *req_find(router_t *r, uint64_t id)
{
    for (router_req_t *q = r->by_id[id % ROUTER_HASH_BUCKETS]; q; q = q->id_next)
        if (q->id == id)
            return q;
    return NULL;
}

static router_req_t *req_find_client(router_t *r, const uint8_t *cid,
                                     size_t cid_len, uint64_t rid)
{
    size_t b = client_bucket(cid, cid_len, rid);
    for (router_req_t *q = r->by_client[b]; q; q = q->cl_next)
        if (q->client_rid == rid && q->client_id_len == cid_len &&
            memcmp(q->client_id, cid, cid_len) == 0)
            return q;
    return NULL;
}

static void queue_remove(router_t *r, router_req_t *req)
{
    if (!req->queued)
        return;
    for (int i = 0; i < r->n_queued; i++) {
        if (r->queue[i] == req) {
            memmove(&r->queue[i], &r->queue[i + 1],
                    (size_t)(r->n_queued - i - 1) * sizeof(r->queue[0]));
            r->n_queued--;
            break;
        }
    }
    req->queued = false;
}

/* Inserts by priority (higher first); `front` puts it ahead of requests
 * of equal priority (retries keep their place).  The array holds every
 * live request, so it never overflows. */
static void queue_insert(router_t *r, router_req_t *req, bool front)
{
    int at = r->n_queued;

    BT_ASSERT(!req->queued && r->n_queued < r->n_live + 1);
    while (at > 0) {
        router_req_t *p = r->queue[at - 1];
        if (p->priority > req->priority ||
            (!front && p->priority == req->priority))
            break;
        at--;
    }
    memmove(&r->queue[at + 1], &r->queue[at],
            (size_t)(r->n_queued - at) * sizeof(r->queue[0]));
    r->queue[at] = req;
    r->n_queued++;
    req->queued = true;
}

static void req_unassign_prefill(router_t *r, router_req_t *req)
{
    router_worker_t *p = worker_by_uid(r, req->prefill_uid);

    if (p != NULL) {
        p->outstanding -= BT_MIN(p->outstanding, req->task_tokens);
        if (p->assigned > 0)
            p->assigned--;
    }
    req->prefill_uid = 0;
}

static void req_unassign_decode(router_t *r, router_req_t *req)
{
    router_worker_t *d = worker_by_uid(r, req->decode_uid);

    if (d != NULL) {
        if (req->state == ROUTER_REQ_RESERVING)
            d->pending_reserve -= req->reserved_blocks;
        if (d->assigned > 0)
            d->assigned--;
    }
    req->decode_uid = 0;
    req->reserved_blocks = 0;
}

static void req_destroy(router_t *r, router_req_t *req)
{
    router_req_t **pp;

    queue_remove(r, req);
    req_unassign_prefill(r, req);
    req_unassign_decode(r, req);
    for (pp = &r->by_id[req->id % ROUTER_HASH_BUCKETS]; *pp; pp = &(*pp)->id_next)
        if (*pp == req) {
            *pp = req->id_next;
            break;
        }
    for (pp = &r->by_client[client_bucket(req->client_id, req->client_id_len,
                                          req->client_rid)];
         *pp; pp = &(*pp)->cl_next)
        if (*pp == req) {
            *pp = req->cl_next;
            break;
        }
    if (req->all_prev)
        req->all_prev->all_next = req->all_next;
    else
        r->all_head = req->all_next;
    if (req->all_next)
        req->all_next->all_prev = req->all_prev;
    r->n_live--;
    bt_free(req->prompt_ids);
    bt_free(req->prompt_text);
    bt_free(req->stop_ids);
    for (int i = 0; i < req->n_stop_strings; i++)
        bt_free(req->stop_strings[i].data);
    bt_free(req->stop_strings);
    bt_free(req->generated);
    bt_free(req);
}

// ---------------------------------------------------------------------------
// Replies to clients

static void send_client(router_t *r, router_req_t *req,
                        Baton__ClientMessage *msg)
{
    if (proto_client_send(r->client_sock, req->client_id, req->client_id_len,
                          msg) != BT_OK)
        BT_LOG_WARN("NET", "cannot reach client of request %llu",
                    (unsigned long long)req->id);
}

static void send_chunk(router_t *r, router_req_t *req, int index,
                       const int *ids, int n, const uint8_t *text,
                       size_t text_len)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__TokenChunk c = BATON__TOKEN_CHUNK__INIT;

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
    if (req->t_first == 0)
        req->t_first = bt_time_ns();
}

static uint64_t us_between(uint64_t a, uint64_t b)
{
    return (a != 0 && b > a) ? (b - a) / 1000 : 0;
}

static void send_finished(router_t *r, router_req_t *req,
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
    f.usage = &u;
    f.timings = &t;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_FINISHED;
    msg.finished = &f;
    send_client(r, req, &msg);
}

static void send_req_error(router_t *r, router_req_t *req,
                           Baton__ErrorCode code, const char *text)
{
    proto_client_send_error(r->client_sock, req->client_id, req->client_id_len,
                            req->client_rid, code, "%s", text);
}

// ---------------------------------------------------------------------------
// Talking to workers about one request

static void send_kv_release(router_t *r, router_worker_t *d, uint64_t id,
                            uint64_t epoch)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvRelease rel = BATON__KV_RELEASE__INIT;

    rel.has_request_id = 1;
    rel.request_id = id;
    rel.has_epoch = 1;
    rel.epoch = epoch;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_RELEASE;
    msg.kv_release = &rel;
    send_control(r, d, &msg);
}

static void send_cancel_task(router_t *r, router_worker_t *w, uint64_t id)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__CancelTask c = BATON__CANCEL_TASK__INIT;

    c.has_request_id = 1;
    c.request_id = id;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_CANCEL_TASK;
    msg.cancel_task = &c;
    send_control(r, w, &msg);
}

/* Tells the workers holding a request to forget it, according to its
 * state.  A grant still in flight is released when it arrives (the
 * request is gone by then). */
static void req_release_workers(router_t *r, router_req_t *req)
{
    router_worker_t *p = worker_by_uid(r, req->prefill_uid);
    router_worker_t *d = worker_by_uid(r, req->decode_uid);

    switch (req->state) {
    case ROUTER_REQ_QUEUED:
    case ROUTER_REQ_RESERVING:
        break;
    case ROUTER_REQ_PREFILLING:
        if (p != NULL)
            send_cancel_task(r, p, req->id);
        if (d != NULL)
            send_kv_release(r, d, req->id, req->epoch);
        break;
    case ROUTER_REQ_DECODING:
        if (d != NULL)
            send_cancel_task(r, d, req->id);
        break;
    }
}

/* Ends a request with an error reply, releasing what workers hold. */
static void req_fail(router_t *r, router_req_t *req, Baton__ErrorCode code,
                     const char *text)
{
    BT_LOG_INFO("ROUTER", "request %llu failed: %s",
                (unsigned long long)req->id, text);
    req_release_workers(r, req);
    send_req_error(r, req, code, text);
    r->failed++;
    req_destroy(r, req);
}

/* Puts a request back in the queue after a worker failure or a refused
 * reservation.  `failure` counts against max_retries. */
static void req_requeue(router_t *r, router_req_t *req, bool failure,
                        uint64_t delay_ns)
{
    req_unassign_prefill(r, req);
    req_unassign_decode(r, req);
    req->state = ROUTER_REQ_QUEUED;
    req->epoch = 0;
    if (failure) {
        req->retries++;
        if (req->retries > r->cfg.max_retries) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                     "worker failures exceeded the retry limit");
            return;
        }
        BT_LOG_INFO("ROUTER", "request %llu re-queued after worker failure "
                    "(%d tokens streamed, retry %d)",
                    (unsigned long long)req->id, req->n_generated,
                    req->retries);
    }
    req->retry_at_ns = bt_time_ns() + delay_ns;
    queue_insert(r, req, true);
}

static bool req_append_generated(router_req_t *req, const int *ids, int n)
{
    if (req->n_generated + n > req->cap_generated) {
        int cap = BT_MAX(req->cap_generated * 2, req->n_generated + n + 16);
        int *g = bt_realloc(req->generated, (size_t)cap * sizeof(int),
                            "router_generated");
        if (g == NULL)
            return false;
        req->generated = g;
        req->cap_generated = cap;
    }
    memcpy(req->generated + req->n_generated, ids, (size_t)n * sizeof(int));
    req->n_generated += n;
    return true;
}

/* Tokens the request's next prefill covers: prompt plus what was already
 * streamed (resume), or an upper bound for a text prompt not yet
 * tokenized (every byte at most one token, plus BOS and the dummy
 * prefix). */
static int req_prefill_tokens(const router_req_t *req)
{
    if (req->prompt_ids != NULL)
        return req->n_prompt + req->n_generated;
    return (int)BT_MIN(req->text_len + 2, (size_t)PROTO_MAX_PROMPT_TOKENS);
}

static void dispatch(router_t *r)
{
    uint64_t now = bt_time_ns();

    for (int i = 0; i < r->n_queued;) {
        router_req_t *req = r->queue[i];
        router_worker_t *p, *d;
        Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
        Baton__KvReserve res = BATON__KV_RESERVE__INIT;
        int n_tokens, blocks;

        if (req->retry_at_ns > now) {
            i++;
            continue;
        }
        n_tokens = req_prefill_tokens(req);
        p = NULL;
        d = NULL;
        if (r->aggregate == 2) /* always: aggregated workers first */
            d = r->policy->pick_decode(r, req, req->prompt_ids ? n_tokens : 1,
                                       true);
        if (d != NULL) {
            p = d;
        } else {
            p = r->policy->pick_prefill(r, req);
            if (p == NULL && r->aggregate >= 1) {
                /* No prefill worker: a --role both decode worker
                 * prefills its own request (aggregated mode). */
                d = r->policy->pick_decode(
                    r, req, req->prompt_ids ? n_tokens : 1, true);
                p = d;
            }
            if (p == NULL)
                return;
            if (d == NULL)
                d = r->policy->pick_decode(
                    r, req, req->prompt_ids ? n_tokens : 1, false);
        }
        if (d == NULL)
            return; /* head-of-line: keep priority order */
        if (req->prompt_ids == NULL && d->max_context > 0)
            n_tokens = BT_MIN(n_tokens, (int)d->max_context);
        blocks = router__blocks_needed(d, n_tokens);
        queue_remove(r, req); /* shifts queue[i+1..] down */
        req->prefill_uid = p->uid;
        req->decode_uid = d->uid;
        req->task_tokens = (uint64_t)n_tokens;
        req->reserved_blocks = blocks;
        req->state = ROUTER_REQ_RESERVING;
        p->outstanding += (uint64_t)n_tokens;
        p->assigned++;
        p->served++;
        d->assigned++;
        d->served++;
        d->pending_reserve += blocks;
        d->est_free_kv -= blocks;
        res.has_request_id = 1;
        res.request_id = req->id;
        res.has_n_tokens = 1;
        res.n_tokens = (uint32_t)n_tokens;
        res.has_max_total_tokens = 1;
        res.max_total_tokens = (uint32_t)BT_MIN(
            (int64_t)n_tokens + req->max_tokens - req->n_generated,
            (int64_t)UINT32_MAX);
        /* Staged UCX: the decode worker reserves receive-area blocks
         * with the device blocks (only then: they are scarce). */
        if (router__choose_transport(p, d, r->kv_mode) ==
            BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE) {
            res.has_kv_stage = 1;
            res.kv_stage = 1;
        }
        msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_RESERVE;
        msg.kv_reserve = &res;
        send_control(r, d, &msg);
        BT_LOG_DEBUG("ROUTER", "request %llu -> prefill %s, decode %s (%d "
                     "tokens, %d blocks)", (unsigned long long)req->id,
                     p->name, d->name, n_tokens, blocks);
    }
}

// ---------------------------------------------------------------------------
// Worker failure

/* Sends prefill worker `to` (or every prefill worker when NULL) the UCX
 * pools of all registered decode workers, so it connects ahead of the
 * first hand-off and drops endpoints of decode workers that are gone. */
static void send_kv_peers(router_t *r, const router_worker_t *to)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvPeers kp = BATON__KV_PEERS__INIT;
    Baton__UcxDescriptor descs[ROUTER_MAX_WORKERS];
    Baton__UcxDescriptor *ptrs[ROUTER_MAX_WORKERS];
    ProtobufCBinaryData cipc[ROUTER_MAX_WORKERS];
    ProtobufCBinaryData stage[ROUTER_MAX_WORKERS];
    size_t n = 0, n_cipc = 0, n_stage = 0;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *d = &r->workers[i];
        if (!d->used || d->role != BATON__ROLE__ROLE_DECODE)
            continue;
        if (d->cipc_desc != NULL) {
            cipc[n_cipc].data = d->cipc_desc;
            cipc[n_cipc].len = d->cipc_desc_len;
            n_cipc++;
        }
        if (d->stage_desc != NULL) {
            stage[n_stage].data = d->stage_desc;
            stage[n_stage].len = d->stage_desc_len;
            n_stage++;
        }
        if (d->ucx_desc == NULL)
            continue;
        baton__ucx_descriptor__init(&descs[n]);
        descs[n].has_packed = 1;
        descs[n].packed.data = d->ucx_desc;
        descs[n].packed.len = d->ucx_desc_len;
        ptrs[n] = &descs[n];
        n++;
    }
    kp.n_pools = n;
    kp.pools = ptrs;
    kp.n_cuda_ipc = n_cipc;
    kp.cuda_ipc = cipc;
    kp.n_kv_stage = n_stage;
    kp.kv_stage = stage;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_PEERS;
    msg.kv_peers = &kp;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *p = &r->workers[i];
        if (p->used && p->role == BATON__ROLE__ROLE_PREFILL &&
            (to == NULL || to == p))
            send_control(r, p, &msg);
    }
}

/* Forgets a worker's registration (the slot becomes free). */
static void worker_clear(router_worker_t *w)
{
    bt_free(w->ucx_desc);
    bt_free(w->cipc_desc);
    bt_free(w->stage_desc);
    memset(w, 0, sizeof(*w));
}

/* Removes a worker that died, left or went silent; its requests are
 * re-queued (prefill again elsewhere; decode: prompt + streamed tokens
 * on another decode worker). */
static void worker_drop(router_t *r, router_worker_t *w, const char *why)
{
    router_req_t *req, *next;
    bool had_pool;

    BT_LOG_WARN("ROUTER", "worker %s (%s) dropped: %s", w->name,
                w->role == BATON__ROLE__ROLE_PREFILL ? "prefill" : "decode",
                why);
    for (req = r->all_head; req != NULL; req = next) {
        next = req->all_next;
        /* Decode first: an aggregated worker is both of a request's. */
        if (req->decode_uid == w->uid) {
            if (req->state == ROUTER_REQ_PREFILLING &&
                req->prefill_uid != w->uid)
                send_cancel_task(r, worker_by_uid(r, req->prefill_uid),
                                 req->id);
            req_requeue(r, req, true, 0);
        } else if (req->prefill_uid == w->uid) {
            if (req->state == ROUTER_REQ_RESERVING) {
                req_unassign_prefill(r, req); /* picked again at grant */
            } else if (req->state == ROUTER_REQ_PREFILLING) {
                send_kv_release(r, worker_by_uid(r, req->decode_uid),
                                req->id, req->epoch);
                req_requeue(r, req, true, 0);
            }
        }
    }
    had_pool = w->ucx_desc != NULL || w->cipc_desc != NULL ||
               w->stage_desc != NULL;
    worker_clear(w);
    if (had_pool)
        send_kv_peers(r, NULL);
}

static void check_liveness(router_t *r, uint64_t now)
{
    uint64_t limit = (uint64_t)r->cfg.heartbeat_ms * 1000000ull *
                     (uint64_t)r->cfg.heartbeat_miss;

    uint64_t quiet = (uint64_t)r->cfg.heartbeat_ms * 1000000ull * 3;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        if (!w->used)
            continue;
        w->silent = now - w->last_seen_ns > quiet;
        if (now - w->last_seen_ns > limit)
            worker_drop(r, w, "missed heartbeats");
    }
}

static bool have_role(router_t *r, Baton__Role role)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (router__worker_is_usable(&r->workers[i]) &&
            r->workers[i].role == role)
            return true;
    return false;
}

static bool have_aggregated(router_t *r)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (router__worker_is_usable(&r->workers[i]) &&
            r->workers[i].can_prefill)
            return true;
    return false;
}

static void check_deadlines(router_t *r, uint64_t now)
{
    router_req_t *req, *next;
    uint64_t qt = (uint64_t)r->cfg.queue_timeout_ms * 1000000ull;

    for (req = r->all_head; req != NULL; req = next) {
        next = req->all_next;
        if (req->deadline_ns != 0 && now > req->deadline_ns) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_TIMEOUT,
                     "deadline exceeded");
        } else if (req->state == ROUTER_REQ_QUEUED &&
                   now - req->t_arrival > qt) {
            bool workers = (have_role(r, BATON__ROLE__ROLE_PREFILL) ||
                            have_aggregated(r)) &&
                           have_role(r, BATON__ROLE__ROLE_DECODE);
            req_fail(r, req,
                     workers ? BATON__ERROR_CODE__ERROR_TIMEOUT
                             : BATON__ERROR_CODE__ERROR_NO_WORKERS,
                     workers ? "no capacity within the queue timeout"
                             : "no prefill/decode workers registered");
        }
    }
}

// ---------------------------------------------------------------------------
// Control plane messages

static void on_register(router_t *r, const uint8_t *id, size_t id_len,
                        const Baton__Register *reg)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;
    router_worker_t *w;

    if (id_len == 0 || id_len >= ROUTER_NAME_MAX ||
        (reg->role != BATON__ROLE__ROLE_PREFILL &&
         reg->role != BATON__ROLE__ROLE_DECODE)) {
        BT_LOG_WARN("ROUTER", "bad registration dropped (role %d, id %zu "
                    "bytes)", (int)reg->role, id_len);
        return;
    }
    w = worker_by_name(r, id, id_len);
    if (w != NULL && w->role != reg->role)
        worker_drop(r, w, "re-registered with another role");
    w = worker_by_name(r, id, id_len);
    if (w == NULL) {
        for (int i = 0; i < ROUTER_MAX_WORKERS && w == NULL; i++)
            if (!r->workers[i].used)
                w = &r->workers[i];
        if (w == NULL) {
            BT_LOG_WARN("ROUTER", "registry full; worker refused");
            return;
        }
        worker_clear(w);
        w->used = true;
        w->uid = ++r->next_worker_uid;
        memcpy(w->name, id, id_len);
        w->name[id_len] = '\0';
    }
    w->role = reg->role;
    w->last_seen_ns = bt_time_ns();
    w->vocab_size = reg->vocab_size;
    w->max_context = reg->max_context;
    w->draining = false;
    if (reg->kv_layout != NULL) {
        w->block_size = reg->kv_layout->block_size;
        w->total_kv = reg->kv_layout->n_blocks;
        w->hb_free_kv = w->total_kv;
        w->est_free_kv = (int64_t)w->total_kv - w->pending_reserve;
    }
    w->n_eos = (int)BT_MIN(reg->n_eos_ids, (size_t)ROUTER_MAX_EOS);
    for (int i = 0; i < w->n_eos; i++)
        w->eos_ids[i] = reg->eos_ids[i];
    bt_free(w->ucx_desc);
    w->ucx_desc = NULL;
    w->ucx_desc_len = 0;
    bt_free(w->cipc_desc);
    w->cipc_desc = NULL;
    w->cipc_desc_len = 0;
    bt_free(w->stage_desc);
    w->stage_desc = NULL;
    w->stage_desc_len = 0;
    w->can_prefill = w->role == BATON__ROLE__ROLE_DECODE && reg->can_prefill;
    w->transports = 0;
    for (size_t i = 0; i < reg->n_transports; i++)
        if ((unsigned)reg->transports[i] < 32)
            w->transports |= 1u << (unsigned)reg->transports[i];
    snprintf(w->host_id, sizeof(w->host_id), "%s",
             reg->host_id != NULL ? reg->host_id : "");
    w->has_gpu = reg->gpu != NULL;
    w->gpu_ipc = reg->gpu != NULL && reg->gpu->ipc;
    w->gpu_device = reg->gpu != NULL ? reg->gpu->device_index : -1;
    snprintf(w->gpu_bus, sizeof(w->gpu_bus), "%s",
             reg->gpu != NULL && reg->gpu->pci_bus_id != NULL
                 ? reg->gpu->pci_bus_id : "");
    if (w->role == BATON__ROLE__ROLE_DECODE && reg->has_cuda_ipc &&
        reg->cuda_ipc.len > 0 && reg->cuda_ipc.len <= ROUTER_MAX_DESC_BYTES) {
        w->cipc_desc = bt_malloc(reg->cuda_ipc.len, "router_desc");
        if (w->cipc_desc != NULL) {
            memcpy(w->cipc_desc, reg->cuda_ipc.data, reg->cuda_ipc.len);
            w->cipc_desc_len = reg->cuda_ipc.len;
        }
    }
    if (w->role == BATON__ROLE__ROLE_DECODE && reg->has_kv_stage &&
        reg->kv_stage.len > 0 && reg->kv_stage.len <= ROUTER_MAX_DESC_BYTES) {
        /* Opaque here too; the prefill worker validates it. */
        w->stage_desc = bt_malloc(reg->kv_stage.len, "router_desc");
        if (w->stage_desc != NULL) {
            memcpy(w->stage_desc, reg->kv_stage.data, reg->kv_stage.len);
            w->stage_desc_len = reg->kv_stage.len;
        }
    }
    if (w->role == BATON__ROLE__ROLE_DECODE && reg->ucx != NULL &&
        reg->ucx->has_packed && reg->ucx->packed.len > 0 &&
        reg->ucx->packed.len <= ROUTER_MAX_DESC_BYTES) {
        /* Opaque here; each prefill worker validates it. */
        w->ucx_desc = bt_malloc(reg->ucx->packed.len, "router_desc");
        if (w->ucx_desc != NULL) {
            memcpy(w->ucx_desc, reg->ucx->packed.data, reg->ucx->packed.len);
            w->ucx_desc_len = reg->ucx->packed.len;
        }
    }
    BT_LOG_INFO("ROUTER", "worker %s registered: %s, vocab %u, context %u, "
                "kv %u x %u, host %s%s%s", w->name,
                w->role == BATON__ROLE__ROLE_PREFILL ? "prefill"
                : w->can_prefill ? "decode+prefill" : "decode",
                w->vocab_size, w->max_context, w->total_kv, w->block_size,
                w->host_id[0] ? w->host_id : "?",
                w->has_gpu ? ", gpu " : "", w->gpu_bus);
    ack.has_heartbeat_ms = 1;
    ack.heartbeat_ms = (uint32_t)r->cfg.heartbeat_ms;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
    msg.register_ack = &ack;
    send_control(r, w, &msg);
    if (w->role == BATON__ROLE__ROLE_PREFILL)
        send_kv_peers(r, w);
    else if (w->ucx_desc != NULL || w->cipc_desc != NULL ||
             w->stage_desc != NULL)
        send_kv_peers(r, NULL);
}

static void on_heartbeat(router_t *r, router_worker_t *w,
                         const Baton__Heartbeat *hb)
{
    if (w->role == BATON__ROLE__ROLE_DECODE) {
        w->hb_free_kv = hb->free_kv_blocks;
        w->total_kv = hb->total_kv_blocks;
        w->est_free_kv = (int64_t)hb->free_kv_blocks - w->pending_reserve;
    }
    w->hb_running = hb->running;
    if (hb->draining && !w->draining) {
        BT_LOG_INFO("ROUTER", "worker %s is draining", w->name);
        w->draining = true;
    }
}

/* The stop ids a request's decode obeys: its own plus, unless ignore_eos,
 * the model's EOS ids (as `baton run`).  `buf` holds PROTO_MAX_STOP +
 * ROUTER_MAX_EOS ids. */
static int req_stop_ids(const router_req_t *req, const router_worker_t *d,
                        int *buf)
{
    int n = 0;

    for (int i = 0; i < req->n_stop; i++)
        buf[n++] = req->stop_ids[i];
    if (!req->ignore_eos && d != NULL)
        for (int i = 0; i < d->n_eos; i++)
            buf[n++] = d->eos_ids[i];
    return n;
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

static void on_kv_grant(router_t *r, router_worker_t *w,
                        Baton__KvGrant *g)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillTask task = BATON__PREFILL_TASK__INIT;
    router_req_t *req = req_find(r, g->request_id);
    router_worker_t *p;
    int stops[PROTO_MAX_STOP + ROUTER_MAX_EOS];
    int *ids = NULL;
    int n_ids = 0;

    if (req == NULL || req->state != ROUTER_REQ_RESERVING ||
        req->decode_uid != w->uid) {
        if (g->ok) /* the request is gone or moved: free the blocks */
            send_kv_release(r, w, g->request_id, g->epoch);
        return;
    }
    w->pending_reserve -= req->reserved_blocks;
    if (g->has_free_blocks)
        w->est_free_kv = (int64_t)g->free_blocks - w->pending_reserve;
    if (!g->ok) {
        /* Pool full: wait for blocks (bounded by the queue timeout). */
        if (!g->has_free_blocks)
            w->est_free_kv = 0;
        req->reserved_blocks = 0;
        req_requeue(r, req, false, 20 * 1000000ull);
        return;
    }
    req->state = ROUTER_REQ_PREFILLING; /* reserve counted no more */
    req->epoch = g->epoch;
    req->t_granted = bt_time_ns();
    p = worker_by_uid(r, req->prefill_uid);
    if (p == NULL || !router__worker_is_usable(p)) {
        req_unassign_prefill(r, req);
        p = r->policy->pick_prefill(r, req);
        if (p == NULL && r->aggregate >= 1 && w->can_prefill)
            p = w; /* aggregated: the decode worker prefills it */
        if (p == NULL) {
            send_kv_release(r, w, req->id, req->epoch);
            req->state = ROUTER_REQ_RESERVING;
            req_requeue(r, req, false, 20 * 1000000ull);
            return;
        }
        req->prefill_uid = p->uid;
        p->outstanding += req->task_tokens;
        p->assigned++;
    }
    task.has_request_id = 1;
    task.request_id = req->id;
    if (req->prompt_ids != NULL) {
        n_ids = req->n_prompt + req->n_generated;
        ids = bt_malloc((size_t)n_ids * sizeof(int), "router_task_ids");
        if (ids == NULL) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL,
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
    task.n_stop_ids = (size_t)req_stop_ids(req, w, stops);
    task.stop_ids = (int32_t *)stops;
    task.has_ignore_eos = 1;
    task.ignore_eos = req->ignore_eos;
    task.has_max_tokens = 1;
    task.max_tokens = (uint32_t)req->max_tokens;
    /* Staged UCX needs the receive-area ids of this grant (the decode
     * worker gives none when it was not asked or has no receiver). */
    req->transport = router__choose_transport_ex(
        p, w, r->kv_mode,
        g->n_stage_block_ids > 0 && g->n_stage_block_ids == g->n_block_ids);
    task.has_transport = 1;
    task.transport = req->transport;
    if (req->transport == BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC) {
        task.has_cuda_ipc = 1;
        task.cuda_ipc.data = w->cipc_desc;
        task.cuda_ipc.len = w->cipc_desc_len;
    }
    if (req->transport == BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE) {
        task.has_kv_stage = 1;
        task.kv_stage.data = w->stage_desc;
        task.kv_stage.len = w->stage_desc_len;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK;
    msg.prefill_task = &task;
    send_control(r, p, &msg);
    req->t_prefill_sent = bt_time_ns();
    bt_free(ids);
}

static void req_complete(router_t *r, router_req_t *req,
                         Baton__FinishReason reason)
{
    send_finished(r, req, reason);
    r->completed++;
    req_destroy(r, req);
}

static void on_prefill_done(router_t *r, router_worker_t *w,
                            Baton__PrefillDone *done)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvReady ready = BATON__KV_READY__INIT;
    router_req_t *req = req_find(r, done->request_id);
    router_worker_t *d;
    int stops[PROTO_MAX_STOP + ROUTER_MAX_EOS];
    int n_stops, first, n_tokens;
    int *tokens;
    const uint8_t *text;
    size_t text_len;
    char *shown = NULL;
    stop_reason_t reason;

    if (req == NULL || req->state != ROUTER_REQ_PREFILLING ||
        req->prefill_uid != w->uid)
        return; /* late answer for a request that moved on */
    d = worker_by_uid(r, req->decode_uid);
    req_unassign_prefill(r, req);
    if (!done->ok) {
        Baton__ErrorCode code = done->has_error_code
                                    ? done->error_code
                                    : BATON__ERROR_CODE__ERROR_WORKER;
        if (code == BATON__ERROR_CODE__ERROR_WORKER && d != NULL) {
            /* The worker, not the request, failed: try again. */
            send_kv_release(r, d, req->id, req->epoch);
            req_requeue(r, req, true, 0);
            return;
        }
        req_fail(r, req, code, done->error ? done->error : "prefill failed");
        return;
    }
    if (d == NULL) { /* decode died meanwhile: prefill again */
        req_requeue(r, req, true, 0);
        return;
    }
    req->t_prefill_done = bt_time_ns();
    req->transfer_us += done->transfer_us;
    if (req->prompt_ids == NULL) {
        if (done->n_prompt_ids == 0) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                     "prefill returned no prompt ids");
            return;
        }
        req->prompt_ids = bt_malloc(done->n_prompt_ids * sizeof(int),
                                    "router_prompt");
        if (req->prompt_ids == NULL) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL, "no memory");
            return;
        }
        memcpy(req->prompt_ids, done->prompt_ids,
               done->n_prompt_ids * sizeof(int));
        req->n_prompt = (int)done->n_prompt_ids;
    }
    first = done->first_token;
    n_stops = req_stop_ids(req, d, stops);
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
            req_fail(r, req, status == BT_ERR_NO_MEMORY
                                 ? BATON__ERROR_CODE__ERROR_INTERNAL
                                 : BATON__ERROR_CODE__ERROR_INVALID,
                     "bad stop conditions");
            return;
        }
        text = (const uint8_t *)shown;
    }
    if (reason == STOP_EOS) {
        /* Not emitted; text a failed decode worker held back goes out. */
        if (text_len > 0)
            send_chunk(r, req, req->n_generated, NULL, 0, text, text_len);
        bt_free(shown);
        send_kv_release(r, d, req->id, req->epoch);
        req_complete(r, req, BATON__FINISH_REASON__FINISH_STOP);
        return;
    }
    if (!req_append_generated(req, &first, 1)) {
        bt_free(shown);
        req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL, "no memory");
        return;
    }
    if (reason == STOP_NONE && req->n_generated >= req->max_tokens &&
        shown != NULL) {
        /* The end: held-back text shows (text_len + held <= cap). */
        memcpy(shown + text_len, req->stop_held, req->n_stop_held);
        text_len += req->n_stop_held;
        req->n_stop_held = 0;
    }
    send_chunk(r, req, req->n_generated - 1, &first, 1, text, text_len);
    bt_free(shown);
    if (reason == STOP_STRING || req->n_generated >= req->max_tokens) {
        send_kv_release(r, d, req->id, req->epoch);
        req_complete(r, req, reason == STOP_STRING
                                 ? BATON__FINISH_REASON__FINISH_STOP
                                 : BATON__FINISH_REASON__FINISH_LENGTH);
        return;
    }
    n_tokens = req->n_prompt + req->n_generated;
    tokens = bt_malloc((size_t)n_tokens * sizeof(int), "router_ready");
    if (tokens == NULL) {
        req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL, "no memory");
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
    ready.has_spec_feature = done->has_spec_feature; /* EAGLE hand-off */
    ready.spec_feature = done->spec_feature;
    ready.n_stop_strings = (size_t)req->n_stop_strings;
    ready.stop_strings = req->stop_strings;
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
    send_control(r, d, &msg);
    req->state = ROUTER_REQ_DECODING;
    bt_free(tokens);
}

static void on_token_out(router_t *r, router_worker_t *w,
                         const Baton__TokenOut *out)
{
    router_req_t *req = req_find(r, out->request_id);
    int skip, n;

    if (req == NULL || req->state != ROUTER_REQ_DECODING ||
        req->decode_uid != w->uid)
        return; /* from a worker the request left: never relayed twice */
    skip = req->n_generated - (int)out->index;
    if (skip < 0) {
        BT_LOG_WARN("ROUTER", "request %llu: token gap (have %d, got index "
                    "%u)", (unsigned long long)req->id, req->n_generated,
                    out->index);
        skip = 0;
    }
    n = (int)out->n_ids - skip;
    /* The decode worker's matcher state, for a failover. */
    req->n_stop_held = 0;
    if (out->has_stop_held && out->stop_held.len < sizeof(req->stop_held)) {
        memcpy(req->stop_held, out->stop_held.data, out->stop_held.len);
        req->n_stop_held = out->stop_held.len;
    }
    if (n <= 0 && skip == 0 && out->has_text && out->text.len > 0)
        /* No ids, only text (held back until a stop id ended it). */
        send_chunk(r, req, req->n_generated, NULL, 0, out->text.data,
                   out->text.len);
    if (n > 0) {
        int index = req->n_generated;
        if (!req_append_generated(req, out->ids + skip, n)) {
            req_fail(r, req, BATON__ERROR_CODE__ERROR_INTERNAL, "no memory");
            return;
        }
        /* Text of a partly duplicated chunk cannot be split: drop it. */
        send_chunk(r, req, index, out->ids + skip, n,
                   skip == 0 && out->has_text ? out->text.data : NULL,
                   out->text.len);
    }
    if (out->has_finish && out->finish != BATON__FINISH_REASON__FINISH_NONE)
        req_complete(r, req, out->finish);
}

static void on_task_error(router_t *r, router_worker_t *w,
                          const Baton__TaskError *te)
{
    router_req_t *req = req_find(r, te->request_id);

    if (req == NULL ||
        (req->prefill_uid != w->uid && req->decode_uid != w->uid))
        return;
    if (req->state == ROUTER_REQ_DECODING && req->decode_uid == w->uid)
        req->state = ROUTER_REQ_QUEUED; /* the decode already dropped it */
    req_fail(r, req,
             te->has_code ? te->code : BATON__ERROR_CODE__ERROR_WORKER,
             te->message ? te->message : "worker error");
}

static void handle_control(router_t *r, bt_zmq_msg_t *zm)
{
    const uint8_t *id;
    size_t id_len;
    Baton__ControlMessage *msg = NULL;
    router_worker_t *w;
    char err[256];
    bt_status_t status;

    if (zm->n_frames != 2 || zm->n_dropped != 0) {
        BT_LOG_WARN("NET", "control message with %d frames dropped",
                    zm->n_frames + zm->n_dropped);
        return;
    }
    id = bt_zmq_frame_data(zm, 0);
    id_len = bt_zmq_frame_size(zm, 0);
    status = proto_control_decode(bt_zmq_frame_data(zm, 1),
                                  bt_zmq_frame_size(zm, 1), &msg, err,
                                  sizeof(err));
    if (status != BT_OK) {
        BT_LOG_WARN("NET", "control message dropped: %s", err);
        proto_control_free(&msg);
        return;
    }
    if (msg->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER) {
        on_register(r, id, id_len, msg->register_);
        goto out;
    }
    w = worker_by_name(r, id, id_len);
    if (w == NULL) {
        /* Unknown (dropped, or the router restarted): ask to register. */
        Baton__ControlMessage reply = BATON__CONTROL_MESSAGE__INIT;
        Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;
        ack.has_reregister = 1;
        ack.reregister = 1;
        reply.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
        reply.register_ack = &ack;
        proto_control_send(r->control_sock, id, id_len, &reply);
        goto out;
    }
    w->last_seen_ns = bt_time_ns();
    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_HEARTBEAT:
        on_heartbeat(r, w, msg->heartbeat);
        break;
    case BATON__CONTROL_MESSAGE__BODY_KV_GRANT:
        on_kv_grant(r, w, msg->kv_grant);
        break;
    case BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE:
        on_prefill_done(r, w, msg->prefill_done);
        break;
    case BATON__CONTROL_MESSAGE__BODY_TOKEN_OUT:
        on_token_out(r, w, msg->token_out);
        break;
    case BATON__CONTROL_MESSAGE__BODY_TASK_ERROR:
        on_task_error(r, w, msg->task_error);
        break;
    case BATON__CONTROL_MESSAGE__BODY_DRAIN:
        BT_LOG_INFO("ROUTER", "worker %s is draining", w->name);
        w->draining = true;
        break;
    case BATON__CONTROL_MESSAGE__BODY_SHUTDOWN:
        worker_drop(r, w, "left");
        break;
    default:
        BT_LOG_WARN("NET", "unexpected %s from worker %s dropped",
                    proto_control_body_name(msg->body_case), w->name);
        break;
    }
out:
    proto_control_free(&msg);
}

// ---------------------------------------------------------------------------
// Client messages

static uint32_t cluster_max_context(router_t *r)
{
    uint32_t best = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used &&
            r->workers[i].role == BATON__ROLE__ROLE_DECODE)
            best = BT_MAX(best, r->workers[i].max_context);
    return best;
}

static uint32_t cluster_min_vocab(router_t *r)
{
    uint32_t v = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used && r->workers[i].vocab_size > 0 &&
            (v == 0 || r->workers[i].vocab_size < v))
            v = r->workers[i].vocab_size;
    return v;
}

static void on_generate(router_t *r, const uint8_t *cid, size_t cid_len,
                        const Baton__GenerateRequest *g)
{
    router_req_t *req;
    char err[256];
    uint64_t rid = g->client_request_id;
    uint32_t max_ctx, vocab;
    size_t b;
    bt_status_t status;

#define REJECT(_code, ...)                                                  \
    do {                                                                    \
        proto_client_send_error(r->client_sock, cid, cid_len, rid, _code,   \
                                __VA_ARGS__);                               \
        r->failed++;                                                        \
        return;                                                             \
    } while (0)

    if (r->draining || r->stop)
        REJECT(BATON__ERROR_CODE__ERROR_DRAINING, "router is draining");
    status = proto_generate_validate(g, err, sizeof(err));
    if (status != BT_OK)
        REJECT(BATON__ERROR_CODE__ERROR_INVALID, "%s", err);
    max_ctx = cluster_max_context(r);
    if (max_ctx > 0 && g->n_prompt_ids >= max_ctx)
        REJECT(BATON__ERROR_CODE__ERROR_TOO_LONG,
               "prompt of %zu tokens does not fit the context (%u)",
               g->n_prompt_ids, max_ctx);
    vocab = cluster_min_vocab(r);
    for (size_t i = 0; vocab > 0 && i < g->n_prompt_ids; i++)
        if ((uint32_t)g->prompt_ids[i] >= vocab)
            REJECT(BATON__ERROR_CODE__ERROR_INVALID,
                   "prompt id %d at %zu is outside the vocabulary (%u)",
                   g->prompt_ids[i], i, vocab);
    if (req_find_client(r, cid, cid_len, rid) != NULL)
        REJECT(BATON__ERROR_CODE__ERROR_DUPLICATE,
               "request id %llu already in flight", (unsigned long long)rid);
    if (r->n_queued >= r->cfg.max_queue ||
        (r->cfg.max_inflight > 0 && r->n_live >= r->cfg.max_inflight))
        REJECT(BATON__ERROR_CODE__ERROR_OVERLOADED,
               "queue full (%d requests waiting)", r->n_queued);

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
    }
    if (g->n_stop_ids > 0) {
        req->stop_ids = bt_malloc(g->n_stop_ids * sizeof(int), "router_stop");
        if (req->stop_ids != NULL)
            memcpy(req->stop_ids, g->stop_ids, g->n_stop_ids * sizeof(int));
        req->n_stop = (int)g->n_stop_ids;
    }
    if ((req->prompt_ids == NULL && req->prompt_text == NULL) ||
        (req->n_stop > 0 && req->stop_ids == NULL)) {
        bt_free(req->prompt_ids);
        bt_free(req->prompt_text);
        bt_free(req->stop_ids);
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
    req->priority = g->priority;
    req->t_arrival = bt_time_ns();
    if (g->deadline_ms > 0)
        req->deadline_ns = req->t_arrival + (uint64_t)g->deadline_ms * 1000000ull;
    /* link */
    req->all_next = r->all_head;
    if (r->all_head)
        r->all_head->all_prev = req;
    r->all_head = req;
    r->n_live++;
    req->id_next = r->by_id[req->id % ROUTER_HASH_BUCKETS];
    r->by_id[req->id % ROUTER_HASH_BUCKETS] = req;
    b = client_bucket(cid, cid_len, rid);
    req->cl_next = r->by_client[b];
    r->by_client[b] = req;
    queue_insert(r, req, false);
#undef REJECT
}

static void on_cancel(router_t *r, const uint8_t *cid, size_t cid_len,
                      const Baton__Cancel *c)
{
    router_req_t *req = req_find_client(r, cid, cid_len, c->client_request_id);

    if (req == NULL)
        return; /* already finished: nothing to do */
    BT_LOG_DEBUG("ROUTER", "request %llu cancelled by the client",
                 (unsigned long long)req->id);
    req_release_workers(r, req);
    send_finished(r, req, BATON__FINISH_REASON__FINISH_CANCELLED);
    r->completed++;
    req_destroy(r, req);
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
        ws[n].host_id = w->host_id;
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
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS;
    msg.status = &cs;
    proto_client_send(r->client_sock, cid, cid_len, &msg);
    bt_free(pairs);
    bt_free(pp);
}

static void handle_client(router_t *r, bt_zmq_msg_t *zm)
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

// ---------------------------------------------------------------------------
// Lifecycle

bt_status_t router_create(const router_config_t *cfg, router_t **router_p)
{
    bt_zmq_socket_config_t scfg;
    router_t *r;
    bt_status_t status;
    int handover = 1;

    r = bt_calloc(1, sizeof(*r), "router");
    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->cfg = *cfg;
    r->policy = router__policy_find(cfg->policy);
    if (r->policy == NULL) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown policy %s",
                          cfg->policy);
        goto err_free;
    }
    if (!router__kv_mode_parse(cfg->kv_transport, &r->kv_mode)) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown KV "
                          "transport %s (auto, ucx, cuda-ipc, ucx-stage, "
                          "inline)",
                          cfg->kv_transport ? cfg->kv_transport : "(null)");
        goto err_free;
    }
    if (cfg->aggregate == NULL || strcmp(cfg->aggregate, "fallback") == 0) {
        r->aggregate = 1;
    } else if (strcmp(cfg->aggregate, "always") == 0) {
        r->aggregate = 2;
    } else if (strcmp(cfg->aggregate, "never") == 0) {
        r->aggregate = 0;
    } else {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown aggregate "
                          "mode %s (fallback, always, never)", cfg->aggregate);
        goto err_free;
    }
    if (cfg->max_queue <= 0 || cfg->heartbeat_ms <= 0 ||
        cfg->heartbeat_miss <= 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                          "max_queue, heartbeat_ms and heartbeat_miss must "
                          "be positive");
        goto err_free;
    }
    r->ctx = zmq_ctx_new();
    if (r->ctx == NULL) {
        status = BT_ZMQ_ERROR("zmq_ctx_new");
        goto err_free;
    }
    bt_zmq_socket_config_init(&scfg);
    scfg.type = ZMQ_ROUTER;
    scfg.bind = true;
    scfg.endpoint = cfg->listen;
    scfg.max_msg = PROTO_CLIENT_MAX_BYTES;
    status = bt_zmq_socket_create(r->ctx, &scfg, &r->client_sock);
    if (status != BT_OK)
        goto err_ctx;
    scfg.endpoint = cfg->control;
    scfg.max_msg = PROTO_CONTROL_MAX_BYTES;
    status = bt_zmq_socket_create(r->ctx, &scfg, &r->control_sock);
    if (status != BT_OK)
        goto err_client;
    /* A restarted worker reuses its name: let it take the route over. */
    zmq_setsockopt(r->control_sock, ZMQ_ROUTER_HANDOVER, &handover,
                   sizeof(handover));
    *router_p = r;
    return BT_OK;

err_client:
    bt_zmq_socket_destroy(&r->client_sock);
err_ctx:
    zmq_ctx_term(r->ctx);
err_free:
    bt_free(r);
    return status;
}

void router_destroy(router_t **router_p)
{
    router_t *r = *router_p;

    if (r == NULL)
        return;
    while (r->all_head != NULL)
        req_destroy(r, r->all_head);
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        worker_clear(&r->workers[i]);
    bt_free(r->queue);
    bt_zmq_socket_destroy(&r->client_sock);
    bt_zmq_socket_destroy(&r->control_sock);
    zmq_ctx_term(r->ctx);
    bt_free(r);
    *router_p = NULL;
}

void router_stop(router_t *router)
{
    router->stop = 1;
}

int router_client_port(const router_t *router)
{
    return bt_zmq_bound_port(router->client_sock);
}

int router_control_port(const router_t *router)
{
    return bt_zmq_bound_port(router->control_sock);
}

bt_status_t router_run(router_t *r)
{
    zmq_pollitem_t items[2] = {
        { r->client_sock, 0, ZMQ_POLLIN, 0 },
        { r->control_sock, 0, ZMQ_POLLIN, 0 },
    };
    uint64_t last_tick = 0;

    BT_LOG_INFO("ROUTER", "serving clients on %s (port %d), workers on %s "
                "(port %d), policy %s", r->cfg.listen, router_client_port(r),
                r->cfg.control, router_control_port(r), r->policy->name);
    for (;;) {
        uint64_t now;
        int rc;

        if (r->stop && !r->draining) {
            r->draining = true;
            r->drain_deadline_ns = bt_time_ns() +
                                   (uint64_t)r->cfg.drain_timeout_ms * 1000000ull;
            BT_LOG_INFO("ROUTER", "draining: %d requests in flight",
                        r->n_live);
        }
        if (r->draining) {
            if (r->n_live == 0)
                break;
            if (bt_time_ns() > r->drain_deadline_ns) {
                while (r->all_head != NULL)
                    req_fail(r, r->all_head, BATON__ERROR_CODE__ERROR_DRAINING,
                             "router shut down before the request finished");
                break;
            }
        }
        rc = zmq_poll(items, 2, ROUTER_TICK_MS);
        if (rc < 0 && zmq_errno() != EINTR)
            return BT_ZMQ_ERROR("zmq_poll");
        for (int s = 0; s < 2 && rc > 0; s++) {
            if (!(items[s].revents & ZMQ_POLLIN))
                continue;
            for (int k = 0; k < ROUTER_MAX_BURST; k++) {
                bt_zmq_msg_t zm;
                if (bt_zmq_recv(items[s].socket, ZMQ_DONTWAIT, &zm) != BT_OK)
                    break;
                if (s == 0)
                    handle_client(r, &zm);
                else
                    handle_control(r, &zm);
                bt_zmq_msg_close(&zm);
            }
        }
        now = bt_time_ns();
        if (now - last_tick >= ROUTER_TICK_MS * 1000000ull) {
            last_tick = now;
            check_liveness(r, now);
            check_deadlines(r, now);
        }
        dispatch(r);
    }
    BT_LOG_INFO("ROUTER", "stopped: %llu completed, %llu failed",
                (unsigned long long)r->completed,
                (unsigned long long)r->failed);
    return BT_OK;
}
