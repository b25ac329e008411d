/*
 * prefill.c - the prefill worker's loop, batcher and KV hand-off (see
 * prefill.h).
 */
#include "prefill.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "kv/kv_link.h"
#include "params_proto.h"
#include "proto_msg.h"
#include "workerproc.h"
#include "workerproc_intake.h"
#include "workerproc_metrics.h"
#include "workerproc_opts.h"
#include "workerproc_prefix.h"

#define PREFILL_NAME_MAX 64
#define PREFILL_MAX_ENDPOINTS 256 /* KvPeers entries read */
/* Prefix cache events go to the router at most this often (batched). */
#define PREFILL_KV_EVENTS_MS 20

typedef enum {
    PREFILL_TASK_WAITING = 0, /* not started (needs KV blocks) */
    PREFILL_TASK_RUNNING,     /* chunks being fed */
    PREFILL_TASK_COMMITTING,  /* KV hand-off committed, not landed */
    PREFILL_TASK_DONE,        /* reply sent; to be freed */
} prefill_task_state_t;

typedef struct prefill_task_s prefill_task_t;
struct prefill_task_s {
    uint64_t id;
    prefill_task_state_t state;
    workerproc_prompt_t p; /* the admitted prompt (+ resumed tokens) */
    int n_fed;            /* tokens already in the local KV */
    int *blocks;          /* (n_blocks) local block table */
    int n_blocks;
    sampler_params_t sp;
    uint64_t epoch;
    uint8_t cap[PROTO_CAPABILITY_BYTES]; /* the grant's capability,
                           presented back in PrefillDone (issue 42) */
    size_t cap_len;       /* 0: the grant carried none */
    kv_link_xfer_t *xfer; /* the KV hand-off (NULL: null model) */
    int held_blocks;      /* the grant's leading blocks the decode worker
                             holds already (its prefix cache): not sent */
    int dst_blocks;       /* the grant's blocks */
    bool final_in_batch;  /* its last chunk is in the running forward */
    int first_token;
    bool has_lp;          /* lp is first_token's (sp.logprobs) */
    sampler_logprobs_t lp;
    sampler_prompt_lp_t *plp; /* the prompt's logprobs (sp.prompt_logprobs:
                           every chunk has a row per position), or NULL */
    bool lp_rows;         /* its chunk in the running forward has them */
    char first_text[256];
    size_t first_text_len;
    uint64_t t_start;
    uint64_t t_computed;
    uint64_t transfer_ns; /* spent shipping layers (while computing) */
    float *feat;          /* (dim) spec_features: last token's hidden */
    /* Prefix cache (issue 38): the prompt's chain under its salt; its
     * leading cached blocks are matched when its blocks are taken, its
     * full blocks cached as they are computed. */
    kv_prefix_cursor_t pcur;
    int n_hit;            /* prompt tokens found cached (not computed) */
    prefill_task_t *next;
};

/* Prompt logprobs take a logits row per prompt position: one such task a
 * forward, at most this many tokens of it. */
#define PREFILL_LP_ROWS 64

struct prefill_s {
    prefill_config_t cfg;
    char name[PREFILL_NAME_MAX];
    engine_t *engine;     /* NULL with --null-model */
    int vocab;
    int max_context;
    int block_size;
    int n_layers;
    void *ctx;
    void *sock;           /* DEALER to the router */
    proto_batch_t outbox; /* this turn's PrefillDones (and failures), sent
                           * as one message (issue 42); zeroed = empty */
    kv_link_sender_t *links; /* the KV links (NULL: null model) */
    workerproc_prefix_t *prefix; /* the pool's prefix cache (NULL: off, or
                                 the null model) */
    bool kv_on_device;    /* backend KV in GPU memory (cuda) */
    volatile sig_atomic_t stop;
    bool draining;
    workerproc_link_t *link;  /* sessions, acks, the heartbeat thread */
    double tps;               /* prefill tokens/s, moving average (the
                                 router's prefill deadlines use it) */
    prefill_task_t *head; /* tasks in arrival order */
    prefill_task_t *tail;
    float *logits;        /* (logits_rows, vocab) */
    float *hidden;        /* (logits_rows, dim) spec_features only */
    int logits_rows;      /* max_seqs, + PREFILL_LP_ROWS once a task
                             wanted prompt logprobs */
    int dim;
    backend_seq_t *bseqs; /* (max_seqs) */
    prefill_task_t **btasks; /* (max_seqs) task of each batch row */
    int n_batch;
    uint64_t served;
};

void prefill_config_init(prefill_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->metrics_port = -1; /* metrics hook */
    cfg->metrics_host = "127.0.0.1";
    cfg->router = "tcp://127.0.0.1:5556";
    engine_config_init(&cfg->engine);
    cfg->chunk_tokens = 512;
    cfg->use_ucx = true;
    cfg->commit_timeout_ms = 5000;
    cfg->use_cuda_ipc = true;
    cfg->kv_stage = true;
    cfg->kv_stage_direct = true;
    cfg->prefix_cache = true;
    /* Sized from memory (issue 36), but a prefill pool only holds the
     * prompts in flight: at most PREFILL_KV_AUTO_CONTEXTS full contexts
     * (Llama-3-8B: 64k tokens, 8 GiB), so that a decode worker sharing
     * the GPU keeps the rest. */
    cfg->engine.backend.n_kv_blocks = 0;
    cfg->engine.backend.kv_auto_contexts = PREFILL_KV_AUTO_CONTEXTS;
}

// ---------------------------------------------------------------------------
// Messages to the router

static void drop_all(prefill_t *pf);

/* Sends what the outbox holds, as one ControlBatch when the router takes
 * them: CURVE boxes one message per loop turn (the PrefillDones of a
 * batch of prompts), not one per request (issue 42). */
static void send_outbox(prefill_t *pf)
{
    workerproc_send_batch(pf->sock, &pf->outbox,
                          workerproc_link_batches(pf->link));
}

/* Queues a PrefillDone in the outbox (sent within this loop turn). */
static void queue_done(prefill_t *pf, Baton__PrefillDone *done)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;

    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE;
    msg.prefill_done = done;
    workerproc_queue(pf->sock, &pf->outbox,
                     workerproc_link_batches(pf->link), &msg);
}

/* Every Register starts a new session (workerproc_link.h): the tasks of
 * the old one are dropped first (the router resumes them). */
static void send_register(prefill_t *pf)
{
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_PREFILL, .name = pf->name,
        .engine = pf->engine, .ecfg = &pf->cfg.engine, .vocab = pf->vocab,
        .max_context = pf->max_context, .host_id = pf->cfg.host_id,
        .kv_on_device = pf->kv_on_device,
    };
    workerproc_register_t r;
    int ids[KV_LINK_N_IDS];

    drop_all(pf);
    if (pf->links != NULL) {
        rc.links = ids;
        rc.n_links = kv_link_sender_offers(pf->links, ids, KV_LINK_N_IDS);
    }
    if (pf->prefix != NULL) /* the router's index starts over */
        workerproc_prefix_want_snapshot(pf->prefix);
    workerproc_register_init(&r, &rc);
    r.reg.has_session = 1;
    r.reg.session = workerproc_link_begin_session(pf->link);
    send_outbox(pf); /* the old session's last words go first */
    workerproc_send_register(pf->sock, &r.reg);
}

/* Publishes what the heartbeats say (the link's thread sends them). */
static void publish_beat(prefill_t *pf)
{
    workerproc_beat_t b;

    memset(&b, 0, sizeof(b));
    for (prefill_task_t *t = pf->head; t; t = t->next) {
        b.outstanding += (uint64_t)(t->p.n_tokens - t->n_fed);
        if (t->state == PREFILL_TASK_WAITING)
            b.waiting++;
        else
            b.running++;
    }
    b.draining = pf->draining;
    if (pf->engine != NULL) {
        kv_allocator_t *kv = engine_kv(pf->engine);
        b.has_kv = true;
        b.free_kv = (uint32_t)kv_allocator_free_count(kv);
        b.total_kv = (uint32_t)kv_allocator_total(kv);
    }
    b.prefill_tokens_per_s = pf->tps;
    if (pf->prefix != NULL)
        workerproc_prefix_beat(pf->prefix, &b);
    workerproc_link_publish(pf->link, &b, false);
}

static void send_failure(prefill_t *pf, uint64_t id, uint64_t epoch,
                         Baton__ErrorCode code, const char *text)
{
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;

    workerproc_prefill_failure_init(&done, id, epoch, code, text);
    queue_done(pf, &done);
}

static void send_done(prefill_t *pf, prefill_task_t *t)
{
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;
    ProtobufCBinaryData kv[2 * 512];
    uint64_t now = bt_time_ns();
    double kv_bytes = 0; /* metrics: what the hand-off moved */
    bool remote = t->xfer != NULL && kv_link_xfer_is_remote(t->xfer);
    uint8_t *const *parts = NULL;
    size_t part_len = 0;
    int n_parts = t->xfer != NULL ? kv_link_xfer_payload(t->xfer, &parts,
                                                         &part_len) : 0;
    uint64_t transfer_us;

    /* Time spent moving KV: issuing the layer puts (over shared memory
     * they are the copies themselves, overlapped with later layers'
     * compute) plus the commit after the last layer; inline: packing. */
    transfer_us = (t->transfer_ns + (remote ? now - t->t_computed : 0)) /
                  1000;
    if (remote && pf->engine != NULL) {
        const kv_layout_t *lay = backend_kv_layout(engine_backend(pf->engine));
        double bytes = 2.0 * pf->n_layers * (double)kv_layout_block_bytes(lay) *
                       backend_tp_size(engine_backend(pf->engine)) *
                       (BT_DIV_UP(t->p.n_tokens, pf->block_size) -
                        t->held_blocks);
        BT_LOG_DEBUG("KV", "kv_handoff request:%llu tokens:%d bytes:%.0f "
                     "put_us:%.1f commit_us:%.1f",
                     (unsigned long long)t->id, t->p.n_tokens, bytes,
                     t->transfer_ns / 1e3, (now - t->t_computed) / 1e3);
        kv_bytes = bytes;
    }
    if (n_parts > 0 && n_parts <= (int)BT_ARRAY_SIZE(kv)) {
        for (int i = 0; i < n_parts; i++) {
            kv[i].data = parts[i];
            kv[i].len = part_len;
        }
        done.n_kv_inline = (size_t)n_parts;
        done.kv_inline = kv;
        kv_bytes = (double)n_parts * (double)part_len;
    }
    if (t->feat != NULL) {
        done.has_spec_feature = 1;
        done.spec_feature.data = (uint8_t *)t->feat;
        done.spec_feature.len = sizeof(float) * (size_t)pf->dim;
    }
    workerproc_prefill_done_logprobs(&done, t->has_lp ? &t->lp : NULL);
    workerproc_prefill_done_prompt_logprobs(&done, t->plp);
    workerproc_prefill_done_init(&done, t->id, &t->p, t->first_token,
                                 t->first_text, t->first_text_len, t->epoch,
                                 t->cap, t->cap_len,
                                 (t->t_computed - t->t_start) / 1000,
                                 transfer_us);
    queue_done(pf, &done);
    pf->served++;
    if (pf->engine != NULL) { /* metrics hook */
        workerproc_metrics_handoff(pf->cfg.metrics, (uint64_t)kv_bytes,
                                   (double)transfer_us * 1e-6);
        workerproc_metrics_kv_blocks(
            pf->cfg.metrics, true,
            (uint64_t)BT_MAX(t->dst_blocks - t->held_blocks, 0),
            (uint64_t)t->held_blocks);
    }
}

// ---------------------------------------------------------------------------
// Tasks

static void task_free_kv(prefill_t *pf, prefill_task_t *t)
{
    if (t->n_blocks > 0 && pf->engine != NULL)
        kv_allocator_release(engine_kv(pf->engine), t->n_blocks, t->blocks);
    t->n_blocks = 0;
}

static void task_destroy(prefill_t *pf, prefill_task_t *t)
{
    task_free_kv(pf, t);
    kv_link_xfer_destroy(&t->xfer); /* cancels one in flight */
    workerproc_prompt_cleanup(&t->p);
    bt_free(t->blocks);
    bt_free(t->feat);
    sampler_prompt_lp_destroy(&t->plp);
    bt_free(t);
}

static void task_unlink(prefill_t *pf, prefill_task_t *t)
{
    prefill_task_t **pp = &pf->head;
    prefill_task_t *prev = NULL;

    while (*pp != NULL && *pp != t) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp == NULL)
        return;
    *pp = t->next;
    if (pf->tail == t)
        pf->tail = prev;
}

/* The task's KV hand-off over the link the router chose (its route's
 * endpoint); the link layer falls back to inline when it does not fit. */
static bt_status_t task_route(prefill_t *pf, prefill_task_t *t,
                              const Baton__PrefillTask *m, int dst_block_size)
{
    const Baton__KvGrant *g = m->grant;
    const Baton__KvEndpoint *ep = m->route;
    kv_link_route_t r = {
        .request_id = t->id,
        .transport = m->has_transport ? (int)m->transport : -1,
        .slot = g->has_slot ? g->slot : -1,
        .epoch = g->epoch,
        .dst_blocks = g->block_ids,
        .n_dst = (int)g->n_block_ids,
        .stage_blocks = g->stage_block_ids,
        .n_stage = (int)g->n_stage_block_ids,
        .ucx_window = g->has_ucx_window ? g->ucx_window.data : NULL,
        .ucx_window_len = g->has_ucx_window ? g->ucx_window.len : 0,
        .cipc_window = g->has_cipc_window ? g->cipc_window.data : NULL,
        .cipc_window_len = g->has_cipc_window ? g->cipc_window.len : 0,
        .dst_block_size = dst_block_size,
        .n_tokens = t->p.n_tokens,
        .first_block = t->held_blocks,
    };

    /* an endpoint of another link than the route's is not used */
    if (ep != NULL && ep->has_desc && ep->has_transport &&
        (int)ep->transport == kv_link_endpoint_id(r.transport)) {
        r.desc = ep->desc.data;
        r.desc_len = ep->desc.len;
    }
    return kv_link_xfer_create(pf->links, &r, &t->xfer);
}

static void on_task(prefill_t *pf, const Baton__PrefillTask *m)
{
    const Baton__KvGrant *g = m->grant;
    workerproc_intake_t in = {
        .engine = pf->engine, .vocab = pf->vocab,
        .max_context = pf->max_context,
    };
    prefill_task_t *t;
    int dst_block_size;
    char err[256];
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INVALID;

    if (g == NULL || !g->ok || g->n_block_ids == 0) {
        send_failure(pf, m->request_id, g != NULL ? g->epoch : 0,
                     BATON__ERROR_CODE__ERROR_INTERNAL,
                     "prefill task without a KV grant");
        return;
    }
    t = bt_calloc(1, sizeof(*t), "prefill_task");
    if (t == NULL) {
        send_failure(pf, m->request_id, g->epoch,
                     BATON__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    t->id = m->request_id;
    t->t_start = bt_time_ns();
    t->epoch = g->epoch;
    if (g->has_capability && g->capability.len == sizeof(t->cap)) {
        memcpy(t->cap, g->capability.data, sizeof(t->cap));
        t->cap_len = sizeof(t->cap);
    }
    dst_block_size = g->kv_layout ? (int)g->kv_layout->block_size : 0;
    params_sampling_from_proto(m->sampling, &t->sp);
    in.reserved_tokens = dst_block_size > 0
        ? (int)BT_MIN(g->n_block_ids * (size_t)dst_block_size,
                      (size_t)INT_MAX) : 0;
    if (workerproc_intake_prompt(&in, m, &t->p, &code, err, sizeof(err)) !=
        BT_OK)
        goto fail;
    /* The decode worker holds the grant's first cached_blocks already
     * (issue 38): only the rest moves.  At least the last token's block
     * moves, so a grant saying otherwise is not this prompt's. */
    t->dst_blocks = (int)BT_MIN(g->n_block_ids, (size_t)INT_MAX);
    if (g->has_cached_blocks && g->cached_blocks > 0) {
        if (dst_block_size <= 0 || g->cached_blocks >= g->n_block_ids ||
            (int64_t)g->cached_blocks * dst_block_size >= t->p.n_tokens) {
            code = BATON__ERROR_CODE__ERROR_INTERNAL;
            snprintf(err, sizeof(err), "KV grant holds %u cached blocks of "
                     "%zu for a %d-token prompt", g->cached_blocks,
                     g->n_block_ids, t->p.n_tokens);
            goto fail;
        }
        t->held_blocks = (int)g->cached_blocks;
    }
    if (pf->engine != NULL && sampler_params_validate(&t->sp) != BT_OK) {
        snprintf(err, sizeof(err), "%s", bt_error_last());
        goto fail;
    }
    if (pf->engine != NULL && t->sp.prompt_logprobs &&
        sampler_prompt_lp_create(t->p.n_tokens, t->sp.prompt_top_logprobs,
                                 &t->plp) != BT_OK) {
        snprintf(err, sizeof(err), "out of memory");
        goto fail;
    }
    if (pf->prefix != NULL)
        kv_prefix_cursor_init(&t->pcur, workerproc_prefix_root(
                                  pf->prefix, m->has_cache_salt,
                                  &m->cache_salt));
    if (pf->engine != NULL) {
        bt_status_t rs = task_route(pf, t, m, dst_block_size);
        if (rs != BT_OK) {
            /* too much KV for inline with no other link, or memory */
            code = BATON__ERROR_CODE__ERROR_WORKER;
            snprintf(err, sizeof(err), "%s",
                     rs == BT_ERR_NO_RESOURCE ? bt_error_last()
                                              : "out of memory");
            bt_error_clear();
            goto fail;
        }
        t->blocks = bt_malloc((size_t)BT_DIV_UP(t->p.n_tokens, pf->block_size) *
                                  sizeof(int), "prefill_blocks");
        if (t->blocks == NULL) {
            snprintf(err, sizeof(err), "out of memory");
            goto fail;
        }
    }
    if (pf->tail)
        pf->tail->next = t;
    else
        pf->head = t;
    pf->tail = t;
    return;

fail:
    send_failure(pf, m->request_id, g->epoch, code, err);
    task_destroy(pf, t);
}

static void on_cancel(prefill_t *pf, uint64_t id)
{
    for (prefill_task_t *t = pf->head; t; t = t->next) {
        if (t->id == id && t->state != PREFILL_TASK_COMMITTING) {
            task_unlink(pf, t);
            task_destroy(pf, t);
            return;
        }
    }
}

/* Drops every task of the old session (send_register).  A task whose
 * commit is in flight finishes on its own: its PrefillDone names an
 * attempt the router has given up, and is ignored there. */
static void drop_all(prefill_t *pf)
{
    int n = 0;

    for (prefill_task_t *t = pf->head, *next; t; t = next) {
        next = t->next;
        if (t->state == PREFILL_TASK_COMMITTING)
            continue;
        task_unlink(pf, t);
        task_destroy(pf, t);
        n++;
    }
    if (n > 0)
        BT_LOG_WARN("PREFILL", "%s: new session: dropped %d tasks of the old "
                    "one (the router resumes them)", pf->name, n);
}

static void on_kv_peers(prefill_t *pf, const Baton__KvPeers *m);

/* workerproc_handlers_t.on_msg: the prefill role's message kinds. */
static workerproc_msg_t on_msg(void *arg, Baton__ControlMessage *msg)
{
    prefill_t *pf = arg;

    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK:
        on_task(pf, msg->prefill_task);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_CANCEL_TASK:
        on_cancel(pf, msg->cancel_task->request_id);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_PEERS:
        on_kv_peers(pf, msg->kv_peers);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_RESYNC:
        if (pf->prefix != NULL)
            workerproc_prefix_on_resync(pf->prefix, msg->kv_resync);
        return WORKERPROC_MSG_DONE;
    default:
        return WORKERPROC_MSG_UNKNOWN;
    }
}

static void handle_messages(prefill_t *pf)
{
    workerproc_handlers_t h = {
        .sock = pf->sock, .link = pf->link, .stop = &pf->stop,
        .on_msg = on_msg, .arg = pf,
    };

    workerproc_handle_messages(&h);
}

/* KvPeers: the router's complete list of decode endpoints; the links
 * connect to new ones now, off any request's critical path, and drop
 * those no longer listed (their decode worker is gone). */
static void on_kv_peers(prefill_t *pf, const Baton__KvPeers *m)
{
    kv_link_endpoint_t eps[PREFILL_MAX_ENDPOINTS];
    int n = 0;

    if (pf->links == NULL)
        return;
    for (size_t i = 0; i < m->n_endpoints && n < PREFILL_MAX_ENDPOINTS;
         i++) {
        const Baton__KvEndpoint *e = m->endpoints[i];
        if (e == NULL || !e->has_transport || !e->has_desc ||
            e->desc.len == 0)
            continue;
        eps[n].transport = (int)e->transport;
        eps[n].desc = e->desc.data;
        eps[n].len = e->desc.len;
        n++;
    }
    kv_link_sender_sync(pf->links, eps, n);
}

// ---------------------------------------------------------------------------
// Compute

/* backend_batch_t.on_layer_done: ship layer `layer` of every prompt whose
 * last chunk is in this forward, while the next layer computes. */
static void on_layer_done(void *arg, int layer)
{
    prefill_t *pf = arg;

    for (int b = 0; b < pf->n_batch; b++) {
        prefill_task_t *t = pf->btasks[b];
        uint64_t t0 = bt_time_ns();
        if (!t->final_in_batch)
            continue;
        kv_link_xfer_layer(t->xfer, layer);
        t->transfer_ns += bt_time_ns() - t0;
    }
}

static bt_status_t sample_first(prefill_t *pf, prefill_task_t *t,
                                float *logits)
{
    sampler_t *sampler = NULL;
    bt_status_t status;

    status = workerproc_intake_sampler(&t->sp, pf->vocab, &t->p, &sampler);
    if (status != BT_OK)
        return status;
    t->first_token = sampler_sample(sampler, logits);
    if (sampler_last_logprobs(sampler) != NULL) {
        t->lp = *sampler_last_logprobs(sampler);
        t->has_lp = true;
    }
    sampler_destroy(&sampler);
    return BT_OK;
}

/* A task whose prompt is computed: commit the KV hand-off, or reply now
 * when nothing is left to wait for (inline). */
static void task_computed(prefill_t *pf, prefill_task_t *t)
{
    bt_status_t status;

    t->t_computed = bt_time_ns();
    t->first_text_len = workerproc_intake_first_text(
        pf->engine, &t->p, t->first_token, t->sp.skip_special_tokens,
        t->first_text, sizeof(t->first_text));
    status = kv_link_xfer_commit(t->xfer);
    if (status == BT_IN_PROGRESS) {
        t->state = PREFILL_TASK_COMMITTING;
        return;
    }
    if (status == BT_OK)
        send_done(pf, t);
    else
        send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                     kv_link_xfer_error(t->xfer));
    t->state = PREFILL_TASK_DONE;
}

static bool has_waiting(prefill_t *pf)
{
    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->state == PREFILL_TASK_WAITING)
            return true;
    return false;
}

static void run_null(prefill_t *pf)
{
    if (pf->cfg.step_delay_ms > 0 && has_waiting(pf))
        usleep((useconds_t)pf->cfg.step_delay_ms * 1000u);
    for (prefill_task_t *t = pf->head; t; t = t->next) {
        if (t->state != PREFILL_TASK_WAITING)
            continue;
        workerproc_metrics_step(pf->cfg.metrics, 1, 0, /* metrics hook */
                                (uint64_t)(t->p.n_tokens - t->n_fed), 0);
        t->n_fed = t->p.n_tokens;
        t->first_token = proto_null_next_token(t->p.tokens[t->p.n_tokens - 1],
                                               t->p.n_tokens);
        t->t_computed = bt_time_ns();
        send_done(pf, t);
        t->state = PREFILL_TASK_DONE;
    }
}

/* Makes room for PREFILL_LP_ROWS more logits (and hidden) rows, once. */
static bt_status_t grow_logits(prefill_t *pf)
{
    int want = pf->cfg.engine.backend.max_seqs + PREFILL_LP_ROWS;
    float *l, *h = NULL;

    if (pf->logits_rows >= want)
        return BT_OK;
    l = bt_malloc((size_t)want * (size_t)pf->vocab * sizeof(float),
                  "prefill_logits");
    if (pf->hidden != NULL)
        h = bt_malloc((size_t)want * (size_t)pf->dim * sizeof(float),
                      "prefill_logits");
    if (l == NULL || (pf->hidden != NULL && h == NULL)) {
        bt_free(l);
        bt_free(h);
        BT_LOG_WARN("PREFILL", "no memory for prompt logprobs rows: "
                    "waiting");
        return BT_ERR_NO_MEMORY;
    }
    bt_free(pf->logits);
    pf->logits = l;
    if (h != NULL) {
        bt_free(pf->hidden);
        pf->hidden = h;
    }
    pf->logits_rows = want;
    return BT_OK;
}

/* A task took its blocks: the prompt's leading full blocks this pool's
 * prefix cache holds (same identity and salt) replace the first ones, so
 * only the suffix is computed, attending to them; never the last token's
 * block (it is computed to sample from).  Not with prompt logprobs: every
 * position's logits are computed then (its blocks are still cached).  The
 * hand-off sends the same bytes either way. */
static void task_match(prefill_t *pf, prefill_task_t *t)
{
    if (pf->prefix == NULL || t->plp != NULL)
        return;
    /* the cursor hashed nothing yet: its last hash is the root */
    t->n_hit = workerproc_prefix_adopt(pf->prefix, t->pcur.last,
                                       t->p.tokens, t->p.n_tokens, t->blocks,
                                       t->n_blocks);
    t->n_fed = t->n_hit;
    if (t->n_hit > 0)
        BT_LOG_DEBUG("KV", "request %llu: %d of %d prompt tokens cached",
                     (unsigned long long)t->id, t->n_hit, t->p.n_tokens);
}

/* One batched forward over the waiting and running prompts. */
static void run_batch(prefill_t *pf)
{
    const backend_config_t *bcfg = &pf->cfg.engine.backend;
    kv_allocator_t *kv = engine_kv(pf->engine);
    int budget = bcfg->max_batch_tokens, rows = 0;
    bool lp_used = false;
    uint64_t t0;
    backend_batch_t batch;
    bt_status_t status;

    pf->n_batch = 0;
    for (prefill_task_t *t = pf->head; t && pf->n_batch < bcfg->max_seqs &&
                                       budget > 0; t = t->next) {
        backend_seq_t *bs;
        int take;

        if (t->state == PREFILL_TASK_WAITING) {
            int need = BT_DIV_UP(t->p.n_tokens, pf->block_size);
            if (kv_allocator_alloc(kv, need, t->blocks) != BT_OK)
                break; /* wait for blocks; keep arrival order */
            t->n_blocks = need;
            task_match(pf, t);
            kv_link_xfer_start(t->xfer, t->blocks, need);
            if (kv_link_xfer_failed(t->xfer)) { /* before any compute */
                send_failure(pf, t->id, t->epoch,
                             BATON__ERROR_CODE__ERROR_WORKER,
                             kv_link_xfer_error(t->xfer));
                t->state = PREFILL_TASK_DONE;
                continue;
            }
            t->state = PREFILL_TASK_RUNNING;
        }
        if (t->state != PREFILL_TASK_RUNNING)
            continue;
        take = BT_MIN(t->p.n_tokens - t->n_fed,
                      BT_MIN(budget, pf->cfg.chunk_tokens));
        if (take <= 0)
            continue;
        t->lp_rows = false;
        if (t->plp != NULL) {
            if (lp_used || grow_logits(pf) != BT_OK)
                continue; /* the next forward */
            lp_used = true;
            t->lp_rows = true;
            take = BT_MIN(take, PREFILL_LP_ROWS);
        }
        bs = &pf->bseqs[pf->n_batch];
        memset(bs, 0, sizeof(*bs));
        bs->n_tokens = take;
        bs->ctx_len = t->n_fed;
        bs->tokens = t->p.tokens + t->n_fed;
        bs->block_table = t->blocks;
        t->final_in_batch = t->n_fed + take == t->p.n_tokens;
        bs->n_logits = t->lp_rows ? take : t->final_in_batch ? 1 : 0;
        rows += bs->n_logits;
        pf->btasks[pf->n_batch++] = t;
        budget -= take;
    }
    if (pf->n_batch == 0)
        return;
    t0 = bt_time_ns();
    if (pf->cfg.step_delay_ms > 0)
        usleep((useconds_t)pf->cfg.step_delay_ms * 1000u);
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = pf->n_batch;
    batch.seqs = pf->bseqs;
    batch.on_layer_done = on_layer_done;
    batch.on_layer_arg = pf;
    status = backend_forward(engine_backend(pf->engine), &batch, pf->logits,
                             pf->hidden);
    if (status == BT_OK && bt_time_ns() > t0) {
        double rate = (double)(bcfg->max_batch_tokens - budget) * 1e9 /
                      (double)(bt_time_ns() - t0);
        pf->tps = pf->tps > 0 ? 0.8 * pf->tps + 0.2 * rate : rate;
    }
    workerproc_metrics_step(pf->cfg.metrics, pf->n_batch, /* metrics hook */
                            (double)(bt_time_ns() - t0) * 1e-9,
                            status == BT_OK
                                ? (uint64_t)(bcfg->max_batch_tokens - budget)
                                : 0, 0);
    for (int b = 0, row = 0; b < pf->n_batch; b++) {
        prefill_task_t *t = pf->btasks[b];
        if (status != BT_OK) {
            send_failure(pf, t->id, t->epoch,
                         BATON__ERROR_CODE__ERROR_WORKER, bt_error_last());
            t->state = PREFILL_TASK_DONE;
            continue;
        }
        t->n_fed += pf->bseqs[b].n_tokens;
        if (pf->prefix != NULL) /* its blocks that became full */
            workerproc_prefix_insert(pf->prefix, &t->pcur, t->p.tokens,
                                     t->n_fed, t->blocks);
        if (t->lp_rows) {
            /* the rows of prompt positions; a final chunk's last row
             * samples (below) */
            int n_lp = pf->bseqs[b].n_logits - (t->final_in_batch ? 1 : 0);
            sampler_prompt_lp_rows(t->plp,
                                   pf->logits + (size_t)row * pf->vocab,
                                   pf->vocab, t->p.tokens,
                                   t->n_fed - pf->bseqs[b].n_tokens, n_lp);
            row += n_lp;
            t->lp_rows = false;
        }
        if (!t->final_in_batch)
            continue;
        if (sample_first(pf, t, pf->logits + (size_t)row * pf->vocab) !=
            BT_OK) {
            send_failure(pf, t->id, t->epoch,
                         BATON__ERROR_CODE__ERROR_INVALID, bt_error_last());
            t->state = PREFILL_TASK_DONE;
        } else {
            if (pf->hidden != NULL && t->feat == NULL) {
                t->feat = bt_malloc(sizeof(float) * (size_t)pf->dim,
                                    "prefill_task");
                if (t->feat != NULL)
                    memcpy(t->feat, pf->hidden + (size_t)row * pf->dim,
                           sizeof(float) * (size_t)pf->dim);
            }
            task_computed(pf, t);
        }
        row++;
        t->final_in_batch = false;
    }
    (void)rows;
}

static void reap(prefill_t *pf)
{
    uint64_t limit = (uint64_t)pf->cfg.commit_timeout_ms * 1000000ull;

    for (prefill_task_t *t = pf->head, *next; t != NULL; t = next) {
        next = t->next;
        if (t->state == PREFILL_TASK_COMMITTING) {
            bt_status_t status = kv_link_xfer_poll(t->xfer, limit);
            if (status == BT_OK)
                send_done(pf, t);
            else if (status != BT_IN_PROGRESS)
                send_failure(pf, t->id, t->epoch,
                             BATON__ERROR_CODE__ERROR_WORKER,
                             kv_link_xfer_error(t->xfer));
            if (status != BT_IN_PROGRESS)
                t->state = PREFILL_TASK_DONE;
        }
        if (t->state == PREFILL_TASK_DONE) {
            task_unlink(pf, t);
            task_destroy(pf, t);
        }
    }
}

static bool has_runnable(prefill_t *pf)
{
    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->state == PREFILL_TASK_RUNNING ||
            (t->state == PREFILL_TASK_WAITING &&
             (pf->engine == NULL ||
              kv_allocator_free_count(engine_kv(pf->engine)) >=
                  BT_DIV_UP(t->p.n_tokens, pf->block_size))))
            return true;
    return false;
}

/* A hand-off whose commit completes in microseconds whatever the decode
 * worker does (device copies) and began moments ago: the loop spins on
 * it rather than sleeping a 1 ms poll tick on the first-token path
 * (measured: the tick cost ~1.1 ms in most hand-offs). */
static bool has_spinning_commit(prefill_t *pf)
{
    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->state == PREFILL_TASK_COMMITTING && kv_link_xfer_spins(t->xfer))
            return true;
    return false;
}

static bool has_committing(prefill_t *pf)
{
    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->state == PREFILL_TASK_COMMITTING)
            return true;
    return false;
}

// ---------------------------------------------------------------------------
// Lifecycle

/* Frees what prefill_create() set up around the engine: the KV links,
 * the batch buffers and the engine.  Both the error path and
 * prefill_destroy() end with it. */
static void engine_teardown(prefill_t *pf)
{
    kv_link_sender_destroy(&pf->links); /* bounded wait for what flies */
    workerproc_prefix_destroy(&pf->prefix); /* the tasks are gone */
    bt_free(pf->logits);
    bt_free(pf->hidden);
    bt_free(pf->bseqs);
    bt_free(pf->btasks);
    engine_destroy(&pf->engine);
}

/* The KV links this worker can send over (kv_link.h); one that cannot
 * start is left out with a warning and its hand-offs go inline. */
static bt_status_t links_setup(prefill_t *pf)
{
    const prefill_config_t *cfg = &pf->cfg;
    kv_link_config_t lc = {
        .backend = engine_backend(pf->engine),
        .kv_on_device = pf->kv_on_device,
        .device_index = cfg->engine.backend.device_index,
        .use_ucx = cfg->use_ucx,
        .ucx_peer_errors = cfg->ucx_peer_errors,
        .use_cuda_ipc = cfg->use_cuda_ipc,
        .kv_stage = cfg->kv_stage,
        .kv_stage_direct = cfg->kv_stage_direct,
        .kv_stage_host = cfg->kv_stage_host,
        .kv_stage_blocks = cfg->kv_stage_blocks,
    };

    return kv_link_sender_create(&lc, &pf->links);
}

bt_status_t prefill_create(const prefill_config_t *cfg, prefill_t **pf_p)
{
    prefill_t *pf;
    bt_status_t status;

    pf = bt_calloc(1, sizeof(*pf), "prefill");
    if (pf == NULL)
        return BT_ERR_NO_MEMORY;
    pf->cfg = *cfg;
    workerproc_name_init(pf->name, sizeof(pf->name), cfg->name, "prefill");
    if (cfg->chunk_tokens <= 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "PREFILL",
                          "--chunk-tokens must be positive");
        goto err_free;
    }
    if (cfg->null_model) {
        pf->vocab = PROTO_NULL_VOCAB;
        pf->max_context = PROTO_NULL_CONTEXT;
        pf->block_size = cfg->engine.backend.block_size;
    } else {
        const model_config_t *mc;
        const backend_config_t *b;
        status = engine_create(&cfg->engine, &pf->engine);
        if (status != BT_OK)
            goto err_free;
        /* the sizes the backend chose */
        pf->cfg.engine.backend = engine_config(pf->engine)->backend;
        b = &pf->cfg.engine.backend;
        mc = model_config(engine_model(pf->engine));
        pf->vocab = mc->vocab_size;
        pf->max_context = engine_max_context(pf->engine);
        pf->block_size = engine_block_size(pf->engine);
        pf->n_layers = mc->n_layers;
        pf->logits = bt_malloc((size_t)b->max_seqs * (size_t)pf->vocab *
                                   sizeof(float), "prefill_logits");
        pf->bseqs = bt_calloc((size_t)b->max_seqs, sizeof(*pf->bseqs),
                              "prefill_batch");
        pf->btasks = bt_calloc((size_t)b->max_seqs, sizeof(*pf->btasks),
                               "prefill_batch");
        pf->dim = mc->dim;
        pf->logits_rows = b->max_seqs;
        if (cfg->spec_features)
            pf->hidden = bt_malloc((size_t)b->max_seqs * (size_t)pf->dim *
                                       sizeof(float), "prefill_logits");
        if (pf->logits == NULL || pf->bseqs == NULL || pf->btasks == NULL ||
            (cfg->spec_features && pf->hidden == NULL)) {
            status = BT_ERR_NO_MEMORY;
            goto err_engine;
        }
        pf->kv_on_device =
            strcmp(backend_name(engine_backend(pf->engine)), "cuda") == 0;
        status = links_setup(pf);
        if (status != BT_OK)
            goto err_engine;
        if (cfg->prefix_cache) {
            status = workerproc_prefix_create(pf->engine, &cfg->engine,
                                              &pf->prefix);
            if (status != BT_OK)
                goto err_engine;
        }
    }
    if (pf->engine != NULL) {
        const backend_config_t *b = &pf->cfg.engine.backend;

        BT_LOG_INFO("PREFILL", "%s KV capacity: %d blocks of %d tokens = "
                    "%lld tokens (%s)", pf->name, b->n_kv_blocks,
                    b->block_size, (long long)b->n_kv_blocks * b->block_size,
                    cfg->engine.backend.n_kv_blocks > 0 ? "--kv-blocks"
                                                        : "sized from memory");
        /* Warm before the router hears of this worker (issue 36). */
        if (workerproc_opts_warmup_wanted(cfg->warmup,
                                     backend_name(engine_backend(pf->engine)))) {
            status = engine_warmup(pf->engine, cfg->chunk_tokens,
                                   b->max_batch_tokens, false);
            if (status != BT_OK)
                goto err_engine;
        }
    }
    status = workerproc_connect(cfg->router, pf->name, &pf->ctx, &pf->sock);
    if (status != BT_OK)
        goto err_engine;
    status = workerproc_link_create(pf->sock, pf->name, &pf->link);
    if (status != BT_OK) {
        workerproc_close(&pf->ctx, &pf->sock);
        goto err_engine;
    }
    workerproc_metrics_attach(cfg->metrics, pf->link, pf->name);
    *pf_p = pf;
    return BT_OK;

err_engine:
    engine_teardown(pf);
err_free:
    bt_free(pf);
    return status;
}

void prefill_destroy(prefill_t **pf_p)
{
    prefill_t *pf = *pf_p;

    if (pf == NULL)
        return;
    while (pf->head != NULL) {
        prefill_task_t *t = pf->head;
        task_unlink(pf, t);
        task_destroy(pf, t);
    }
    workerproc_metrics_attach(pf->cfg.metrics, NULL, NULL); /* /health */
    proto_batch_cleanup(&pf->outbox);
    workerproc_link_destroy(&pf->link); /* its thread uses the socket */
    workerproc_close(&pf->ctx, &pf->sock);
    engine_teardown(pf);
    bt_free(pf);
    *pf_p = NULL;
}

void prefill_stop(prefill_t *pf)
{
    pf->stop = 1;
}

bt_status_t prefill_run(prefill_t *pf)
{
    uint64_t drain_deadline = 0;
    const char *links = pf->links ? kv_link_sender_names(pf->links) : "";

    BT_LOG_INFO("PREFILL", "%s serving %s via %s (KV links: %s)", pf->name,
                pf->engine ? pf->cfg.engine.model_path : "the null model",
                pf->cfg.router, links[0] != '\0' ? links : "inline");
    for (;;) {
        bt_status_t status;
        int timeout, fd;

        if (pf->stop && !pf->draining) {
            workerproc_send_drain(pf->sock, pf->name);
            pf->draining = true;
            drain_deadline = bt_time_ns() + 30ull * 1000000000ull;
            BT_LOG_INFO("PREFILL", "draining");
        }
        if (pf->draining && (pf->head == NULL || bt_time_ns() > drain_deadline))
            break;
        timeout = has_runnable(pf) || has_spinning_commit(pf)
                      ? 0 : (has_committing(pf) ? 1 : 50);
        fd = -1;
        if (timeout > 0 && pf->links != NULL &&
            kv_link_sender_arm(pf->links, &fd) == BT_IN_PROGRESS)
            timeout = 0; /* events pending: progress first */
        status = workerproc_poll_fd(pf->sock, fd, timeout);
        if (status != BT_OK)
            return status;
        workerproc_link_turn_begin(pf->link);
        handle_messages(pf);
        send_outbox(pf); /* the refusals, before the step */
        switch (workerproc_link_check(pf->link)) {
        case WORKERPROC_LINK_REGISTER:
            send_register(pf); /* drops what the old session held */
            break;
        case WORKERPROC_LINK_REFUSED:
            workerproc_link_turn_end(pf->link);
            return BT_ERROR(BT_ERR_REMOTE, "PREFILL", "the router refused "
                            "this worker: %s",
                            workerproc_link_refusal(pf->link));
        case WORKERPROC_LINK_OK:
            break;
        }
        if (pf->links != NULL)
            kv_link_sender_progress(pf->links);
        if (pf->engine == NULL)
            run_null(pf);
        else
            run_batch(pf);
        if (pf->links != NULL)
            kv_link_sender_progress(pf->links);
        reap(pf);
        if (pf->links != NULL)
            kv_link_sender_reap(pf->links);
        /* The beat first: a client that got its answer and then scrapes
         * this worker's metrics finds its prompt counted (prefix hits). */
        publish_beat(pf);
        send_outbox(pf); /* this turn's PrefillDones, in one message */
        if (pf->prefix != NULL && workerproc_link_registered(pf->link))
            workerproc_prefix_publish(pf->prefix, pf->sock,
                                      PREFILL_KV_EVENTS_MS);
        workerproc_link_turn_end(pf->link);
    }
    workerproc_send_shutdown(pf->sock, pf->name);
    BT_LOG_INFO("PREFILL", "%s stopped after %llu prompts", pf->name,
                (unsigned long long)pf->served);
    return BT_OK;
}
