/*
 * router_request.c - request objects: lookup by router id and by
 * (client, client request id), the admission queue (priority order,
 * retries in front), what a request holds on workers and how it lets go
 * (release, fail, re-queue after a worker failure, complete), and
 * deadlines and queue timeouts.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "router_int.h"

static size_t client_bucket(const uint8_t *id, size_t len, uint64_t rid)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ id[i]) * 1099511628211ull;
    h ^= rid * 0x9e3779b97f4a7c15ull;
    return (size_t)(h % ROUTER_HASH_BUCKETS);
}

router_req_t *router__req_find(router_t *r, uint64_t id)
{
    for (router_req_t *q = r->by_id[id % ROUTER_HASH_BUCKETS]; q; q = q->id_next)
        if (q->id == id)
            return q;
    return NULL;
}

router_req_t *router__req_find_client(router_t *r, const uint8_t *cid,
                                      size_t cid_len, uint64_t rid)
{
    size_t b = client_bucket(cid, cid_len, rid);
    for (router_req_t *q = r->by_client[b]; q; q = q->cl_next)
        if (q->client_rid == rid && q->client_id_len == cid_len &&
            memcmp(q->client_id, cid, cid_len) == 0)
            return q;
    return NULL;
}

void router__queue_remove(router_t *r, router_req_t *req)
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

// ---------------------------------------------------------------------------
// Tenants: weighted-fair queueing within a priority (issue 42)
//
// Start-time fair queueing (Goyal et al.): a request arriving for tenant
// T gets the start tag S = max(T.finish, vclock) and moves T.finish to
// S + cost / weight, cost its tokens (prompt + max_tokens).  Within a
// priority the queue is ordered by S, so a tenant that floods the queue
// pushes only its own later requests back: another tenant's next request
// starts at the virtual clock and goes ahead of the flood's tail.  With
// one tenant (no tenants configured) the tags grow with arrival: FIFO,
// as before.  Priorities stay strict across classes; re-queued requests
// (failover) still go first in theirs.

int router__tenant_slot(router_t *r, const char *name)
{
    int free_slot = -1;

    if (name == NULL || name[0] == '\0')
        return 0;
    for (int i = 1; i < ROUTER_MAX_TENANTS; i++) {
        router_tenant_t *t = &r->tenants[i];
        if (t->live > 0 && strcmp(t->name, name) == 0)
            return i;
        if (t->live == 0 && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        BT_LOG_WARN("ROUTER", "more than %d tenants with live requests: "
                    "tenant '%s' shares the default tenant's share",
                    ROUTER_MAX_TENANTS - 1, name);
        return 0;
    }
    snprintf(r->tenants[free_slot].name, sizeof(r->tenants[0].name), "%s",
             name);
    r->tenants[free_slot].finish = 0;
    return free_slot;
}

/* Charges a newly admitted request to its tenant: its start tag. */
static void tenant_charge(router_t *r, router_req_t *req)
{
    router_tenant_t *t = &r->tenants[req->tenant];
    double out = req->max_tokens >= ROUTER_MAX_TOKENS
                     ? ROUTER_TENANT_OUTPUT_COST
                     : BT_MIN(req->max_tokens, ROUTER_MAX_TOKENS);
    double in = req->prompt_ids != NULL ? req->n_prompt
                                        : (double)req->text_len / 4.0;
    double cost = BT_MAX(in + out, 1.0);

    req->vtag = BT_MAX(t->finish, r->vclock);
    t->finish = req->vtag + cost / (double)BT_MAX(req->weight, 1u);
}

void router__queue_dispatched(router_t *r, router_req_t *req)
{
    r->vclock = BT_MAX(r->vclock, req->vtag);
    req->front = false;
}

/* Inserts by priority (higher first), within a priority by start tag;
 * `front` puts it ahead of requests of equal priority (retries keep
 * their place).  The array holds every live request, so it never
 * overflows. */
static void queue_insert(router_t *r, router_req_t *req, bool front)
{
    int at = r->n_queued;

    BT_ASSERT(!req->queued && r->n_queued < r->n_live + 1);
    req->front = front;
    while (at > 0) {
        router_req_t *p = r->queue[at - 1];
        if (p->priority > req->priority ||
            (!front && p->priority == req->priority &&
             (p->front || p->vtag <= req->vtag)))
            break;
        at--;
    }
    memmove(&r->queue[at + 1], &r->queue[at],
            (size_t)(r->n_queued - at) * sizeof(r->queue[0]));
    r->queue[at] = req;
    r->n_queued++;
    req->queued = true;
}

void router__req_admit(router_t *r, router_req_t *req)
{
    size_t b;

    req->all_next = r->all_head;
    if (r->all_head)
        r->all_head->all_prev = req;
    r->all_head = req;
    r->n_live++;
    req->id_next = r->by_id[req->id % ROUTER_HASH_BUCKETS];
    r->by_id[req->id % ROUTER_HASH_BUCKETS] = req;
    b = client_bucket(req->client_id, req->client_id_len, req->client_rid);
    req->cl_next = r->by_client[b];
    r->by_client[b] = req;
    req->t_queued = bt_time_ns();
    r->tenants[req->tenant].live++;
    tenant_charge(r, req);
    queue_insert(r, req, false);
}

void router__req_unassign_prefill(router_t *r, router_req_t *req)
{
    router_worker_t *p = router__worker_by_uid(r, req->prefill_uid);

    if (p != NULL) {
        p->outstanding -= BT_MIN(p->outstanding, req->task_tokens);
        if (p->assigned > 0)
            p->assigned--;
    }
    req->prefill_uid = 0;
}

static void req_unassign_decode(router_t *r, router_req_t *req)
{
    router_worker_t *d = router__worker_by_uid(r, req->decode_uid);

    if (d != NULL) {
        if (req->state == ROUTER_REQ_RESERVING)
            d->pending_reserve -= req->reserved_blocks;
        if (d->assigned > 0)
            d->assigned--;
        if (req->recv_probe) /* a probe that ends unanswered */
            d->recv_probe_out = false;
    }
    req->recv_probe = false;
    req->decode_uid = 0;
    req->reserved_blocks = 0;
}

void router__req_destroy(router_t *r, router_req_t *req)
{
    router_req_t **pp;

    router__queue_remove(r, req);
    router__req_unassign_prefill(r, req);
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
    if (r->tenants[req->tenant].live > 0 &&
        --r->tenants[req->tenant].live == 0 && req->tenant != 0)
        memset(&r->tenants[req->tenant], 0, sizeof(r->tenants[0]));
    bt_free(req->prompt_ids);
    bt_free(req->prompt_text);
    bt_free(req->stop_ids);
    for (int i = 0; i < req->n_stop_strings; i++)
        bt_free(req->stop_strings[i].data);
    bt_free(req->stop_strings);
    bt_free(req->grammar);
    router_kv_chain_cleanup(&req->kv_chain);
    bt_free(req->generated);
    bt_free(req);
}

/* Tells the workers holding a request to forget it, according to its
 * state.  A grant still in flight is released when it arrives (the
 * request is gone by then). */
void router__req_release_workers(router_t *r, router_req_t *req)
{
    router_worker_t *p = router__worker_by_uid(r, req->prefill_uid);
    router_worker_t *d = router__worker_by_uid(r, req->decode_uid);

    if (req->state != ROUTER_REQ_QUEUED)
        r->t_capacity_ns = bt_time_ns();
    switch (req->state) {
    case ROUTER_REQ_QUEUED:
    case ROUTER_REQ_RESERVING:
        break;
    case ROUTER_REQ_PREFILLING:
        if (p != NULL)
            router__send_cancel_task(r, p, req->id);
        if (d != NULL)
            router__send_kv_release(r, d, req->id, req->epoch);
        break;
    case ROUTER_REQ_DECODING:
        if (d != NULL)
            router__send_cancel_task(r, d, req->id);
        break;
    }
}

/* Ends a request with an error reply, releasing what workers hold. */
void router__req_fail(router_t *r, router_req_t *req, Baton__ErrorCode code,
                      const char *text)
{
    BT_LOG_INFO("ROUTER", "request %llu failed: %s",
                (unsigned long long)req->id, text);
    router__req_release_workers(r, req);
    router__send_req_error(r, req, code, text);
    r->failed++;
    r->metrics.failed[(unsigned)code % ROUTER_METRICS_CODES]++;
    router__req_destroy(r, req);
}

/* Puts a request back in the queue after a worker failure or a refused
 * reservation.  `failure` counts against max_retries. */
void router__req_requeue(router_t *r, router_req_t *req, bool failure,
                         uint64_t delay_ns)
{
    router__req_unassign_prefill(r, req);
    req_unassign_decode(r, req);
    req->state = ROUTER_REQ_QUEUED;
    req->epoch = 0;
    req->phase_deadline_ns = 0;
    if (failure) {
        req->retries++;
        if (req->retries > r->cfg.max_retries) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_WORKER,
                             "worker failures exceeded the retry limit");
            return;
        }
        BT_LOG_INFO("ROUTER", "request %llu re-queued after worker failure "
                    "(%d tokens streamed, retry %d)",
                    (unsigned long long)req->id, req->n_generated,
                    req->retries);
        r->metrics.retries++;
    }
    req->retry_at_ns = bt_time_ns() + delay_ns;
    /* Failover is timed from here, not from arrival: a request that
     * waited long for its first attempt still gets the whole queue
     * timeout to find another worker. */
    req->t_queued = bt_time_ns();
    queue_insert(r, req, true);
}

void router__req_complete(router_t *r, router_req_t *req,
                          Baton__FinishReason reason)
{
    uint64_t now = bt_time_ns();

    router__send_finished(r, req, reason);
    r->completed++;
    r->t_capacity_ns = now;
    r->metrics.finished[(unsigned)reason % ROUTER_METRICS_FINISH]++;
    r->metrics.prompt_tokens += (uint64_t)req->n_prompt;
    if (req->n_generated >= 2 && req->t_first != 0 && now > req->t_first)
        bt_prom_hist_observe(&r->metrics.tpot,
                             (double)(now - req->t_first) * 1e-9 /
                                 (req->n_generated - 1));
    router__req_destroy(r, req);
}

bool router__req_append_generated(router_req_t *req, const int *ids, int n)
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
int router__req_prefill_tokens(const router_req_t *req)
{
    if (req->prompt_ids != NULL)
        return req->n_prompt + req->n_generated;
    return router__req_text_tokens(req);
}

int router__req_text_tokens(const router_req_t *req)
{
    return (int)BT_MIN(req->text_len + 2, (size_t)PROTO_MAX_PROMPT_TOKENS);
}

/* The stop ids a request's decode obeys: its own plus, unless ignore_eos,
 * the model's EOS ids (as `baton run`).  `buf` holds PROTO_MAX_STOP +
 * ROUTER_MAX_EOS ids. */
int router__req_stop_ids(const router_req_t *req, const router_worker_t *d,
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

static const char *const phase_names[] = {
    "queue", "KV reservation", "prefill", "next token",
};

/* The worker doing req's current phase (NULL when none). */
static router_worker_t *phase_worker(router_t *r, const router_req_t *req)
{
    return router__worker_by_uid(r, req->state == ROUTER_REQ_PREFILLING
                                        ? req->prefill_uid
                                        : req->decode_uid);
}

/* Sets the deadline from the worker's measurements now. */
static void phase_estimate(router_t *r, router_req_t *req)
{
    uint64_t ms = (uint64_t)r->cfg.phase_ms;
    router_worker_t *w;

    switch (req->state) {
    case ROUTER_REQ_RESERVING: /* answered between two decode steps */
    case ROUTER_REQ_DECODING:  /* a token (or KV arrival) per step */
        w = router__worker_by_uid(r, req->decode_uid);
        if (w != NULL)
            ms = BT_MAX(ms, 20ull * w->step_ms);
        break;
    case ROUTER_REQ_PREFILLING:
        /* Everything queued on the prefill worker, this prompt included,
         * at its measured rate, four times over, plus its longest turn. */
        w = router__worker_by_uid(r, req->prefill_uid);
        if (w != NULL && w->prefill_tps > 0)
            ms = BT_MAX(ms, (uint64_t)(4000.0 * (double)w->outstanding /
                                       w->prefill_tps) +
                                20ull * w->step_ms);
        else if (w != NULL)
            ms = BT_MAX(ms, 20ull * w->step_ms);
        break;
    default:
        req->phase_deadline_ns = 0;
        return;
    }
    req->phase_deadline_ns = bt_time_ns() + ms * 1000000ull;
    w = phase_worker(r, req);
    req->phase_progress = w != NULL ? w->progress : 0;
}

void router__req_phase_deadline(router_t *r, router_req_t *req)
{
    req->phase_extensions = 0;
    phase_estimate(r, req);
}

/* The current attempt of req made no progress within its phase's
 * deadline (a lost message, a worker that hangs on this request while
 * it heartbeats): give it up and resume the request from what the client
 * has.  Counts as a worker failure (max_retries bounds it). */
static void abandon_attempt(router_t *r, router_req_t *req)
{
    router_worker_t *w = phase_worker(r, req);

    /* A worker that kept turning may just have more queued than the
     * estimate knew (a cold start measures its rate only after its first
     * steps): estimate again from what it reports now, a few times. */
    if (w != NULL && w->progress > req->phase_progress &&
        req->phase_extensions < ROUTER_PHASE_EXTENSIONS) {
        req->phase_extensions++;
        phase_estimate(r, req);
        return;
    }

    BT_LOG_WARN("ROUTER", "request %llu: %s on worker %s made no progress "
                "by its deadline: attempt abandoned, resuming",
                (unsigned long long)req->id, phase_names[req->state],
                w != NULL ? w->name : "?");
    router__req_release_workers(r, req);
    req->failed_uid = w != NULL ? w->uid : 0;
    router__req_requeue(r, req, true, 0);
}

/* Past the queue timeout (qt ns) with no capacity come free since the
 * request entered the queue, or past ROUTER_QUEUE_WAIT_MAX of them in
 * all (times read after `now`: not yet). */
static bool queue_timed_out(const router_t *r, const router_req_t *req,
                            uint64_t now, uint64_t qt)
{
    uint64_t since = BT_MAX(req->t_queued, r->t_capacity_ns);

    if (now <= req->t_queued)
        return false;
    return (now > since && now - since > qt) ||
           now - req->t_queued > ROUTER_QUEUE_WAIT_MAX * qt;
}

void router__check_deadlines(router_t *r, uint64_t now)
{
    router_req_t *req, *next;
    uint64_t qt = (uint64_t)r->cfg.queue_timeout_ms * 1000000ull;

    /* A request waiting in the queue fails after the queue timeout
     * without capacity coming free anywhere (no request ended, no worker
     * registered: the cluster is stuck or gone), or after
     * ROUTER_QUEUE_WAIT_MAX queue timeouts in all: a full cluster that
     * keeps finishing requests is served in turn, as on vLLM, not failed
     * (a 224 x 2048/2048 closed loop on one H200 lost 2 requests at 30
     * s, its first finish coming ~45 s in). */
    for (req = r->all_head; req != NULL; req = next) {
        next = req->all_next;
        if (req->deadline_ns != 0 && now > req->deadline_ns) {
            router__req_fail(r, req, BATON__ERROR_CODE__ERROR_TIMEOUT,
                             "deadline exceeded");
        } else if (req->state != ROUTER_REQ_QUEUED &&
                   req->phase_deadline_ns != 0 &&
                   now > req->phase_deadline_ns) {
            abandon_attempt(r, req);
        } else if (req->state == ROUTER_REQ_QUEUED &&
                   queue_timed_out(r, req, now, qt)) {
            bool workers = router__can_serve(r);
            router__req_fail(r, req,
                             workers ? BATON__ERROR_CODE__ERROR_TIMEOUT
                                     : BATON__ERROR_CODE__ERROR_NO_WORKERS,
                             workers ? "no capacity within the queue timeout"
                                     : "no prefill/decode workers registered");
        }
    }
}
