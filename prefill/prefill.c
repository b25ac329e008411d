/*
 * prefill.c - the prefill worker's loop, batcher and KV hand-off (see
 * prefill.h).
 */
#include "prefill.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "ctl/worker_ctl.h"
#include "kv/kv_transport.h"
#include "kv/kv_transport_cuda_ipc.h"
#include "kv/kv_transport_stage.h"
#include "params_proto.h"
#include "proto_msg.h"
#include "workerproc.h"
#include "workerproc_metrics.h"

#define PREFILL_NAME_MAX 64
#define PREFILL_MAX_PEERS 64 /* decode pools kept connected */

typedef enum {
    PREFILL_TASK_WAITING = 0, /* not started (needs KV blocks) */
    PREFILL_TASK_RUNNING,     /* chunks being fed */
    PREFILL_TASK_COMMITTING,  /* UCX commit in flight */
    PREFILL_TASK_DONE,        /* reply sent; to be freed */
} prefill_task_state_t;

typedef struct prefill_task_s prefill_task_t;
struct prefill_task_s {
    uint64_t id;
    prefill_task_state_t state;
    int *tokens;          /* (n_tokens) prompt (+ resumed tokens) */
    int n_tokens;
    int n_fed;            /* tokens already in the local KV */
    int *blocks;          /* (n_blocks) local block table */
    int n_blocks;
    sampler_params_t sp;
    int *dst_blocks;      /* (n_dst) the decode worker's reserved blocks */
    int n_dst;
    int dst_block_size;
    uint64_t epoch;
    uint8_t cap[PROTO_CAPABILITY_BYTES]; /* the grant's capability,
                           presented back in PrefillDone (issue 42) */
    size_t cap_len;       /* 0: the grant carried none */
    int slot;             /* UCX arrival slot of the reservation */
    uint8_t *desc;        /* (desc_len) UCX descriptor of the decode pool */
    size_t desc_len;
    bool use_ucx;
    kv_ucx_peer_t *peer;
    bool use_cipc;        /* CUDA IPC copies into the decode pool */
    uint8_t *cdesc;       /* (cdesc_len) CUDA IPC descriptor */
    size_t cdesc_len;
    kv_cipc_peer_t *cpeer;      /* mapped decode pool (one reference) */
    kv_cipc_commit_t *ccommit;  /* in flight while COMMITTING */
    bool use_stage;       /* staged UCX (dst_blocks: receive-area ids) */
    uint8_t *sdesc;       /* (sdesc_len) the decode's stage descriptor */
    size_t sdesc_len;
    kv_stage_peer_t *speer;     /* held in pf->speers (not owned) */
    kv_stage_xfer_t *sxfer;     /* the hand-off, from RUNNING on */
    bool stage_failed;    /* a layer could not be queued */
    bool final_in_batch;  /* its last chunk is in the running forward */
    uint8_t **kv_inline;  /* (2 * n_layers) packed K/V per layer */
    size_t kv_row_bytes;  /* bytes of one token's K (or V) in one layer */
    int n_resumed;        /* tail of tokens generated before (failover) */
    int first_token;
    char first_text[256];
    size_t first_text_len;
    bool commit_done;
    bt_status_t commit_status;
    uint64_t t_start;
    uint64_t t_computed;
    uint64_t t_moved;     /* when the hand-off last moved (seen) */
    uint64_t n_landed;    /* kv_stage_xfer_landed / kv_ucx_peer_completed
                             then */
    uint64_t transfer_ns;
    float *feat;          /* (dim) spec_features: last token's hidden */
    prefill_task_t *next;
};

/* A decode pool this worker keeps a UCX endpoint to, so hand-offs never
 * pay for connecting (and closing) on a request's critical path. */
typedef struct {
    kv_ucx_peer_t *peer;  /* one reference, held by the worker */
    uint64_t pool_id;     /* the pool's identity (descriptor) */
    uint64_t last_used;   /* bt_time_ns of the last task that used it */
    bool retiring;        /* dropped: disconnect once nothing uses it */
} prefill_peer_t;

/* A staged-UCX receiver this worker keeps connected (its transfers hold
 * their own references, so dropping one here never cuts a hand-off). */
typedef struct {
    kv_stage_peer_t *peer; /* one reference */
    uint8_t *desc;         /* (desc_len) the descriptor it came from */
    size_t desc_len;
    uint64_t last_used;
} prefill_speer_t;

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
    kv_ucx_t *ucx;        /* NULL when UCX is off */
    kv_cipc_t *cipc;      /* CUDA IPC copy context (device KV only) */
    bool kv_on_device;    /* backend KV in GPU memory (cuda) */
    prefill_peer_t peers[PREFILL_MAX_PEERS]; /* (n_peers) held endpoints */
    int n_peers;
    kv_stage_send_t *stage;   /* staged UCX sender (device KV, or the CPU
                                 pool with --kv-stage-host) */
    prefill_speer_t speers[PREFILL_MAX_PEERS]; /* (n_speers) */
    int n_speers;
    volatile sig_atomic_t stop;
    bool draining;
    workerproc_link_t *link;  /* sessions, acks, the heartbeat thread */
    double tps;               /* prefill tokens/s, moving average (the
                                 router's prefill deadlines use it) */
    prefill_task_t *head; /* tasks in arrival order */
    prefill_task_t *tail;
    float *logits;        /* (max_seqs, vocab) */
    float *hidden;        /* (max_seqs, dim) spec_features only */
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
    /* Sized from memory (issue 36), but a prefill pool only holds the
     * prompts in flight: at most PREFILL_KV_AUTO_CONTEXTS full contexts
     * (Llama-3-8B: 64k tokens, 8 GiB), so that a decode worker sharing
     * the GPU keeps the rest. */
    cfg->engine.backend.n_kv_blocks = 0;
    cfg->engine.backend.kv_auto_contexts = PREFILL_KV_AUTO_CONTEXTS;
}

// ---------------------------------------------------------------------------
// Messages to the router

static void send_msg(prefill_t *pf, Baton__ControlMessage *msg)
{
    workerproc_send(pf->sock, msg);
}

static void drop_all(prefill_t *pf);

/* Every Register starts a new session (workerproc_link.h): the tasks of
 * the old one are dropped first (the router resumes them). */
static void send_register(prefill_t *pf)
{
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_PREFILL, .name = pf->name,
        .engine = pf->engine, .ecfg = &pf->cfg.engine, .vocab = pf->vocab,
        .max_context = pf->max_context, .host_id = pf->cfg.host_id,
        .kv_on_device = pf->kv_on_device, .cuda_ipc = pf->cipc != NULL,
    };
    workerproc_register_t r;
    Baton__KvTransport transports[6];
    int n_tr = 0;

    drop_all(pf);
    workerproc_register_init(&r, &rc);
    r.reg.has_session = 1;
    r.reg.session = workerproc_link_begin_session(pf->link);
    if (pf->ucx != NULL && !pf->kv_on_device)
        transports[n_tr++] = BATON__KV_TRANSPORT__KV_TRANSPORT_UCX;
    if (pf->cipc != NULL)
        transports[n_tr++] = BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC;
    if (pf->stage != NULL)
        transports[n_tr++] = BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE;
    transports[n_tr++] = BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE;
    r.reg.n_transports = (size_t)n_tr;
    r.reg.transports = transports;
    workerproc_send_register(pf->sock, &r.reg);
}

/* Publishes what the heartbeats say (the link's thread sends them). */
static void publish_beat(prefill_t *pf)
{
    workerproc_beat_t b;

    memset(&b, 0, sizeof(b));
    for (prefill_task_t *t = pf->head; t; t = t->next) {
        b.outstanding += (uint64_t)(t->n_tokens - t->n_fed);
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
    workerproc_link_publish(pf->link, &b, false);
}

static void send_failure(prefill_t *pf, uint64_t id, uint64_t epoch,
                         Baton__ErrorCode code, const char *text)
{
    workerproc_send_prefill_failure(pf->sock, id, epoch, code, text);
}

static void send_done(prefill_t *pf, prefill_task_t *t)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;
    ProtobufCBinaryData kv[2 * 512];
    uint64_t now = bt_time_ns();
    double kv_bytes = 0; /* metrics: what the hand-off moved */

    done.has_request_id = 1;
    done.request_id = t->id;
    done.has_ok = 1;
    done.ok = 1;
    done.n_prompt_ids = (size_t)t->n_tokens;
    done.prompt_ids = t->tokens;
    done.has_first_token = 1;
    done.first_token = t->first_token;
    if (t->first_text_len > 0) {
        done.has_first_text = 1;
        done.first_text.data = (uint8_t *)t->first_text;
        done.first_text.len = t->first_text_len;
    }
    done.has_epoch = 1;
    done.epoch = t->epoch;
    done.has_capability = t->cap_len > 0;
    done.capability.data = t->cap;
    done.capability.len = t->cap_len;
    done.has_compute_us = 1;
    done.compute_us = (t->t_computed - t->t_start) / 1000;
    done.has_transfer_us = 1;
    /* Time spent moving KV: issuing the layer puts (over shared memory
     * they are the copies themselves, overlapped with later layers'
     * compute) plus the commit after the last layer; inline: packing. */
    done.transfer_us = (t->transfer_ns +
                        (t->use_ucx || t->use_cipc || t->use_stage
                             ? now - t->t_computed : 0)) / 1000;
    if ((t->use_ucx || t->use_cipc || t->use_stage) && pf->engine != NULL) {
        const kv_layout_t *lay = backend_kv_layout(engine_backend(pf->engine));
        double bytes = 2.0 * pf->n_layers * (double)kv_layout_block_bytes(lay) *
                       backend_tp_size(engine_backend(pf->engine)) *
                       BT_DIV_UP(t->n_tokens, pf->block_size);
        BT_LOG_DEBUG("KV", "kv_handoff request:%llu tokens:%d bytes:%.0f "
                     "put_us:%.1f commit_us:%.1f",
                     (unsigned long long)t->id, t->n_tokens, bytes,
                     t->transfer_ns / 1e3, (now - t->t_computed) / 1e3);
        kv_bytes = bytes;
    }
    if (t->kv_inline != NULL && pf->n_layers <= 512) {
        for (int i = 0; i < 2 * pf->n_layers; i++) {
            kv[i].data = t->kv_inline[i];
            kv[i].len = t->kv_row_bytes * (size_t)t->n_tokens;
        }
        done.n_kv_inline = (size_t)(2 * pf->n_layers);
        done.kv_inline = kv;
        kv_bytes = 2.0 * pf->n_layers * (double)t->kv_row_bytes * t->n_tokens;
    }
    if (t->feat != NULL) {
        done.has_spec_feature = 1;
        done.spec_feature.data = (uint8_t *)t->feat;
        done.spec_feature.len = sizeof(float) * (size_t)pf->dim;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE;
    msg.prefill_done = &done;
    send_msg(pf, &msg);
    pf->served++;
    if (pf->engine != NULL) /* metrics hook */
        workerproc_metrics_handoff(pf->cfg.metrics, (uint64_t)kv_bytes,
                                   (double)done.transfer_us * 1e-6);
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
    kv_ucx_disconnect(&t->peer);
    kv_cipc_commit_destroy(&t->ccommit);
    kv_cipc_release(&t->cpeer);
    bt_free(t->cdesc);
    /* A transfer still in flight is cancelled: nothing more is put, and
     * chunks already staged finish on their own.  The local blocks are
     * freed just above: a D2H copy of a cancelled chunk may still read
     * them, but its bytes are never put (and nothing writes them), so a
     * new task's KV is never harmed. */
    kv_stage_xfer_destroy(&t->sxfer);
    bt_free(t->sdesc);
    if (t->kv_inline != NULL) {
        for (int i = 0; i < 2 * pf->n_layers; i++)
            bt_free(t->kv_inline[i]);
        bt_free(t->kv_inline);
    }
    bt_free(t->tokens);
    bt_free(t->blocks);
    bt_free(t->dst_blocks);
    bt_free(t->desc);
    bt_free(t->feat);
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

static void on_task(prefill_t *pf, const Baton__PrefillTask *m)
{
    const Baton__KvGrant *g = m->grant;
    prefill_task_t *t;
    char err[256];
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INVALID;
    bt_status_t status;

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
    t->slot = g->has_slot ? g->slot : -1;
    t->dst_block_size = g->kv_layout ? (int)g->kv_layout->block_size : 0;
    params_sampling_from_proto(m->sampling, &t->sp);
    t->n_resumed = m->has_n_generated ? (int)m->n_generated : 0;
    if (m->n_prompt_ids > 0) {
        t->tokens = bt_malloc(m->n_prompt_ids * sizeof(int), "prefill_tokens");
        if (t->tokens != NULL)
            memcpy(t->tokens, m->prompt_ids, m->n_prompt_ids * sizeof(int));
        t->n_tokens = (int)m->n_prompt_ids;
        status = t->tokens ? BT_OK : BT_ERR_NO_MEMORY;
    } else if (m->has_prompt_text && m->prompt_text.len > 0) {
        if (pf->engine == NULL) {
            status = null_encode(m->prompt_text.data, m->prompt_text.len,
                                 m->add_bos, &t->tokens, &t->n_tokens);
        } else if (engine_tokenizer(pf->engine) == NULL) {
            snprintf(err, sizeof(err), "worker has no tokenizer: send "
                     "prompt ids");
            goto fail;
        } else {
            status = tok_encode(engine_tokenizer(pf->engine),
                                (const char *)m->prompt_text.data,
                                m->prompt_text.len, m->add_bos, &t->tokens,
                                &t->n_tokens);
        }
    } else {
        snprintf(err, sizeof(err), "empty prompt");
        goto fail;
    }
    if (status != BT_OK) {
        snprintf(err, sizeof(err), "cannot tokenize the prompt: %s",
                 bt_error_last());
        goto fail;
    }
    for (int i = 0; i < t->n_tokens; i++) {
        if (t->tokens[i] < 0 || t->tokens[i] >= pf->vocab) {
            snprintf(err, sizeof(err), "prompt id %d at %d is outside the "
                     "vocabulary (%d)", t->tokens[i], i, pf->vocab);
            goto fail;
        }
    }
    if (t->n_tokens >= pf->max_context) {
        code = BATON__ERROR_CODE__ERROR_TOO_LONG;
        snprintf(err, sizeof(err), "prompt of %d tokens does not fit the "
                 "context (%d)", t->n_tokens, pf->max_context);
        goto fail;
    }
    if (t->dst_block_size > 0 &&
        (size_t)t->n_tokens > g->n_block_ids * (size_t)t->dst_block_size) {
        code = BATON__ERROR_CODE__ERROR_TOO_LONG;
        snprintf(err, sizeof(err), "prompt of %d tokens exceeds its KV "
                 "reservation", t->n_tokens);
        goto fail;
    }
    if (pf->engine != NULL && sampler_params_validate(&t->sp) != BT_OK) {
        snprintf(err, sizeof(err), "%s", bt_error_last());
        goto fail;
    }
    t->dst_blocks = bt_malloc(g->n_block_ids * sizeof(int), "prefill_dst");
    if (t->dst_blocks == NULL) {
        snprintf(err, sizeof(err), "out of memory");
        goto fail;
    }
    memcpy(t->dst_blocks, g->block_ids, g->n_block_ids * sizeof(int));
    t->n_dst = (int)g->n_block_ids;
    if (m->has_transport &&
        m->transport == BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC) {
        if (pf->cipc != NULL && m->has_cuda_ipc && m->cuda_ipc.len > 0 &&
            t->dst_block_size == pf->block_size && t->slot >= 0) {
            t->cdesc = bt_malloc(m->cuda_ipc.len, "prefill_desc");
            if (t->cdesc != NULL) {
                memcpy(t->cdesc, m->cuda_ipc.data, m->cuda_ipc.len);
                t->cdesc_len = m->cuda_ipc.len;
                t->use_cipc = true;
            }
        }
        if (!t->use_cipc)
            BT_LOG_WARN("KV", "request %llu: CUDA IPC not usable here; KV "
                        "goes inline", (unsigned long long)t->id);
    } else if (m->has_transport &&
               m->transport == BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE) {
        /* The KV goes to the grant's receive-area ids. */
        if (pf->stage != NULL && m->has_kv_stage && m->kv_stage.len > 0 &&
            g->n_stage_block_ids == g->n_block_ids &&
            t->dst_block_size == pf->block_size && t->slot >= 0) {
            t->sdesc = bt_malloc(m->kv_stage.len, "prefill_desc");
            if (t->sdesc != NULL) {
                memcpy(t->sdesc, m->kv_stage.data, m->kv_stage.len);
                t->sdesc_len = m->kv_stage.len;
                memcpy(t->dst_blocks, g->stage_block_ids,
                       g->n_stage_block_ids * sizeof(int));
                t->use_stage = true;
            }
        }
        if (!t->use_stage)
            BT_LOG_WARN("KV", "request %llu: staged UCX not usable here; KV "
                        "goes inline", (unsigned long long)t->id);
    } else if (m->has_transport &&
               m->transport == BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE) {
        /* the router chose inline for this pair */
    } else if (pf->ucx != NULL && !pf->kv_on_device && g->ucx != NULL &&
               g->ucx->has_packed && t->dst_block_size == pf->block_size &&
               t->slot >= 0) {
        t->desc = bt_malloc(g->ucx->packed.len, "prefill_desc");
        if (t->desc != NULL) {
            memcpy(t->desc, g->ucx->packed.data, g->ucx->packed.len);
            t->desc_len = g->ucx->packed.len;
            t->use_ucx = true;
        }
    }
    if (pf->engine != NULL) {
        t->blocks = bt_malloc((size_t)BT_DIV_UP(t->n_tokens, pf->block_size) *
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

// ---------------------------------------------------------------------------
// Held UCX endpoints

static prefill_peer_t *peer_find(prefill_t *pf, const kv_ucx_peer_t *peer)
{
    for (int i = 0; i < pf->n_peers; i++)
        if (pf->peers[i].peer == peer)
            return &pf->peers[i];
    return NULL;
}

static void peer_retire(prefill_t *pf, const kv_ucx_peer_t *peer)
{
    prefill_peer_t *h = peer_find(pf, peer);

    if (h != NULL && !h->retiring) {
        BT_LOG_INFO("KV", "dropping the endpoint to KV pool %016llx",
                    (unsigned long long)h->pool_id);
        h->retiring = true;
    }
}

static bool peer_in_use(prefill_t *pf, const kv_ucx_peer_t *peer)
{
    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->peer == peer)
            return true;
    return false;
}

/* Connects to the decode pool of `desc` and keeps the endpoint: later
 * tasks for that pool reuse it (kv_ucx_connect caches by pool id while a
 * reference lives).  The first connect to a pool costs ~milliseconds
 * (UCX endpoint, rkey unpack, shared-memory attach).  When the table is
 * full, the least recently used endpoint is retired. */
static kv_ucx_peer_t *peer_hold(prefill_t *pf, const void *desc, size_t len)
{
    kv_ucx_peer_t *peer = NULL;
    prefill_peer_t *h;

    if (pf->ucx == NULL || kv_ucx_connect(pf->ucx, desc, len, &peer) != BT_OK)
        return NULL;
    h = peer_find(pf, peer);
    if (h != NULL) {
        h->retiring = false; /* in use again */
        h->last_used = bt_time_ns();
        kv_ucx_disconnect(&peer); /* the held reference stays */
        return h->peer;
    }
    if (pf->n_peers == PREFILL_MAX_PEERS) {
        prefill_peer_t *lru = NULL;
        for (int i = 0; i < pf->n_peers; i++)
            if (!pf->peers[i].retiring &&
                (lru == NULL || pf->peers[i].last_used < lru->last_used))
                lru = &pf->peers[i];
        if (lru != NULL)
            lru->retiring = true;
        kv_ucx_disconnect(&peer); /* not held: connected per task */
        return NULL;
    }
    h = &pf->peers[pf->n_peers++];
    h->peer = peer;
    h->pool_id = kv_ucx_desc_pool_id(kv_ucx_peer_desc(peer));
    h->last_used = bt_time_ns();
    h->retiring = false;
    BT_LOG_DEBUG("KV", "connected to KV pool %016llx",
                 (unsigned long long)h->pool_id);
    if (bt_log_is_enabled(BT_LOG_LEVEL_DEBUG, "KV"))
        kv_ucx_peer_print_info(peer, stderr); /* lanes and transports */
    return peer;
}

/* Drops held stage receiver i (its transfers keep their own reference). */
static void speer_drop_at(prefill_t *pf, int i)
{
    kv_stage_disconnect(&pf->speers[i].peer);
    bt_free(pf->speers[i].desc);
    pf->speers[i] = pf->speers[--pf->n_speers];
}

/* Drops the held stage receiver `peer` (a failed hand-off: the next task
 * for that decode worker connects afresh). */
static void speer_drop(prefill_t *pf, const kv_stage_peer_t *peer)
{
    for (int i = 0; i < pf->n_speers; i++) {
        if (pf->speers[i].peer == peer) {
            speer_drop_at(pf, i);
            return;
        }
    }
}

/* The staged-UCX receiver of `desc`, connected once and kept (the first
 * connect costs an endpoint and an rkey unpack; kv_ucx_connect caches the
 * endpoint per pool).  NULL when it cannot be reached or does not match
 * the local pool; the least recently used one makes room when full. */
static kv_stage_peer_t *speer_hold(prefill_t *pf, const void *desc,
                                   size_t len)
{
    prefill_speer_t *h;
    kv_stage_peer_t *peer = NULL;

    if (pf->stage == NULL)
        return NULL;
    for (int i = 0; i < pf->n_speers; i++) {
        h = &pf->speers[i];
        if (h->desc_len == len && memcmp(h->desc, desc, len) == 0) {
            h->last_used = bt_time_ns();
            return h->peer;
        }
    }
    if (kv_stage_connect(pf->stage, desc, len, &peer) != BT_OK)
        return NULL;
    if (pf->n_speers == PREFILL_MAX_PEERS) {
        int lru = 0;
        for (int i = 1; i < pf->n_speers; i++)
            if (pf->speers[i].last_used < pf->speers[lru].last_used)
                lru = i;
        speer_drop_at(pf, lru);
    }
    h = &pf->speers[pf->n_speers];
    h->desc = bt_malloc(len, "prefill_desc");
    if (h->desc == NULL) {
        kv_stage_disconnect(&peer);
        return NULL;
    }
    memcpy(h->desc, desc, len);
    h->desc_len = len;
    h->peer = peer;
    h->last_used = bt_time_ns();
    pf->n_speers++;
    BT_LOG_DEBUG("KV", "connected to a staged receiver (%s, %d receive "
                 "blocks)", kv_stage_peer_info(peer)->direct ? "direct"
                                                            : "staged",
                 kv_stage_peer_info(peer)->recv_blocks);
    return peer;
}

/* KvPeers: connects to new staged receivers now and drops those no
 * longer listed (their decode worker is gone). */
static void speers_sync(prefill_t *pf, const Baton__KvPeers *m)
{
    kv_stage_peer_t *listed[PREFILL_MAX_PEERS];
    int n_listed = 0;

    for (size_t i = 0; i < m->n_kv_stage && n_listed < PREFILL_MAX_PEERS;
         i++) {
        kv_stage_peer_t *p;
        if (m->kv_stage[i].len == 0)
            continue;
        p = speer_hold(pf, m->kv_stage[i].data, m->kv_stage[i].len);
        if (p != NULL)
            listed[n_listed++] = p;
    }
    for (int i = 0; i < pf->n_speers;) {
        bool keep = false;
        for (int k = 0; k < n_listed && !keep; k++)
            keep = listed[k] == pf->speers[i].peer;
        if (keep)
            i++;
        else
            speer_drop_at(pf, i);
    }
}

/* KvPeers: the router's complete list of decode pools.  Connects to the
 * new ones now, off any request's critical path, and retires endpoints to
 * pools no longer listed (their decode worker is gone). */
static void on_kv_peers(prefill_t *pf, const Baton__KvPeers *m)
{
    kv_ucx_peer_t *listed[PREFILL_MAX_PEERS];
    int n_listed = 0;

    if (pf->cipc != NULL) {
        /* Map new device pools now (off the critical path) and unmap
         * those of decode workers that left (frees their memory). */
        uint64_t ids[PREFILL_MAX_PEERS];
        int n_ids = 0;
        for (size_t i = 0; i < m->n_cuda_ipc && n_ids < PREFILL_MAX_PEERS;
             i++) {
            kv_cipc_peer_t *cp = NULL;
            if (kv_cipc_connect(pf->cipc, m->cuda_ipc[i].data,
                                m->cuda_ipc[i].len, &cp) != BT_OK)
                continue;
            ids[n_ids++] = kv_cipc_peer_desc(cp)->pool_id;
            kv_cipc_release(&cp);
        }
        kv_cipc_retire_unlisted(pf->cipc, ids, n_ids);
    }
    if (pf->stage != NULL)
        speers_sync(pf, m);
    if (pf->ucx == NULL || pf->kv_on_device)
        return;
    for (size_t i = 0; i < m->n_pools && n_listed < PREFILL_MAX_PEERS; i++) {
        const Baton__UcxDescriptor *d = m->pools[i];
        kv_ucx_peer_t *peer;
        if (d == NULL || !d->has_packed || d->packed.len == 0)
            continue;
        peer = peer_hold(pf, d->packed.data, d->packed.len);
        if (peer != NULL)
            listed[n_listed++] = peer;
    }
    for (int i = 0; i < pf->n_peers; i++) {
        bool keep = false;
        for (int k = 0; k < n_listed && !keep; k++)
            keep = listed[k] == pf->peers[i].peer;
        if (!keep)
            peer_retire(pf, pf->peers[i].peer);
    }
}

/* Disconnects retired endpoints that no task uses and that have nothing
 * in flight, so closing never blocks the loop.  A dead peer's operations
 * without peer error handling never complete: the commit timeout
 * abandons such an endpoint (its status is no longer OK), and its close
 * is then forced, at once (kv_ucx_peer_abandon). */
static void peers_reap(prefill_t *pf)
{
    for (int i = 0; i < pf->n_peers;) {
        prefill_peer_t *h = &pf->peers[i];
        if (!h->retiring || peer_in_use(pf, h->peer) ||
            (kv_ucx_peer_pending(h->peer) > 0 &&
             kv_ucx_peer_status(h->peer) == BT_OK)) {
            i++;
            continue;
        }
        kv_ucx_disconnect(&h->peer);
        BT_LOG_INFO("KV", "closed the endpoint to KV pool %016llx",
                    (unsigned long long)h->pool_id);
        pf->peers[i] = pf->peers[--pf->n_peers];
    }
}

// ---------------------------------------------------------------------------
// Compute

/* Copies layer `layer`'s K and V of every prompt token into the task's
 * inline buffers, in token order. */
static bt_status_t pack_layer_inline(prefill_t *pf, prefill_task_t *t,
                                     int layer)
{
    backend_t *be = engine_backend(pf->engine);
    const kv_layout_t *lay = backend_kv_layout(be);
    /* inline rows hold every KV head of a token (whatever either side's
     * TP): rank r's `row` bytes go to columns [r row, (r + 1) row) */
    const int tp = backend_tp_size(be);
    size_t row = (size_t)lay->n_kv_heads * (size_t)lay->head_dim *
                 lay->elem_size;
    size_t full = row * (size_t)tp;

    if (t->kv_inline == NULL) {
        t->kv_inline = bt_calloc((size_t)(2 * pf->n_layers), sizeof(uint8_t *),
                                 "prefill_inline");
        if (t->kv_inline == NULL)
            return BT_ERR_NO_MEMORY;
        t->kv_row_bytes = full;
    }
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *out = bt_malloc(full * (size_t)t->n_tokens, "prefill_inline");
        if (out == NULL)
            return BT_ERR_NO_MEMORY;
        t->kv_inline[2 * layer + kv] = out; /* freed with t */
        for (int r = 0; r < tp; r++) {
            const uint8_t *base = backend_kv_data_rank(be, r, layer, kv);
            uint8_t *o = out + (size_t)r * row;
            /* One copy per block: its rows are adjacent on both sides. */
            for (int s = 0; s < t->n_tokens;) {
                int blk = t->blocks[s / lay->block_size];
                int in = s % lay->block_size;
                int cnt = BT_MIN(lay->block_size - in, t->n_tokens - s);
                size_t off = ((size_t)blk * (size_t)lay->block_size +
                              (size_t)in) * row;
                if (!pf->kv_on_device)
                    memcpy(o + (size_t)s * row, base + off, row * (size_t)cnt);
                else if (tp == 1 ? kv_cipc_memcpy(o + (size_t)s * row,
                                                  base + off,
                                                  row * (size_t)cnt) != BT_OK
                                 : kv_cipc_memcpy2d(o + (size_t)s * full,
                                                    full, base + off, row,
                                                    row,
                                                    (size_t)cnt) != BT_OK)
                    return BT_ERR_CUDA;
                s += cnt;
            }
        }
    }
    return BT_OK;
}

/* backend_batch_t.on_layer_done: ship layer `layer` of every prompt whose
 * last chunk is in this forward, while the next layer computes. */
static void on_layer_done(void *arg, int layer)
{
    prefill_t *pf = arg;
    backend_t *be = engine_backend(pf->engine);

    for (int b = 0; b < pf->n_batch; b++) {
        prefill_task_t *t = pf->btasks[b];
        uint64_t t0 = bt_time_ns();
        if (!t->final_in_batch)
            continue;
        if (t->use_cipc) {
            /* every prefill rank's heads into the decode rank(s) holding
             * them (kv_reshard: prefill and decode TP may differ) */
            int n = BT_DIV_UP(t->n_tokens, pf->block_size);
            int tp = backend_tp_size(be);
            bt_status_t status = BT_OK;
            for (int r = 0; r < tp && status == BT_OK; r++) {
                kv_reshard_side_t src =
                    kv_reshard_side_rank(backend_kv_layout(be), tp, r);
                status = kv_cipc_put_layer_ranks(
                    t->cpeer, layer, backend_kv_data_rank(be, r, layer, 0),
                    backend_kv_data_rank(be, r, layer, 1), &src, t->blocks,
                    t->dst_blocks, n);
            }
            if (status != BT_OK) {
                BT_LOG_WARN("KV", "CUDA IPC copy of request %llu failed; "
                            "falling back to inline",
                            (unsigned long long)t->id);
                t->use_cipc = false;
                for (int l = 0; l <= layer; l++)
                    pack_layer_inline(pf, t, l);
            }
        } else if (t->use_stage) {
            /* D2H into a staging buffer now (the backend synchronised
             * this layer's K/V first), the put when the copy is done. */
            bt_status_t status = kv_stage_xfer_layer(
                t->sxfer, layer, backend_kv_data(be, layer, 0),
                backend_kv_data(be, layer, 1));
            if (status != BT_OK && !t->stage_failed) {
                BT_LOG_WARN("KV", "request %llu: staged KV of layer %d not "
                            "queued (%s)", (unsigned long long)t->id, layer,
                            bt_status_str(status));
                t->stage_failed = true;
            }
            kv_stage_send_progress(pf->stage);
        } else if (t->use_ucx && kv_ucx_peer_abandoned(t->peer)) {
            /* Its decode worker is presumed dead (another hand-off to it
             * timed out): no inline fallback to a dead process; the
             * commit fails in task_computed and the router retries. */
        } else if (t->use_ucx) {
            int n = BT_DIV_UP(t->n_tokens, pf->block_size);
            bt_status_t status = kv_ucx_put_layer(
                t->peer, layer, backend_kv_data(be, layer, 0),
                backend_kv_data(be, layer, 1), backend_kv_layout(be),
                KV_UCX_MEM_HOST, t->blocks, t->dst_blocks, n);
            if (status != BT_OK) {
                BT_LOG_WARN("KV", "UCX put of request %llu failed; falling "
                            "back to inline", (unsigned long long)t->id);
                t->use_ucx = false;
                for (int l = 0; l <= layer; l++)
                    pack_layer_inline(pf, t, l);
            }
        } else if (pack_layer_inline(pf, t, layer) != BT_OK) {
            BT_LOG_WARN("KV", "out of memory packing KV");
        }
        t->transfer_ns += bt_time_ns() - t0;
    }
}

/* Commit completion.  The argument is the worker, not the task: a task
 * whose hand-off timed out is freed while its commit may still complete,
 * so the task is found by (slot, epoch), which a grant never reuses. */
static void commit_cb(void *arg, int slot, uint64_t epoch, bt_status_t status)
{
    prefill_t *pf = arg;

    for (prefill_task_t *t = pf->head; t; t = t->next) {
        if (t->state == PREFILL_TASK_COMMITTING && t->slot == slot &&
            t->epoch == epoch && !t->commit_done) {
            t->commit_done = true;
            t->commit_status = status;
            return;
        }
    }
}

static bt_status_t sample_first(prefill_t *pf, prefill_task_t *t,
                                float *logits)
{
    sampler_t *sampler = NULL;
    bt_status_t status;

    status = sampler_create(&t->sp, pf->vocab, &sampler);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < t->n_tokens; i++)
        sampler_observe(sampler, t->tokens[i]);
    /* Tokens generated before a failover drew from the same stream. */
    sampler_skip(sampler, t->n_resumed);
    t->first_token = sampler_sample(sampler, logits);
    sampler_destroy(&sampler);
    return BT_OK;
}

static void first_text(prefill_t *pf, prefill_task_t *t)
{
    const tok_t *tok = pf->engine ? engine_tokenizer(pf->engine) : NULL;
    tok_stream_t *stream = NULL;

    t->first_text_len = 0;
    if (tok == NULL ||
        tok_stream_create(tok, t->tokens[t->n_tokens - 1], &stream) != BT_OK)
        return;
    tok_stream_set_skip_special(stream, t->sp.skip_special_tokens);
    if (tok_stream_push(stream, t->first_token, t->first_text,
                        sizeof(t->first_text), &t->first_text_len) != BT_OK)
        t->first_text_len = 0;
    tok_stream_destroy(&stream);
}

/* A task whose prompt is computed: commit the KV (UCX) or reply now. */
static void task_computed(prefill_t *pf, prefill_task_t *t)
{
    t->t_computed = bt_time_ns();
    first_text(pf, t);
    if (t->use_cipc) {
        if (kv_cipc_commit(t->cpeer, t->slot, t->epoch, &t->ccommit) ==
            BT_OK) {
            t->state = PREFILL_TASK_COMMITTING;
            return;
        }
        send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                     "KV commit over CUDA IPC failed");
        t->state = PREFILL_TASK_DONE;
        return;
    }
    if (t->use_stage) {
        /* Each layer commits itself; wait for the last (reap). */
        if (!t->stage_failed &&
            kv_stage_xfer_status(t->sxfer) != BT_IN_PROGRESS &&
            kv_stage_xfer_status(t->sxfer) != BT_OK)
            t->stage_failed = true;
        if (!t->stage_failed) {
            t->state = PREFILL_TASK_COMMITTING;
            return;
        }
        send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                     "staged KV transfer to the decode worker failed");
        speer_drop(pf, t->speer);
        t->state = PREFILL_TASK_DONE;
        return;
    }
    if (t->use_ucx) {
        bt_status_t status = kv_ucx_commit(t->peer, t->slot, t->epoch,
                                           commit_cb, pf);
        if (status == BT_OK) {
            /* the stall clock starts now (commit_stalled) */
            t->n_landed = kv_ucx_peer_completed(t->peer);
            t->t_moved = t->t_computed;
            t->state = PREFILL_TASK_COMMITTING;
            return;
        }
        send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                     "KV commit to the decode worker failed");
        t->state = PREFILL_TASK_DONE;
        return;
    }
    send_done(pf, t);
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
                                (uint64_t)(t->n_tokens - t->n_fed), 0);
        t->n_fed = t->n_tokens;
        t->first_token = proto_null_next_token(t->tokens[t->n_tokens - 1],
                                               t->n_tokens);
        t->t_computed = bt_time_ns();
        send_done(pf, t);
        t->state = PREFILL_TASK_DONE;
    }
}

/* One batched forward over the waiting and running prompts. */
static void run_batch(prefill_t *pf)
{
    const backend_config_t *bcfg = &pf->cfg.engine.backend;
    kv_allocator_t *kv = engine_kv(pf->engine);
    int budget = bcfg->max_batch_tokens, rows = 0;
    uint64_t t0;
    backend_batch_t batch;
    bt_status_t status;

    pf->n_batch = 0;
    for (prefill_task_t *t = pf->head; t && pf->n_batch < bcfg->max_seqs &&
                                       budget > 0; t = t->next) {
        backend_seq_t *bs;
        int take;

        if (t->state == PREFILL_TASK_WAITING) {
            int need = BT_DIV_UP(t->n_tokens, pf->block_size);
            if (kv_allocator_alloc(kv, need, t->blocks) != BT_OK)
                break; /* wait for blocks; keep arrival order */
            t->n_blocks = need;
            if (t->use_ucx) {
                peer_hold(pf, t->desc, t->desc_len);
                if (kv_ucx_connect(pf->ucx, t->desc, t->desc_len,
                                   &t->peer) != BT_OK)
                    t->use_ucx = false;
            }
            if (t->use_stage) {
                t->speer = speer_hold(pf, t->sdesc, t->sdesc_len);
                if (t->speer == NULL ||
                    kv_stage_xfer_begin(pf->stage, t->speer, t->slot,
                                        t->epoch, t->blocks, t->dst_blocks,
                                        need, &t->sxfer) != BT_OK) {
                    BT_LOG_WARN("KV", "request %llu: cannot start the "
                                "staged hand-off; KV goes inline",
                                (unsigned long long)t->id);
                    t->use_stage = false;
                }
            }
            if (t->use_cipc &&
                kv_cipc_connect(pf->cipc, t->cdesc, t->cdesc_len,
                                &t->cpeer) != BT_OK) {
                BT_LOG_WARN("KV", "request %llu: cannot map the decode pool "
                            "over CUDA IPC; KV goes inline",
                            (unsigned long long)t->id);
                t->use_cipc = false;
            }
            t->state = PREFILL_TASK_RUNNING;
        }
        if (t->state != PREFILL_TASK_RUNNING)
            continue;
        take = BT_MIN(t->n_tokens - t->n_fed,
                      BT_MIN(budget, pf->cfg.chunk_tokens));
        if (take <= 0)
            continue;
        bs = &pf->bseqs[pf->n_batch];
        memset(bs, 0, sizeof(*bs));
        bs->n_tokens = take;
        bs->ctx_len = t->n_fed;
        bs->tokens = t->tokens + t->n_fed;
        bs->block_table = t->blocks;
        t->final_in_batch = t->n_fed + take == t->n_tokens;
        bs->n_logits = t->final_in_batch ? 1 : 0;
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

/* What task t's hand-off has moved so far: chunks landed (staged), or
 * operations its UCX endpoint completed (plain: a commit's flushes wait
 * for every put on the endpoint, other tasks' too, so any completion
 * shows the peer alive and this commit coming).  Others: nothing. */
static uint64_t handoff_moved(const prefill_task_t *t)
{
    if (t->sxfer != NULL)
        return kv_stage_xfer_landed(t->sxfer);
    if (t->use_ucx && t->peer != NULL)
        return kv_ucx_peer_completed(t->peer);
    return 0;
}

/* True when task t's hand-off has not moved for `limit` ns.  UCX ones
 * count from the last progress seen, not from t_computed: they move only
 * while this loop turns, and this worker's own steps (a long forward;
 * --step-delay-ms) hold the loop for hundreds of ms, so a live decode
 * worker's hand-off timed out as if it were dead (the router counted a
 * retry, and the abandon failed every other hand-off to it).  reap runs
 * just after the loop progressed UCX, so a live peer's completions are
 * seen first; a dead decode worker completes nothing and times out. */
static bool commit_stalled(prefill_task_t *t, uint64_t now, uint64_t limit)
{
    uint64_t moved = handoff_moved(t);

    if (moved != t->n_landed) {
        t->n_landed = moved;
        t->t_moved = now;
    }
    /* t_moved stays 0 for a hand-off that reports no progress */
    return now - BT_MAX(t->t_computed, t->t_moved) > limit;
}

/* The commit timeout's verdict on a plain UCX hand-off: the decode worker
 * is presumed dead, so its endpoint is abandoned (kv_ucx_peer_abandon)
 * rather than only retired.  A retired endpoint with operations stuck in
 * flight was never closed (peers_reap waits for them), one per dead
 * decode worker until exit; an abandoned one fails every other hand-off
 * on it (reap), is closed at once by peers_reap when no task holds it,
 * and a later connect to that pool makes a fresh endpoint. */
static void peer_abandon(prefill_t *pf, kv_ucx_peer_t *peer)
{
    if (kv_ucx_peer_abandoned(peer))
        return;
    BT_LOG_INFO("KV", "abandoning the endpoint to KV pool %016llx",
                (unsigned long long)kv_ucx_desc_pool_id(
                    kv_ucx_peer_desc(peer)));
    kv_ucx_peer_abandon(peer);
    peer_retire(pf, peer);
}

static void reap(prefill_t *pf)
{
    prefill_task_t *t = pf->head, *next;
    uint64_t now = bt_time_ns();
    uint64_t limit = (uint64_t)pf->cfg.commit_timeout_ms * 1000000ull;

    for (; t != NULL; t = next) {
        next = t->next;
        if (t->state == PREFILL_TASK_COMMITTING && t->ccommit != NULL) {
            bt_status_t status = kv_cipc_commit_query(t->ccommit);
            if (status != BT_IN_PROGRESS) {
                t->commit_done = true;
                t->commit_status = status;
            }
        }
        if (t->state == PREFILL_TASK_COMMITTING && t->sxfer != NULL) {
            bt_status_t status = kv_stage_xfer_status(t->sxfer);
            if (status != BT_IN_PROGRESS) {
                t->commit_done = true;
                t->commit_status = status;
            }
        }
        if (t->state == PREFILL_TASK_COMMITTING && t->commit_done) {
            if (t->commit_status == BT_OK) {
                send_done(pf, t);
            } else {
                send_failure(pf, t->id, t->epoch,
                             BATON__ERROR_CODE__ERROR_WORKER,
                             "KV transfer to the decode worker failed");
                if (t->peer != NULL)
                    peer_retire(pf, t->peer);
                if (t->speer != NULL)
                    speer_drop(pf, t->speer);
            }
            t->state = PREFILL_TASK_DONE;
        } else if (t->state == PREFILL_TASK_COMMITTING && t->use_ucx &&
                   kv_ucx_peer_abandoned(t->peer)) {
            /* Another hand-off on this endpoint timed out: this one's
             * commit waits for the same dead peer.  Its callback (if
             * UCX ever runs it) finds no task: commit_cb matches by
             * (slot, epoch) among the live ones. */
            send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                         "KV hand-off abandoned: the decode worker is "
                         "presumed dead");
            t->state = PREFILL_TASK_DONE;
        } else if (t->state == PREFILL_TASK_COMMITTING &&
                   commit_stalled(t, now, limit)) {
            /* Without peer error handling a dead decode worker's commit
             * never completes: give up; the router retries elsewhere. */
            BT_LOG_WARN("KV", "request %llu: KV hand-off stalled for %d "
                        "ms; the decode worker is presumed dead",
                        (unsigned long long)t->id, pf->cfg.commit_timeout_ms);
            send_failure(pf, t->id, t->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                         "KV hand-off to the decode worker timed out");
            if (t->use_ucx && t->peer != NULL)
                peer_abandon(pf, t->peer);
            if (t->speer != NULL) {
                /* Its staging buffers would wait for the dead peer
                 * forever (t->sxfer still holds the peer). */
                kv_stage_peer_abandon(t->speer);
                speer_drop(pf, t->speer);
            }
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
                  BT_DIV_UP(t->n_tokens, pf->block_size))))
            return true;
    return false;
}

/* Progresses UCX until it is idle: a commit is a chain of flush, put
 * and flush, each step started from the previous one's completion, so
 * over shared memory one call to kv_ucx_progress may leave the next step
 * ready but not yet run.  Bounded, in case a transport never idles. */
static void ucx_progress_all(prefill_t *pf)
{
    for (int i = 0; i < 64 && kv_ucx_progress(pf->ucx); i++)
        ;
}

/* A CUDA IPC commit (device copies + epoch flag), or the last layers of
 * a staged hand-off, that began less than 2 ms ago: it completes in
 * tens of microseconds to ~0.5 ms whatever the decode worker does, so
 * the loop spins on it rather than sleeping a 1 ms poll tick on the
 * first-token path (measured: the tick cost ~1.1 ms in most hand-offs). */
static bool has_fresh_cipc_commit(prefill_t *pf)
{
    uint64_t now = bt_time_ns();

    for (prefill_task_t *t = pf->head; t; t = t->next)
        if (t->state == PREFILL_TASK_COMMITTING &&
            (t->ccommit != NULL || t->sxfer != NULL) &&
            !t->commit_done && now - t->t_computed < 2000000ull)
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

/* The staged UCX sender over the local pool (kv_transport_stage.h): CUDA
 * copies (or, direct, puts from device memory) for device KV, host
 * memcpys over the CPU pool with --kv-stage-host.  Without one the router
 * picks another transport (a warning, not an error). */
static void stage_setup(prefill_t *pf)
{
    kv_stage_send_config_t sc;

    kv_stage_send_config_init(&sc);
    sc.layout = *backend_kv_layout(engine_backend(pf->engine));
    sc.stage_blocks = pf->cfg.kv_stage_blocks > 0
                          ? pf->cfg.kv_stage_blocks
                          : BT_DIV_UP(2048, pf->block_size);
    if (pf->kv_on_device) {
        sc.ops = kv_stage_ops_cuda();
        sc.direct = pf->cfg.kv_stage_direct && kv_stage_ucx_has_cuda();
    } else {
        sc.ops = kv_stage_ops_host(true);
    }
    if (kv_stage_send_create(pf->ucx, &sc, &pf->stage) != BT_OK)
        BT_LOG_WARN("KV", "no staged UCX sender (%s); KV for other hosts "
                    "goes inline", bt_error_last());
}

/* Frees what prefill_create() set up around the engine (after the staged
 * sender, which uses UCX): UCX, CUDA IPC, the batch buffers and the
 * engine.  Both the error path and prefill_destroy() end with it. */
static void engine_teardown(prefill_t *pf)
{
    kv_ucx_destroy(&pf->ucx);
    kv_cipc_destroy(&pf->cipc);
    bt_free(pf->logits);
    bt_free(pf->hidden);
    bt_free(pf->bseqs);
    bt_free(pf->btasks);
    engine_destroy(&pf->engine);
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
        if (pf->kv_on_device && cfg->use_cuda_ipc) {
            /* the copy stream on rank 0's GPU; the other ranks' pools are
             * read from there over peer access */
            backend_t *be = engine_backend(pf->engine);
            bool ok = kv_cipc_create_on(b->device_index, &pf->cipc) == BT_OK;
            for (int r = 1; ok && r < backend_tp_size(be); r++)
                ok = kv_cipc_add_source(pf->cipc, b->device_index + r) ==
                     BT_OK;
            if (!ok) {
                kv_cipc_destroy(&pf->cipc);
                BT_LOG_WARN("KV", "CUDA IPC unavailable; KV goes inline");
            }
        }
        if (cfg->use_ucx && (!pf->kv_on_device || cfg->kv_stage)) {
            kv_ucx_config_t ucfg;
            kv_ucx_config_init(&ucfg);
            /* Device KV: UCX only carries staged hand-offs to other
             * hosts (no shared memory to lose), and a dead decode worker
             * must fail the puts so its staging buffers come back. */
            ucfg.peer_errors = cfg->ucx_peer_errors || pf->kv_on_device;
            if (kv_ucx_create(&ucfg, &pf->ucx) != BT_OK) {
                BT_LOG_WARN("KV", "UCX unavailable; KV goes inline");
                pf->ucx = NULL;
            }
        }
        /* the staged sender reads one pool: not with tp > 1 */
        if (pf->ucx != NULL && (pf->kv_on_device ? cfg->kv_stage
                                                 : cfg->kv_stage_host) &&
            backend_tp_size(engine_backend(pf->engine)) == 1)
            stage_setup(pf);
        if (pf->kv_on_device && pf->stage == NULL)
            kv_ucx_destroy(&pf->ucx); /* nothing else uses it */
    }
    if (pf->engine != NULL) {
        const backend_config_t *b = &pf->cfg.engine.backend;

        BT_LOG_INFO("PREFILL", "%s KV capacity: %d blocks of %d tokens = "
                    "%lld tokens (%s)", pf->name, b->n_kv_blocks,
                    b->block_size, (long long)b->n_kv_blocks * b->block_size,
                    cfg->engine.backend.n_kv_blocks > 0 ? "--kv-blocks"
                                                        : "sized from memory");
        /* Warm before the router hears of this worker (issue 36). */
        if (worker_ctl_warmup_wanted(cfg->warmup,
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
    kv_stage_send_destroy(&pf->stage);
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
    for (int i = 0; i < pf->n_peers; i++)
        kv_ucx_disconnect(&pf->peers[i].peer); /* bounded wait */
    pf->n_peers = 0;
    while (pf->n_speers > 0)
        speer_drop_at(pf, pf->n_speers - 1);
    kv_stage_send_destroy(&pf->stage); /* bounded wait for orphans */
    workerproc_metrics_attach(pf->cfg.metrics, NULL, NULL); /* /health */
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

    BT_LOG_INFO("PREFILL", "%s serving %s via %s%s", pf->name,
                pf->engine ? pf->cfg.engine.model_path : "the null model",
                pf->cfg.router, pf->ucx ? " (KV over UCX)" : "");
    for (;;) {
        bt_status_t status;
        int timeout;

        if (pf->stop && !pf->draining) {
            workerproc_send_drain(pf->sock, pf->name);
            pf->draining = true;
            drain_deadline = bt_time_ns() + 30ull * 1000000000ull;
            BT_LOG_INFO("PREFILL", "draining");
        }
        if (pf->draining && (pf->head == NULL || bt_time_ns() > drain_deadline))
            break;
        timeout = has_runnable(pf) || has_fresh_cipc_commit(pf)
                      ? 0 : (has_committing(pf) ? 1 : 50);
        status = workerproc_poll(pf->sock, pf->ucx, timeout);
        if (status != BT_OK)
            return status;
        workerproc_link_turn_begin(pf->link);
        handle_messages(pf);
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
        if (pf->ucx != NULL)
            kv_ucx_progress(pf->ucx);
        if (pf->engine == NULL)
            run_null(pf);
        else
            run_batch(pf);
        if (pf->ucx != NULL)
            ucx_progress_all(pf);
        if (pf->stage != NULL)
            for (int i = 0; i < 64 && kv_stage_send_progress(pf->stage); i++)
                ;
        reap(pf);
        peers_reap(pf);
        workerproc_link_turn_end(pf->link);
        publish_beat(pf);
    }
    workerproc_send_shutdown(pf->sock, pf->name);
    BT_LOG_INFO("PREFILL", "%s stopped after %llu prompts", pf->name,
                (unsigned long long)pf->served);
    return BT_OK;
}
