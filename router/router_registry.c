/*
 * router_registry.c - the worker table: Register (role, limits, host,
 * GPU, KV pool descriptors), heartbeats (free KV, draining), liveness
 * (silent after 3 intervals, dropped after heartbeat_miss; a dropped
 * worker's requests are re-queued), and the KV peer lists sent to
 * prefill workers whenever decode pools come or go.
 */
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "router_int.h"

router_worker_t *router__worker_by_rid(router_t *r, const void *rid,
                                       size_t len)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        if (w->used && w->rid_len == len && memcmp(w->rid, rid, len) == 0)
            return w;
    }
    return NULL;
}

/* The registered worker operators know as `name`, or NULL. */
static router_worker_t *worker_by_name(router_t *r, const char *name)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        if (w->used && strcmp(w->name, name) == 0)
            return w;
    }
    return NULL;
}

router_worker_t *router__worker_by_uid(router_t *r, uint64_t uid)
{
    if (uid == 0)
        return NULL;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used && r->workers[i].uid == uid)
            return &r->workers[i];
    return NULL;
}

/* Sends prefill worker `to` (or every prefill worker when NULL) the KV
 * endpoints of all registered decode workers, so it connects ahead of the
 * first hand-off and drops endpoints of decode workers that are gone. */
static void send_kv_peers(router_t *r, const router_worker_t *to)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvPeers kp = BATON__KV_PEERS__INIT;
    Baton__KvEndpoint *eps;
    Baton__KvEndpoint **ptrs;
    size_t n = 0;

    eps = bt_calloc(ROUTER_MAX_WORKERS * ROUTER_MAX_ENDPOINTS, sizeof(*eps),
                    "router_peers");
    ptrs = bt_calloc(ROUTER_MAX_WORKERS * ROUTER_MAX_ENDPOINTS,
                     sizeof(*ptrs), "router_peers");
    if (eps == NULL || ptrs == NULL)
        goto out; /* the next change sends the list again */
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *d = &r->workers[i];
        if (!d->used || d->role != BATON__ROLE__ROLE_DECODE)
            continue;
        for (int e = 0; e < d->n_eps; e++) {
            baton__kv_endpoint__init(&eps[n]);
            eps[n].has_transport = 1;
            eps[n].transport = (Baton__KvTransport)d->eps[e].transport;
            eps[n].has_desc = 1;
            eps[n].desc.data = d->eps[e].desc;
            eps[n].desc.len = d->eps[e].len;
            ptrs[n] = &eps[n];
            n++;
        }
    }
    kp.n_endpoints = n;
    kp.endpoints = ptrs;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_PEERS;
    msg.kv_peers = &kp;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *p = &r->workers[i];
        if (p->used && p->role == BATON__ROLE__ROLE_PREFILL &&
            (to == NULL || to == p))
            router__send_control(r, p, &msg);
    }
out:
    bt_free(eps);
    bt_free(ptrs);
}

static void endpoints_clear(router_worker_t *w)
{
    for (int i = 0; i < w->n_eps; i++)
        bt_free(w->eps[i].desc);
    w->n_eps = 0;
}

/* Keeps a decode worker's KV endpoints (opaque here; each prefill
 * worker's link validates them), one per transport. */
static void endpoints_set(router_worker_t *w, const Baton__Register *reg)
{
    endpoints_clear(w);
    if (w->role != BATON__ROLE__ROLE_DECODE)
        return;
    for (size_t i = 0; i < reg->n_endpoints && w->n_eps < ROUTER_MAX_ENDPOINTS;
         i++) {
        const Baton__KvEndpoint *e = reg->endpoints[i];
        router_endpoint_t *o = &w->eps[w->n_eps];
        if (e == NULL || !e->has_transport || !e->has_desc ||
            e->desc.len == 0 || e->desc.len > ROUTER_MAX_DESC_BYTES ||
            router__worker_endpoint(w, e->transport) != NULL)
            continue;
        o->desc = bt_malloc(e->desc.len, "router_desc");
        if (o->desc == NULL)
            continue;
        memcpy(o->desc, e->desc.data, e->desc.len);
        o->len = e->desc.len;
        o->transport = (int)e->transport;
        w->n_eps++;
    }
}

/* Forgets a worker's registration (the slot becomes free). */
void router__worker_clear(router_worker_t *w)
{
    endpoints_clear(w);
    proto_batch_cleanup(&w->outbox); /* unsent: for a worker gone */
    memset(w, 0, sizeof(*w));
}

/* Removes a worker that died, left or went silent; its requests are
 * re-queued (prefill again elsewhere; decode: prompt + streamed tokens
 * on another decode worker). */
void router__worker_drop(router_t *r, router_worker_t *w, const char *why)
{
    router_req_t *req, *next;
    bool had_pool;

    BT_LOG_WARN("ROUTER", "worker %s (%s) dropped: %s", w->name,
                w->role == BATON__ROLE__ROLE_PREFILL ? "prefill" : "decode",
                why);
    r->metrics.worker_drops++;
    router_kvindex_reset(r->kvindex, (int)(w - r->workers));
    for (req = r->all_head; req != NULL; req = next) {
        next = req->all_next;
        /* Decode first: an aggregated worker is both of a request's. */
        if (req->decode_uid == w->uid) {
            if (req->state == ROUTER_REQ_PREFILLING &&
                req->prefill_uid != w->uid)
                router__send_cancel_task(
                    r, router__worker_by_uid(r, req->prefill_uid), req->id);
            /* A hand-off to w that failed already counted w's death
             * (the request went back to w before the drop: one death,
             * one retry). */
            const bool counted = req->failed_uid == w->uid;
            req->failed_uid = w->uid;
            router__req_requeue(r, req, !counted, 0);
        } else if (req->prefill_uid == w->uid) {
            if (req->state == ROUTER_REQ_RESERVING) {
                router__req_unassign_prefill(r,
                                             req); /* picked again at grant */
            } else if (req->state == ROUTER_REQ_PREFILLING) {
                router__send_kv_release(
                    r, router__worker_by_uid(r, req->decode_uid), req->id,
                    req->epoch);
                router__req_requeue(r, req, true, 0);
            }
        }
    }
    had_pool = w->n_eps > 0;
    router__worker_flush(r, w); /* what it was told before the drop */
    router__worker_clear(w);
    if (had_pool)
        send_kv_peers(r, NULL);
}

uint64_t router__worker_stall_ns(const router_t *r, const router_worker_t *w)
{
    return BT_MAX((uint64_t)r->cfg.stall_ms, 20ull * w->step_ms) * 1000000ull;
}

void router__check_liveness(router_t *r, uint64_t now)
{
    uint64_t limit = (uint64_t)r->cfg.heartbeat_ms * 1000000ull *
                     (uint64_t)r->cfg.heartbeat_miss;

    uint64_t quiet = (uint64_t)r->cfg.heartbeat_ms * 1000000ull * 3;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &r->workers[i];
        if (!w->used)
            continue;
        w->silent = now - w->last_seen_ns > quiet;
        if (now - w->last_seen_ns > limit) {
            router__worker_drop(r, w, "missed heartbeats");
        } else if (w->assigned > 0 &&
                   (uint64_t)w->busy_ms * 1000000ull >
                       router__worker_stall_ns(r, w)) {
            /* It heartbeats (from its own thread) but its engine has been
             * in one turn for too long: stuck.  Its requests go elsewhere;
             * if it ever comes back it has to register again. */
            char why[96];
            snprintf(why, sizeof(why), "no progress for %u ms (engine stuck)",
                     w->busy_ms);
            router__worker_drop(r, w, why);
        }
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

bool router__can_serve(router_t *r)
{
    return (have_role(r, BATON__ROLE__ROLE_PREFILL) || have_aggregated(r)) &&
           have_role(r, BATON__ROLE__ROLE_DECODE);
}

uint32_t router__cluster_max_context(router_t *r)
{
    uint32_t best = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used &&
            r->workers[i].role == BATON__ROLE__ROLE_DECODE)
            best = BT_MAX(best, r->workers[i].max_context);
    return best;
}

uint32_t router__cluster_min_vocab(router_t *r)
{
    uint32_t v = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used && r->workers[i].vocab_size > 0 &&
            (v == 0 || r->workers[i].vocab_size < v))
            v = r->workers[i].vocab_size;
    return v;
}

/* Answers a Register that is refused (the worker stops with `why`). */
static void refuse_register(router_t *r, const uint8_t *id, size_t id_len,
                            const Baton__Register *reg, const char *why)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;

    BT_LOG_WARN("ROUTER", "registration of %s refused: %s",
                reg->name != NULL ? reg->name : "?", why);
    ack.refused = (char *)why;
    ack.has_session = reg->has_session;
    ack.session = reg->session;
    ack.has_router_instance = 1;
    ack.router_instance = r->instance;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
    msg.register_ack = &ack;
    proto_control_send(r->control_sock, id, id_len, &msg);
}

void router__on_register(router_t *r, const uint8_t *id, size_t id_len,
                         const char *key, const Baton__Register *reg)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;
    router_worker_t *w;
    const char *name = reg->name;
    uint64_t now = bt_time_ns();
    uint64_t quiet = (uint64_t)r->cfg.heartbeat_ms * 1000000ull * 3;

    if (id_len == 0 || id_len > ROUTER_RID_MAX ||
        (reg->role != BATON__ROLE__ROLE_PREFILL &&
         reg->role != BATON__ROLE__ROLE_DECODE)) {
        BT_LOG_WARN("ROUTER", "bad registration dropped (role %d, id %zu "
                    "bytes)", (int)reg->role, id_len);
        return;
    }
    if (name == NULL || name[0] == '\0' || strlen(name) >= ROUTER_NAME_MAX) {
        refuse_register(r, id, id_len, reg, "a worker name of 1 to 63 bytes "
                        "is required");
        return;
    }
    /* A class the router does not know would be a pool no request can
     * name (issue 37): refused, with the classes it knows. */
    if (proto_precision_find(reg->precision) == NULL) {
        char why[160];
        snprintf(why, sizeof(why), "precision '%.16s' is not a precision "
                 "class (%s)", reg->precision, PROTO_PRECISIONS);
        refuse_register(r, id, id_len, reg, why);
        return;
    }
    /* Numbers the router computes with are bounded here, so that no
     * later sum or product can overflow whatever an admitted (but
     * buggy or hostile) worker declares. */
    if (reg->max_context > ROUTER_MAX_CONTEXT ||
        reg->vocab_size > ROUTER_MAX_VOCAB ||
        (reg->kv_layout != NULL &&
         (reg->kv_layout->block_size > ROUTER_MAX_BLOCK_SIZE ||
          reg->kv_layout->n_blocks > ROUTER_MAX_KV_BLOCKS))) {
        refuse_register(r, id, id_len, reg, "context, vocabulary, block "
                        "size or KV block count out of range");
        return;
    }
    /* The same process registering again starts a new session: it has
     * dropped every sequence and reservation it held, so its old
     * registration ends here and its requests go back to the queue. */
    w = router__worker_by_rid(r, id, id_len);
    if (w != NULL && strcmp(w->key, key) != 0) {
        /* Its routing id, another key: a replay or a forgery. */
        r->foreign_msgs++;
        BT_LOG_WARN("ROUTER", "registration of %s under the routing id of "
                    "the live worker %s from another CURVE key (%s) dropped",
                    name != NULL ? name : "?", w->name, key);
        return;
    }
    if (w != NULL)
        router__worker_drop(r, w, "registered again (new session)");
    /* Another process with a live worker's name is refused: a name is
     * not a credential, and taking it over would orphan the live one.
     * A name whose holder went quiet is taken over (a restarted worker
     * with a fixed name, e.g. a Kubernetes pod). */
    w = worker_by_name(r, name);
    if (w != NULL && strcmp(w->key, key) != 0) {
        /* With CURVE a name belongs to the key that registered it for as
         * long as the registration lasts (live or quiet): another key
         * can take it only once the router dropped it. */
        char why[200];
        snprintf(why, sizeof(why), "the name %s is registered by another "
                 "CURVE key; pick another --name", name);
        refuse_register(r, id, id_len, reg, why);
        return;
    }
    if (w != NULL && now - w->last_seen_ns <= quiet) {
        char why[160];
        snprintf(why, sizeof(why), "the name %s is in use by a live worker "
                 "(pid-suffixed routing id differs); pick another --name",
                 name);
        refuse_register(r, id, id_len, reg, why);
        return;
    }
    if (w != NULL)
        router__worker_drop(r, w, "its name was registered by a new process");
    w = NULL;
    for (int i = 0; i < ROUTER_MAX_WORKERS && w == NULL; i++)
        if (!r->workers[i].used)
            w = &r->workers[i];
    if (w == NULL) {
        refuse_register(r, id, id_len, reg, "registry full");
        return;
    }
    router__worker_clear(w);
    /* A new registration: what the slot's prefix cache held is
     * forgotten; the worker sends a snapshot after its Register. */
    router_kvindex_reset(r->kvindex, (int)(w - r->workers));
    w->used = true;
    w->uid = ++r->next_worker_uid;
    snprintf(w->name, sizeof(w->name), "%s", name);
    snprintf(w->key, sizeof(w->key), "%s", key);
    memcpy(w->rid, id, id_len);
    w->rid_len = id_len;
    w->session = reg->session;
    w->registered_ns = now;
    r->t_capacity_ns = now; /* new capacity: the queue waits afresh */
    w->role = reg->role;
    w->last_seen_ns = bt_time_ns();
    w->vocab_size = reg->vocab_size;
    w->max_context = reg->max_context;
    w->unbounded_promise =
        reg->has_unbounded_promise ? (int64_t)reg->unbounded_promise : -1;
    w->admits_on_promise =
        reg->has_admits_on_promise && reg->admits_on_promise;
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
    w->can_prefill = w->role == BATON__ROLE__ROLE_DECODE && reg->can_prefill;
    w->batches = reg->has_batches && reg->batches;
    w->transports = 0;
    for (size_t i = 0; i < reg->n_transports; i++)
        if ((unsigned)reg->transports[i] < 32)
            w->transports |= 1u << (unsigned)reg->transports[i];
    snprintf(w->host_id, sizeof(w->host_id), "%s",
             reg->host_id != NULL ? reg->host_id : "");
    snprintf(w->kv_dtype, sizeof(w->kv_dtype), "%s",
             reg->kv_dtype != NULL ? reg->kv_dtype : "");
    snprintf(w->precision, sizeof(w->precision), "%s",
             proto_precision_find(reg->precision));
    w->tokenizer_id = reg->has_tokenizer_id ? reg->tokenizer_id : 0;
    w->has_gpu = reg->gpu != NULL;
    w->gpu_ipc = reg->gpu != NULL && reg->gpu->ipc;
    w->gpu_device = reg->gpu != NULL ? reg->gpu->device_index : -1;
    snprintf(w->gpu_bus, sizeof(w->gpu_bus), "%s",
             reg->gpu != NULL && reg->gpu->pci_bus_id != NULL
                 ? reg->gpu->pci_bus_id : "");
    endpoints_set(w, reg);
    BT_LOG_INFO("ROUTER", "worker %s registered: %s, vocab %u, context %u, "
                "kv %u x %u %s, precision %s, host %s%s%s", w->name,
                w->role == BATON__ROLE__ROLE_PREFILL ? "prefill"
                : w->can_prefill ? "decode+prefill" : "decode",
                w->vocab_size, w->max_context, w->total_kv, w->block_size,
                w->kv_dtype[0] ? w->kv_dtype : "-",
                w->precision[0] ? w->precision : "-",
                w->host_id[0] ? w->host_id : "?",
                w->has_gpu ? ", gpu " : "", w->gpu_bus);
    ack.has_heartbeat_ms = 1;
    ack.heartbeat_ms = (uint32_t)r->cfg.heartbeat_ms;
    ack.has_session = 1;
    ack.session = w->session;
    ack.has_router_instance = 1;
    ack.router_instance = r->instance;
    ack.has_liveness_ms = 1;
    ack.liveness_ms = (uint32_t)(r->cfg.heartbeat_ms * r->cfg.heartbeat_miss);
    ack.has_batches = 1; /* ControlBatch welcome (router_control.c) */
    ack.batches = 1;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
    msg.register_ack = &ack;
    router__send_control(r, w, &msg);
    if (w->role == BATON__ROLE__ROLE_PREFILL)
        send_kv_peers(r, w);
    else if (w->n_eps > 0)
        send_kv_peers(r, NULL);
}

/* KvEvents from w's prefix cache (docs/KV_EVENTS.md): applied to the
 * index; a gap, an unknown instance or a malformed batch empties w's
 * entry and asks w for a snapshot (at most every 500 ms: the batches
 * that arrive before it are ignored by the index anyway). */
void router__on_kv_events(router_t *r, router_worker_t *w,
                          const Baton__KvEvents *ev)
{
    int slot = (int)(w - r->workers);
    router_kvindex_result_t res = ROUTER_KVINDEX_APPLIED;
    bt_status_t status;
    uint64_t now = bt_time_ns();

    status = router_kvindex_apply_msg(r->kvindex, slot, ev, &res);
    if (status != BT_OK) {
        BT_LOG_WARN("ROUTER", "worker %s: KV events refused (%s): its "
                    "prefix index waits for a snapshot", w->name,
                    bt_status_str(status));
        bt_error_clear();
        res = ROUTER_KVINDEX_RESYNC;
    }
    if (res == ROUTER_KVINDEX_APPLIED)
        r->kv_event_batches++;
    if (res == ROUTER_KVINDEX_RESYNC &&
        now - w->kv_resync_ns >= 500ull * 1000000ull) {
        Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
        Baton__KvResyncRequest rq = BATON__KV_RESYNC_REQUEST__INIT;

        rq.instance = router_kvindex_instance(r->kvindex, slot);
        rq.has_seq_next = 1;
        rq.seq_next = router_kvindex_seq_next(r->kvindex, slot);
        msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_RESYNC;
        msg.kv_resync = &rq;
        router__send_control(r, w, &msg);
        w->kv_resync_ns = now;
        r->kv_resyncs++;
        BT_LOG_INFO("ROUTER", "worker %s: prefix index lost track of its "
                    "events: resync asked", w->name);
    }
}

void router__on_heartbeat(router_t *r, router_worker_t *w,
                          const Baton__Heartbeat *hb)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__HeartbeatAck ack = BATON__HEARTBEAT_ACK__INIT;

    /* The answer tells the worker this router still knows it. */
    ack.has_router_instance = 1;
    ack.router_instance = r->instance;
    ack.has_session = 1;
    ack.session = w->session;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_HEARTBEAT_ACK;
    msg.heartbeat_ack = &ack;
    router__send_control(r, w, &msg);
    if (hb->has_progress) {
        w->progress = hb->progress;
        w->busy_ms = hb->busy_ms;
        w->step_ms = hb->step_ms;
    }
    if (hb->has_prefill_tokens_per_s)
        w->prefill_tps = hb->prefill_tokens_per_s;
    if (w->role == BATON__ROLE__ROLE_DECODE) {
        w->hb_free_kv = hb->free_kv_blocks;
        w->total_kv = hb->total_kv_blocks;
        w->est_free_kv = (int64_t)hb->free_kv_blocks - w->pending_reserve;
        if (hb->has_recv_frees && hb->recv_frees != w->recv_frees) {
            w->recv_frees = hb->recv_frees;
            w->recv_full_until = 0; /* receive room came free: probe */
        }
    }
    w->hb_running = hb->running;
    w->has_prefix = hb->has_prefix_cached_blocks;
    w->prefix_cached = hb->prefix_cached_blocks;
    w->has_prefix_host = hb->has_prefix_host_cached_blocks;
    w->prefix_host_cached = hb->prefix_host_cached_blocks;
    w->prefix_hit_rate = hb->has_prefix_hit_rate ? hb->prefix_hit_rate : 0;
    if (hb->draining && !w->draining) {
        BT_LOG_INFO("ROUTER", "worker %s is draining", w->name);
        w->draining = true;
    }
}
