/*
 * decode.c - the decode worker's loop, reservations and continuous
 * batching (see decode.h).
 */
#include "decode.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "decode_budget.h"
#include "kv/kv_link.h"
#include "params_proto.h"
#include "proto_msg.h"
#include "stop.h"
#include "workerproc.h"
#include "workerproc_intake.h"
#include "workerproc_metrics.h"
#include "workerproc_opts.h"
#include "workerproc_prefix.h"

#define DECODE_NAME_MAX 64
#define DECODE_BLOCK_WAIT_NS (30ull * 1000000000ull)
#define DECODE_PREFILL_FLOOR 128 /* prompt tokens a step always may take */
/* A KvReady whose link still copies (staged: every layer's commit
 * landed, only the last host-to-device copies may still run) waits at
 * most this long; longer means something broke: fail it (the router
 * retries). */
#define DECODE_ARRIVAL_WAIT_NS (2000ull * 1000000ull)
/* Prefix cache events go to the router at most this often (batched). */
#define DECODE_KV_EVENTS_MS 20

typedef struct {
    bool used;
    uint64_t id;        /* request id */
    uint64_t epoch;     /* never reused */
    uint8_t cap[PROTO_CAPABILITY_BYTES]; /* random capability of the
                           grant (issue 42): a KvReady must present it */
    int *blocks;        /* (n_blocks) */
    int n_blocks;
    int limit_blocks;   /* blocks the request may grow to */
    uint64_t expires_ns;
    /* Aggregated mode: a PrefillTask for this reservation runs here. */
    bool local;         /* prompt being prefilled locally */
    bool local_done;    /* its KV is in the blocks (LOCAL arrival) */
    workerproc_prompt_t p; /* the admitted prompt (+ resumed tokens) */
    int n_fed;          /* prompt tokens whose KV is written */
    sampler_params_t sp;
    uint64_t t_start;   /* PrefillTask arrival */
    float *feat;        /* (dim) speculation: hidden state of the last
                           locally prefilled token, NULL when none */
    sampler_prompt_lp_t *plp; /* the prompt's logprobs (local prefill with
                           sp.prompt_logprobs: a row per position), or
                           NULL */
    /* The KV links' arrival slot is the reservation's index. */
    Baton__ControlMessage *pending; /* KvReady waiting for its link's
                           last copies to the pool; owned */
    uint64_t pending_since;
    /* Prefix cache (issue 38): the local prompt's chain under its salt;
     * its full blocks are cached as they are computed. */
    kv_prefix_cursor_t pcur;
    int n_hit;          /* prompt tokens found cached (not computed) */
    /* Disaggregated hits: blocks[0..held) were cached here at the grant
     * (KvGrant.cached_blocks, bound to this epoch); the hand-off moves
     * only blocks[held..).  held_hash is their chain hash: the KvReady's
     * prompt must start with the tokens they hold. */
    int held;
    bt_blockhash_t held_hash;
} decode_resv_t;

typedef struct {
    int *blocks;        /* (n_blocks) */
    int n_blocks;
    uint64_t release_ns;
} decode_quarantine_t;

/* A local prompt with prompt logprobs takes a logits row per position:
 * one such prompt a step, at most this many tokens of it. */
#define DECODE_LP_ROWS 64

typedef struct decode_seq_s decode_seq_t;
struct decode_seq_s {
    uint64_t id;
    uint64_t epoch;     /* of the reservation it came from: every TokenOut
                           and TaskError carries it (the router relays
                           only its current attempt's) */
    int *tokens;        /* (cap) prompt, generated; last one not yet fed */
    int n_tokens;
    int cap;
    int n_cached;       /* tokens whose KV is in the pool */
    int *blocks;        /* (max_blocks) block table */
    int n_blocks;
    int max_blocks;
    int limit_blocks;   /* blocks promised to it at admission */
    sampler_t *sampler; /* NULL for the null model */
    /* Structured output (KvReady.grammar): the sampler is masked with
     * gmask, written from gstate when the step is built; gstate follows
     * every sampled token.  NULL: none. */
    grammar_t *grammar; /* owned */
    grammar_state_t gstate;
    uint64_t *gmask;    /* (grammar_mask_words), owned */
    stop_t *stop;
    tok_stream_t *stream; /* NULL without text */
    int n_generated;    /* generated tokens of the request so far */
    uint64_t wait_since; /* blocked on a KV block since (0 = not) */
    /* Speculative decoding: the engine sequence owns tokens, blocks and
     * sampler for spec_step (`blocks` above stays empty). */
    engine_seq_t *eseq;
    spec_seq_t *sseq;
    bool spec_started;  /* its first decode step was taken */
    /* Overlapped steps (step()): */
    bool pend;          /* its last token is sampled but not yet emitted
                           (dec->emit_q; the next step emits it while
                           the GPU runs) */
    bool in_step;       /* part of the step in flight */
    bool has_lp;        /* lp holds the pending token's logprobs */
    sampler_logprobs_t lp; /* taken when sampled: the sampler's own is
                           overwritten by the step that runs while the
                           token is emitted */
    bool finished;      /* ended when emitted during the step in flight:
                           removed after the step, its row discarded */
    /* Prefix cache: its blocks are cached as they fill (prompt and
     * generated), and left cached when it ends. */
    bool pcache;        /* its blocks are its own (moved, verified) */
    kv_prefix_cursor_t pcur;
    decode_seq_t *next;
};

struct decode_s {
    decode_config_t cfg;
    proto_batch_t outbox; /* control messages of this turn's phase (the
                           * messages handled, the step's TokenOuts), sent
                           * as one message (issue 42); zeroed = empty */
    char name[DECODE_NAME_MAX];
    engine_t *engine;   /* NULL with --null-model */
    kv_allocator_t *kv; /* engine's, or own with --null-model */
    kv_layout_t layout;
    int vocab;
    int max_context;
    int block_size;
    int n_layers;
    int max_seqs;
    int budget;
    void *ctx;
    void *sock;
    kv_link_receiver_t *links;  /* the KV links it receives on */
    bool kv_on_device;          /* backend KV in GPU memory (cuda) */
    double tps;                 /* local prefill tokens/s, moving average */
    decode_budget_t cost;       /* step cost model: prefill tokens a step
                                   may take under --tpot-target-ms */
    workerproc_prefix_t *prefix; /* the pool's prefix cache (NULL: off,
                                   or the null model) */
    volatile sig_atomic_t stop;
    bool draining;
    workerproc_link_t *link;    /* sessions, acks, the heartbeat thread */
    uint64_t last_hb_ns;        /* last urgent heartbeat */
    int last_hb_free;           /* free blocks the last heartbeat said */
    uint64_t next_epoch;        /* random start: never reused, even by a
                                   restarted process */
    decode_resv_t *resv;        /* (max_reservations) */
    decode_quarantine_t *quar;  /* (max_reservations) */
    decode_seq_t *seqs;         /* running batch */
    int n_seqs;
    sampler_t **rsamp;          /* (max_seqs + DECODE_LP_ROWS) sampler of
                                   each logits row */
    int *rids;                  /* (max_seqs + DECODE_LP_ROWS) token
                                   sampled for each row */
    float *lp_logits;           /* (max_seqs + DECODE_LP_ROWS, vocab) rows
                                   of a local prompt's positions (prompt
                                   logprobs), made on first use */
    sampler_t **psamp;          /* (max_seqs) local prefill rows' samplers */
    decode_seq_t **emit_q;      /* (max_seqs) sampled, not yet emitted */
    int *emit_tok;              /* (max_seqs) their tokens */
    int n_emit;
    /* host time of the plain decode steps (ns, summed; BT_LOG_INFO at
     * shutdown, DEBUG every 1000 steps) */
    uint64_t t_build_ns;        /* building the batch */
    uint64_t t_begin_ns;        /* enqueue (cpu: forward + sampling) */
    uint64_t t_emit_ns;         /* previous step's tokens out */
    uint64_t t_wait_ns;         /* waiting for the device + sampling */
    uint64_t t_post_ns;         /* per-row bookkeeping after the step */
    uint64_t n_timed;
    backend_seq_t *bseqs;       /* (max_seqs) */
    decode_seq_t **bmap;        /* (max_seqs) */
    decode_resv_t **pmap;       /* (max_seqs) local prefill rows */
    uint64_t steps;
    uint64_t tokens_out;
    uint64_t cap_rejected;      /* KvReady / local PrefillTask with a
                                   wrong capability, dropped (issue 42) */
    /* Speculative decoding (--spec-head) */
    spec_head_t *head;
    spec_t *spec;
    spec_seq_t **sseqs;         /* (max_seqs) this step's sequences */
    int *n_out;                 /* (max_seqs) */
    int *out;                   /* (max_seqs, spec_max_step_tokens) */
    float *hidden;              /* (max_seqs, dim) local prefill rows */
    float *feat;                /* (dim) a shipped feature, aligned */
    int dim;
    uint64_t first_drafted;     /* requests whose first step drafted */
    uint64_t first_plain;       /* ... decoded plainly */
};

void decode_config_init(decode_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->metrics_port = -1; /* metrics hook */
    cfg->metrics_host = "127.0.0.1";
    cfg->router = "tcp://127.0.0.1:5556";
    engine_config_init(&cfg->engine);
    cfg->kv_timeout_ms = 30000;
    cfg->quarantine_ms = 2000;
    cfg->max_reservations = 1024;
    cfg->use_ucx = true;
    cfg->ucx_shm_pool = true;
    cfg->chunk_tokens = 512;
    cfg->use_cuda_ipc = true;
    cfg->kv_stage = true;
    cfg->kv_stage_direct = true;
    /* sized from memory and from the pool (issue 36) */
    cfg->engine.backend.n_kv_blocks = 0;
    cfg->engine.backend.max_seqs = 0;
    spec_config_init(&cfg->spec);
    /* An aggregated worker keeps its running streams' steps under 50 ms
     * (the TPOT SLO issue 36 names): on one H200 at 256 streams of
     * 2048/128 the bound took TPOT p99 from 113.6 to 50.8 ms for 5%
     * fewer tokens/s (docs/PERFORMANCE.md "Serving"). */
    cfg->tpot_target_ms = 50;
    cfg->prefix_cache = true;
}

/* --spec-head: the draft head, the speculative decoder and its step
 * buffers. */
static bt_status_t spec_setup(decode_t *dec)
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

static void spec_teardown(decode_t *dec)
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

// ---------------------------------------------------------------------------
// Messages

/* Sends what the outbox holds, as one ControlBatch when the router takes
 * them: CURVE boxes one message per step (every sequence's TokenOut) and
 * one per burst of requests handled (their KvGrants), not one per
 * request (issue 42). */
static void send_outbox(decode_t *dec)
{
    workerproc_send_batch(dec->sock, &dec->outbox,
                          workerproc_link_batches(dec->link));
}

/* Queues msg in the outbox (sent by send_outbox within this loop turn,
 * in order); alone, after the queued ones, when it cannot be queued. */
static void send_msg(decode_t *dec, Baton__ControlMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    if (proto_batch_is_full(&dec->outbox,
                            baton__control_message__get_packed_size(msg)))
        send_outbox(dec);
    if (proto_batch_add_control(&dec->outbox, msg) == BT_OK)
        return;
    send_outbox(dec);
    workerproc_send(dec->sock, msg);
}

static void fill_layout(const decode_t *dec, Baton__KvLayout *l)
{
    l->has_n_layers = 1;
    l->n_layers = (uint32_t)dec->layout.n_layers;
    l->has_n_blocks = 1;
    l->n_blocks = (uint32_t)dec->layout.n_blocks;
    l->has_block_size = 1;
    l->block_size = (uint32_t)dec->layout.block_size;
    l->has_n_kv_heads = 1;
    l->n_kv_heads = (uint32_t)dec->layout.n_kv_heads;
    l->has_head_dim = 1;
    l->head_dim = (uint32_t)dec->layout.head_dim;
    l->has_elem_size = 1;
    l->elem_size = (uint32_t)dec->layout.elem_size;
}

static void drop_all(decode_t *dec);

/* Every Register starts a new session (workerproc_link.h): what this
 * worker held belongs to the old one, which the router has given up or
 * is about to, so it is dropped first. */
static void send_register(decode_t *dec)
{
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_DECODE, .name = dec->name,
        .engine = dec->engine, .ecfg = &dec->cfg.engine, .vocab = dec->vocab,
        .max_context = dec->max_context, .host_id = dec->cfg.host_id,
        .kv_on_device = dec->kv_on_device,
    };
    workerproc_register_t r;
    Baton__Register *reg = &r.reg;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;
    kv_link_endpoint_t eps[KV_LINK_N_IDS];
    int ids[KV_LINK_N_IDS];

    drop_all(dec);
    /* A new session: the router forgot what this worker caches. */
    if (dec->prefix != NULL)
        workerproc_prefix_want_snapshot(dec->prefix);
    if (dec->links != NULL) {
        rc.links = ids;
        rc.n_links = kv_link_receiver_offers(dec->links, ids, KV_LINK_N_IDS);
        rc.eps = eps;
        rc.n_eps = kv_link_receiver_endpoints(dec->links, eps, KV_LINK_N_IDS);
    }
    workerproc_register_init(&r, &rc);
    reg->has_session = 1;
    reg->session = workerproc_link_begin_session(dec->link);
    fill_layout(dec, &lay);
    reg->kv_layout = &lay;
    reg->has_can_prefill = 1;
    reg->can_prefill = dec->cfg.can_prefill;
    send_outbox(dec); /* the old session's last words go first */
    workerproc_send_register(dec->sock, reg);
}

/* Blocks promised to admitted requests beyond what they hold now. */
static int promised_blocks(const decode_t *dec)
{
    int n = 0;
    for (int i = 0; i < dec->cfg.max_reservations; i++)
        if (dec->resv[i].used)
            n += BT_MAX(0, dec->resv[i].limit_blocks - dec->resv[i].n_blocks);
    for (const decode_seq_t *s = dec->seqs; s; s = s->next) {
        int held = s->n_blocks;
        if (s->eseq != NULL)
            engine_seq_blocks(s->eseq, &held);
        n += BT_MAX(0, s->limit_blocks - held);
    }
    return n;
}

/* Free blocks not promised to anyone: what new requests may take. */
static int available_blocks(const decode_t *dec)
{
    return BT_MAX(0, kv_allocator_free_count(dec->kv) - promised_blocks(dec));
}

/* Publishes what the heartbeats and the metrics say (the link's thread
 * sends the heartbeats on schedule); one goes out at once, at most every
 * 10 ms, when the free block count moved, so the router's view stays
 * fresh.  Called once a turn: one pass over the reservations. */
static void publish_beat(decode_t *dec)
{
    workerproc_beat_t b;
    uint64_t now = bt_time_ns();
    bool urgent;

    memset(&b, 0, sizeof(b));
    b.running = (uint32_t)dec->n_seqs;
    b.outstanding = (uint64_t)dec->n_seqs; /* a token each */
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        const decode_resv_t *r = &dec->resv[i];
        if (!r->used)
            continue;
        b.waiting++;
        b.reserved += (uint32_t)r->n_blocks;
        if (r->local)
            b.outstanding += (uint64_t)(r->p.n_tokens - r->n_fed);
    }
    b.has_reserved = true;
    b.draining = dec->draining;
    b.has_kv = true;
    b.free_kv = (uint32_t)available_blocks(dec);
    b.total_kv = (uint32_t)kv_allocator_total(dec->kv);
    b.prefill_tokens_per_s = dec->tps;
    if (dec->prefix != NULL)
        workerproc_prefix_beat(dec->prefix, &b);
    if (dec->spec != NULL) {
        spec_stats_t st;

        spec_get_stats(dec->spec, &st);
        b.has_spec = true;
        b.spec_verify_steps = st.verify_seqs;
        b.spec_verify_tokens = st.verify_tokens;
        b.spec_accept_length = spec_accept_length(dec->spec);
    }
    urgent = (int)b.free_kv != dec->last_hb_free &&
             now - dec->last_hb_ns >= 10000000ull;
    dec->last_hb_free = (int)b.free_kv;
    workerproc_link_publish(dec->link, &b, urgent);
    if (urgent)
        dec->last_hb_ns = now;
}

static void send_task_error(decode_t *dec, uint64_t id, uint64_t epoch,
                            Baton__ErrorCode code, const char *text)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__TaskError te = BATON__TASK_ERROR__INIT;

    te.has_request_id = 1;
    te.request_id = id;
    te.has_epoch = epoch != 0;
    te.epoch = epoch;
    te.has_code = 1;
    te.code = code;
    te.message = (char *)text;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_TASK_ERROR;
    msg.task_error = &te;
    send_msg(dec, &msg);
}

// ---------------------------------------------------------------------------
// Reservations

static void quarantine(decode_t *dec, int *blocks, int n)
{
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        decode_quarantine_t *q = &dec->quar[i];
        if (q->blocks != NULL)
            continue;
        q->blocks = blocks;
        q->n_blocks = n;
        q->release_ns = bt_time_ns() +
                        (uint64_t)dec->cfg.quarantine_ms * 1000000ull;
        return;
    }
    kv_allocator_release(dec->kv, n, blocks); /* table full: release now */
    bt_free(blocks);
}

/* Frees a reservation.  `safe` tells that no remote writer can still
 * target its blocks (inline KV, or its KV already landed). */
static void resv_free(decode_t *dec, decode_resv_t *r, bool safe)
{
    bool remote = dec->links != NULL && kv_link_receiver_is_remote(dec->links);

    if (r->local || r->local_done)
        safe = true; /* prefilled here: no remote writer */
    if (dec->links != NULL)
        kv_link_receiver_reset(dec->links, (int)(r - dec->resv), !safe);
    proto_control_free(&r->pending);
    workerproc_prompt_cleanup(&r->p);
    bt_free(r->feat);
    sampler_prompt_lp_destroy(&r->plp);
    if (r->blocks != NULL) {
        if (!safe && remote && dec->cfg.quarantine_ms > 0) {
            /* Cached blocks held for the hand-off were never a writer's
             * target: back to the cache now, the rest waits. */
            int held = BT_MIN(r->held, r->n_blocks);
            if (held > 0) {
                kv_allocator_release(dec->kv, held, r->blocks);
                memmove(r->blocks, r->blocks + held,
                        (size_t)(r->n_blocks - held) * sizeof(int));
            }
            quarantine(dec, r->blocks, r->n_blocks - held);
        } else {
            kv_allocator_release(dec->kv, r->n_blocks, r->blocks);
            bt_free(r->blocks);
        }
    }
    memset(r, 0, sizeof(*r));
}

static void cap_rejected(decode_t *dec)
{
    dec->cap_rejected++;
    workerproc_metrics_kv_rejected(dec->cfg.metrics);
}

/* Whether the capability a KvReady (or a local PrefillTask's grant)
 * presents is r's: 16 bytes, compared in constant time. */
static bool capability_ok(const decode_resv_t *r,
                          const ProtobufCBinaryData *cap, bool has)
{
    return has && cap->len == sizeof(r->cap) &&
           bt_ct_equal(cap->data, r->cap, sizeof(r->cap));
}

static decode_resv_t *resv_find(decode_t *dec, uint64_t id)
{
    for (int i = 0; i < dec->cfg.max_reservations; i++)
        if (dec->resv[i].used && dec->resv[i].id == id)
            return &dec->resv[i];
    return NULL;
}

/* The chain hash of tokens' first n_blocks full blocks under root. */
static bt_blockhash_t held_chain(const decode_t *dec, bt_blockhash_t root,
                                 const int *tokens, int n_blocks)
{
    for (int k = 0; k < n_blocks; k++)
        root = bt_blockhash_next(root, tokens + (size_t)k * dec->block_size,
                                 dec->block_size);
    return root;
}

/* Disaggregated hits (issue 38): the prompt's leading full blocks this
 * worker's prefix cache holds (same identity and salt as a local prefill;
 * never the last token's block) replace blocks[0..) of a new reservation
 * of `need`.  Only ids the router sent, exactly the reservation's tokens,
 * are matched.  Returns the blocks held (0: none). */
static int reserve_held(decode_t *dec, const Baton__KvReserve *m,
                        int *blocks, int need, bt_blockhash_t *hash_p)
{
    bt_blockhash_t root;
    int hit;

    if (dec->prefix == NULL || m->n_prompt_ids == 0 ||
        m->n_prompt_ids != m->n_tokens ||
        m->n_tokens > (uint32_t)dec->max_context)
        return 0;
    for (size_t i = 0; i < m->n_prompt_ids; i++)
        if (m->prompt_ids[i] < 0 || m->prompt_ids[i] >= dec->vocab)
            return 0; /* the prefill worker refuses it */
    root = workerproc_prefix_root(dec->prefix, m->has_cache_salt,
                                  &m->cache_salt);
    hit = workerproc_prefix_adopt(dec->prefix, root, m->prompt_ids,
                                  (int)m->n_prompt_ids, blocks, need) /
          dec->block_size;
    if (hit > 0) {
        *hash_p = held_chain(dec, root, m->prompt_ids, hit);
        BT_LOG_DEBUG("KV", "request %llu: %d of %d reserved blocks held "
                     "(prefix cache): the hand-off moves the rest",
                     (unsigned long long)m->request_id, hit, need);
    }
    return hit;
}

static void on_reserve(decode_t *dec, const Baton__KvReserve *m)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvGrant g = BATON__KV_GRANT__INIT;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;
    decode_resv_t *r = NULL;
    int need = BT_DIV_UP((int)BT_MIN(m->n_tokens, (uint32_t)dec->max_context),
                         dec->block_size);
    uint32_t total = m->has_max_total_tokens ? m->max_total_tokens
                                             : (uint32_t)dec->max_context;
    int limit = BT_DIV_UP((int)BT_MIN(total, (uint32_t)dec->max_context),
                          dec->block_size);
    int *blocks = NULL;
    int *recv_ids = NULL;
    int held = 0;
    bt_blockhash_t held_hash = { 0, 0 };
    uint8_t cap[PROTO_CAPABILITY_BYTES];

    g.has_request_id = 1;
    g.request_id = m->request_id;
    g.has_ok = 1;
    if (need <= 0)
        need = 1;
    if (resv_find(dec, m->request_id) != NULL) {
        g.error = "duplicate reservation";
        goto reply;
    }
    /* A request already running here cannot get a second sequence: two
     * would both stream.  (After a router restart or a re-registration
     * nothing runs; a live attempt here is cancelled before a new one is
     * reserved.) */
    for (decode_seq_t *s = dec->seqs; s; s = s->next) {
        if (s->id == m->request_id) {
            g.error = "request already running here";
            goto reply;
        }
    }
    for (int i = 0; i < dec->cfg.max_reservations && r == NULL; i++)
        if (!dec->resv[i].used)
            r = &dec->resv[i];
    if (r == NULL || dec->draining) {
        g.error = dec->draining ? "draining" : "too many reservations";
        goto reply;
    }
    /* The capability first: nothing to undo when the kernel has none. */
    if (bt_random_secret(cap, sizeof(cap)) != BT_OK) {
        BT_LOG_ERROR("KV", "request %llu: no random capability: %s",
                     (unsigned long long)m->request_id, bt_error_last());
        bt_error_clear();
        g.error = "no random capability";
        goto reply;
    }
    limit = BT_MAX(limit, need);
    if (available_blocks(dec) < limit) {
        g.error = "KV pool full";
        goto reply;
    }
    blocks = bt_malloc((size_t)need * sizeof(int), "decode_resv");
    if (blocks == NULL || kv_allocator_alloc(dec->kv, need, blocks) != BT_OK) {
        bt_free(blocks);
        g.error = "KV pool full";
        goto reply;
    }
    held = reserve_held(dec, m, blocks, need, &held_hash);
    if (dec->links != NULL) {
        /* The links clear the slot; one writing through a receive area
         * reserves it next to the blocks (only when asked: scarce).  The
         * held blocks are no writer's target. */
        kv_link_grant_t lg = {
            .request_id = m->request_id, .slot = (int)(r - dec->resv),
            .epoch = dec->next_epoch + 1, .blocks = blocks + held,
            .n = need - held,
            .want_recv_area = m->has_kv_stage && m->kv_stage,
        };
        bt_status_t st = BT_OK;
        if (lg.want_recv_area) {
            recv_ids = bt_malloc((size_t)lg.n * sizeof(int), "decode_resv");
            lg.recv_ids = recv_ids;
            if (recv_ids == NULL)
                lg.want_recv_area = false;
        }
        st = kv_link_receiver_arm(dec->links, &lg);
        if (st == BT_ERR_NO_RESOURCE) {
            /* The area holds the hand-offs in flight: wait for one. */
            kv_allocator_release(dec->kv, need, blocks);
            bt_free(blocks);
            g.error = "KV stage receive area full";
            goto reply;
        }
        if (!lg.has_recv_ids) { /* the grant goes without: another link */
            bt_free(recv_ids);
            recv_ids = NULL;
        }
    }
    r->used = true;
    r->id = m->request_id;
    memcpy(r->cap, cap, sizeof(cap));
    r->epoch = ++dec->next_epoch;
    r->blocks = blocks;
    r->n_blocks = need;
    r->held = held;
    r->held_hash = held_hash;
    r->limit_blocks = limit;
    r->expires_ns = bt_time_ns() + (uint64_t)dec->cfg.kv_timeout_ms * 1000000ull;
    g.ok = 1;
    g.n_block_ids = (size_t)need;
    g.block_ids = blocks;
    g.has_epoch = 1;
    g.epoch = r->epoch;
    g.has_slot = 1;
    g.slot = (int32_t)(r - dec->resv);
    g.has_capability = 1;
    g.capability.data = r->cap;
    g.capability.len = sizeof(r->cap);
    g.has_cached_blocks = held > 0;
    g.cached_blocks = (uint32_t)held;
    if (recv_ids != NULL) {
        g.n_stage_block_ids = (size_t)(need - held);
        g.stage_block_ids = recv_ids;
    }
reply:
    g.has_attempt = m->has_attempt;
    g.attempt = m->attempt;
    g.has_free_blocks = 1;
    g.free_blocks = (uint32_t)available_blocks(dec);
    fill_layout(dec, &lay);
    g.kv_layout = &lay;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_GRANT;
    msg.kv_grant = &g;
    send_msg(dec, &msg);
    bt_free(recv_ids);
}

static void on_release(decode_t *dec, const Baton__KvRelease *m)
{
    decode_resv_t *r = resv_find(dec, m->request_id);

    if (r != NULL && (m->epoch == 0 || m->epoch == r->epoch))
        resv_free(dec, r, false);
}

// ---------------------------------------------------------------------------
// Sequences

static void seq_cache_blocks(decode_t *dec, decode_seq_t *s);

static void seq_destroy(decode_t *dec, decode_seq_t *s)
{
    seq_cache_blocks(dec, s); /* a finished sequence leaves them cached */
    spec_seq_destroy(&s->sseq);
    if (s->eseq != NULL)
        engine_seq_destroy(dec->engine, &s->eseq); /* releases its KV */
    else if (s->n_blocks > 0)
        kv_allocator_release(dec->kv, s->n_blocks, s->blocks);
    sampler_destroy(&s->sampler);
    grammar_destroy(&s->grammar);
    bt_free(s->gmask);
    stop_destroy(&s->stop);
    tok_stream_destroy(&s->stream);
    bt_free(s->tokens);
    bt_free(s->blocks);
    bt_free(s);
}

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

static void seq_remove(decode_t *dec, decode_seq_t *s)
{
    if (s->pend) { /* drop its unsent token from the emit queue */
        int j = 0;
        for (int i = 0; i < dec->n_emit; i++) {
            if (dec->emit_q[i] == s)
                continue;
            dec->emit_q[j] = dec->emit_q[i];
            dec->emit_tok[j++] = dec->emit_tok[i];
        }
        dec->n_emit = j;
    }
    for (decode_seq_t **pp = &dec->seqs; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            dec->n_seqs--;
            break;
        }
    }
    seq_destroy(dec, s);
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

/* Speculation-aware hand-off: seeds the draft state of s with the last
 * prompt token's hidden state, computed here (local prefill) or shipped
 * by the prefill worker in KvReady; without one the first step decodes
 * plainly and drafting starts from the next. */
static void import_feature(decode_t *dec, decode_seq_t *s,
                           const decode_resv_t *r, const Baton__KvReady *m)
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

/* KvReady: the request joins the running batch once its KV is in the
 * reservation's blocks.  Returns true when it kept `msg` (staged KV whose
 * last copies still run: r->pending, retried by arrivals_pending), else the
 * caller frees it. */
static bool on_ready(decode_t *dec, Baton__ControlMessage *msg)
{
    const Baton__KvReady *m = msg->kv_ready;
    decode_resv_t *r = resv_find(dec, m->request_id);
    decode_seq_t *s = NULL;
    stop_config_t scfg;
    int n = (int)m->n_tokens, keep;
    const char *why = "out of memory";
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INTERNAL;
    bool arrived = false;

    if (r == NULL || r->epoch != m->epoch) {
        send_task_error(dec, m->request_id, m->epoch,
                        BATON__ERROR_CODE__ERROR_WORKER,
                        "KV reservation expired or stale epoch");
        return false;
    }
    if (!capability_ok(r, &m->capability, m->has_capability)) {
        /* Nothing of it is committed.  The router fails the request on
         * the TaskError below, so the reservation goes now (its blocks
         * quarantined when a remote writer may still hold them) instead
         * of at the KV timeout. */
        cap_rejected(dec);
        if (r->pending == msg)
            r->pending = NULL; /* the caller frees msg */
        resv_free(dec, r, false);
        BT_LOG_WARN("KV", "request %llu: KvReady with a wrong capability "
                    "dropped", (unsigned long long)m->request_id);
        send_task_error(dec, m->request_id, m->epoch,
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
         !bt_blockhash_eq(r->held_hash, held_chain(
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
        spec_seq_set_max_slots(s->sseq, r->limit_blocks * dec->block_size);
        import_feature(dec, s, r, m);
    } else {
        memcpy(s->blocks, r->blocks, (size_t)keep * sizeof(int));
        s->n_blocks = keep;
        r->n_blocks -= keep;
        memmove(r->blocks, r->blocks + keep, (size_t)r->n_blocks *
                                                 sizeof(int));
    }
    s->limit_blocks = r->limit_blocks;
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
    resv_free(dec, r, true);
    s->next = dec->seqs;
    dec->seqs = s;
    dec->n_seqs++;
    return false;

fail:
    if (s != NULL)
        seq_destroy(dec, s);
    send_task_error(dec, m->request_id, r->epoch, code, why);
    resv_free(dec, r, arrived || dec->links == NULL ||
                          !kv_link_receiver_is_remote(dec->links));
    return false;
}

/* Retries the KvReady messages waiting for their link's last copies. */
static void arrivals_pending(decode_t *dec)
{
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        decode_resv_t *r = &dec->resv[i];
        Baton__ControlMessage *msg;
        if (!r->used || r->pending == NULL)
            continue;
        msg = r->pending;
        r->pending = NULL;
        if (!on_ready(dec, msg))
            proto_control_free(&msg);
    }
}

static bool has_arrivals_pending(const decode_t *dec)
{
    for (int i = 0; i < dec->cfg.max_reservations; i++)
        if (dec->resv[i].used && dec->resv[i].pending != NULL)
            return true;
    return false;
}

// ---------------------------------------------------------------------------
// Aggregated mode: local prefill into the reservation's own blocks

static void send_prefill_failure(decode_t *dec, uint64_t id, uint64_t epoch,
                                 Baton__ErrorCode code, const char *text)
{
    workerproc_send_prefill_failure(dec->sock, id, epoch, code, text);
}

static void local_prefill_done(decode_t *dec, decode_resv_t *r, int first,
                               const sampler_logprobs_t *lp);

/* PrefillTask for one of our own reservations (the router chose this
 * worker for both roles).  Admits the prompt through the intake it shares
 * with baton-prefill (workerproc_intake.h), then queues it for step(). */
static void on_prefill_task(decode_t *dec, const Baton__PrefillTask *m)
{
    const Baton__KvGrant *g = m->grant;
    decode_resv_t *r = resv_find(dec, m->request_id);
    Baton__ErrorCode code = BATON__ERROR_CODE__ERROR_INVALID;
    char err[256];
    workerproc_intake_t in = {
        .engine = dec->engine, .vocab = dec->vocab,
        .max_context = dec->max_context,
    };
    workerproc_prompt_t p;
    const Baton__SamplingParams *sp = m->sampling;

    if (!dec->cfg.can_prefill) {
        send_prefill_failure(dec, m->request_id, g != NULL ? g->epoch : 0,
                             BATON__ERROR_CODE__ERROR_WORKER,
                             "this decode worker does not prefill");
        return;
    }
    if (r == NULL || g == NULL || g->epoch != r->epoch || r->local ||
        r->local_done || !capability_ok(r, &g->capability,
                                        g->has_capability)) {
        if (r != NULL && g != NULL && g->epoch == r->epoch &&
            !capability_ok(r, &g->capability, g->has_capability))
            cap_rejected(dec);
        send_prefill_failure(dec, m->request_id, g != NULL ? g->epoch : 0,
                             BATON__ERROR_CODE__ERROR_WORKER,
                             "no matching KV reservation for local prefill");
        return;
    }
    in.reserved_tokens = r->n_blocks * dec->block_size;
    if (workerproc_intake_prompt(&in, m, &p, &code, err, sizeof(err)) !=
        BT_OK) {
        send_prefill_failure(dec, m->request_id, g->epoch, code, err);
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
        local_prefill_done(dec, r, -1, NULL);
    return;

fail:
    workerproc_prompt_cleanup(&p);
    send_prefill_failure(dec, m->request_id, g->epoch, code, err);
}

static bool has_local_prefill(const decode_t *dec)
{
    if (!dec->cfg.can_prefill)
        return false;
    for (int i = 0; i < dec->cfg.max_reservations; i++)
        if (dec->resv[i].local)
            return true;
    return false;
}

/* The sampler of a local prompt's first token: it continues the
 * request's random stream, as baton-prefill does.  NULL (failure sent)
 * when the parameters are refused. */
static sampler_t *local_prefill_sampler(decode_t *dec, decode_resv_t *r)
{
    sampler_t *sampler = NULL;

    if (workerproc_intake_sampler(&r->sp, dec->vocab, &r->p, &sampler) !=
        BT_OK) {
        send_prefill_failure(dec, r->id, r->epoch,
                             BATON__ERROR_CODE__ERROR_INVALID,
                             bt_error_last());
        r->local = false;
        return NULL;
    }
    return sampler;
}

/* A local prompt is computed and its first token sampled (by
 * local_prefill_sampler's sampler; the null model picks it here):
 * reply. */
static void local_prefill_done(decode_t *dec, decode_resv_t *r, int first,
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
    workerproc_send_prefill_done(dec->sock, &done, r->id, &r->p, first, text,
                                 text_len, r->epoch, r->cap, sizeof(r->cap),
                                 (bt_time_ns() - r->t_start) / 1000, 0);
}

static void on_cancel(decode_t *dec, uint64_t id)
{
    decode_resv_t *r = resv_find(dec, id);

    if (r != NULL)
        resv_free(dec, r, false);
    for (decode_seq_t *s = dec->seqs; s; s = s->next) {
        if (s->id == id) {
            seq_remove(dec, s);
            return;
        }
    }
}

/* Drops every sequence and reservation (a new session starts: see
 * send_register).  Reserved blocks go through the quarantine, as on a
 * cancel: a prefill worker of the old session may still be writing. */
static void drop_all(decode_t *dec)
{
    int n_seqs = dec->n_seqs, n_resv = 0;

    while (dec->seqs != NULL)
        seq_remove(dec, dec->seqs);
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        if (dec->resv[i].used) {
            resv_free(dec, &dec->resv[i], false);
            n_resv++;
        }
    }
    if (n_seqs > 0 || n_resv > 0)
        BT_LOG_WARN("DECODE", "%s: new session: dropped %d sequences and %d "
                    "reservations of the old one (the router resumes them)",
                    dec->name, n_seqs, n_resv);
}

/* workerproc_handlers_t.on_msg: the decode role's message kinds. */
static workerproc_msg_t on_msg(void *arg, Baton__ControlMessage *msg)
{
    decode_t *dec = arg;

    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_KV_RESERVE:
        on_reserve(dec, msg->kv_reserve);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_RELEASE:
        on_release(dec, msg->kv_release);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_READY:
        /* kept until its staged copies finished */
        return on_ready(dec, msg) ? WORKERPROC_MSG_KEPT : WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK:
        on_prefill_task(dec, msg->prefill_task);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_CANCEL_TASK:
        on_cancel(dec, msg->cancel_task->request_id);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_RESYNC:
        if (dec->prefix != NULL)
            workerproc_prefix_on_resync(dec->prefix, msg->kv_resync);
        return WORKERPROC_MSG_DONE;
    default:
        return WORKERPROC_MSG_UNKNOWN;
    }
}

static void handle_messages(decode_t *dec)
{
    workerproc_handlers_t h = {
        .sock = dec->sock, .link = dec->link, .stop = &dec->stop,
        .on_msg = on_msg, .arg = dec,
    };

    workerproc_handle_messages(&h);
}

// ---------------------------------------------------------------------------
// The decode step

/* lp: the logprobs of ids[0] when n is 1 (SamplingParams.logprobs), else
 * NULL. */
static void send_tokens(decode_t *dec, decode_seq_t *s, int index,
                        const int *ids, int n, const char *text,
                        size_t text_len, Baton__FinishReason finish,
                        const sampler_logprobs_t *lp)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__TokenOut out = BATON__TOKEN_OUT__INIT;
    float logprob;

    if (lp != NULL && n == 1) {
        logprob = lp->logprob;
        out.n_logprobs = 1;
        out.logprobs = &logprob;
        out.n_top_ids = (size_t)lp->n_top;
        out.top_ids = (int32_t *)lp->top_ids;
        out.n_top_logprobs = (size_t)lp->n_top;
        out.top_logprobs = (float *)lp->top_logprobs;
    }

    out.has_request_id = 1;
    out.request_id = s->id;
    out.has_epoch = 1;
    out.epoch = s->epoch;
    out.has_index = 1;
    out.index = (uint32_t)index;
    out.n_ids = (size_t)n;
    out.ids = (int32_t *)ids;
    if (text_len > 0) {
        out.has_text = 1;
        out.text.data = (uint8_t *)text;
        out.text.len = text_len;
    }
    if (finish != BATON__FINISH_REASON__FINISH_NONE) {
        out.has_finish = 1;
        out.finish = finish;
    } else if (s->stop != NULL) {
        /* The router keeps it: a failover continues the matching. */
        size_t n_held;
        const char *held = stop_held(s->stop, &n_held);
        if (n_held > 0) {
            out.has_stop_held = 1;
            out.stop_held.data = (uint8_t *)held;
            out.stop_held.len = n_held;
        }
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_TOKEN_OUT;
    msg.token_out = &out;
    send_msg(dec, &msg);
}

/* Handles n new tokens of `s` in order (one TokenOut for all of them);
 * stops at the first that ends the request: nothing after a stop id,
 * stop string or the length limit goes out.  Returns true when it
 * finished. */
static bool seq_emit_n(decode_t *dec, decode_seq_t *s, const int *toks,
                       int n)
{
    /* logprobs come with plain steps only (one token; speculative
     * decoding refuses requests that want them) */
    const sampler_logprobs_t *lp = n == 1 && s->has_lp ? &s->lp : NULL;
    char piece[512], shown[8192];
    size_t shown_len = 0;
    Baton__FinishReason finish = BATON__FINISH_REASON__FINISH_NONE;
    int index = s->n_generated, ids[SPEC_MAX_DEPTH + 2], n_ids = 0;

    for (int i = 0; i < n && finish == BATON__FINISH_REASON__FINISH_NONE;
         i++) {
        int tok = toks[i];
        size_t piece_len = 0, len = 0;
        stop_reason_t reason;

        /* room for this token's text and a final flush */
        if (sizeof(shown) - shown_len < 2 * sizeof(piece) + 1024 ||
            n_ids == (int)(sizeof(ids) / sizeof(ids[0]))) {
            send_tokens(dec, s, index, ids, n_ids, shown, shown_len,
                        finish, NULL);
            index += n_ids;
            n_ids = 0;
            shown_len = 0;
        }
        s->tokens[s->n_tokens++] = tok;
        if (s->stream != NULL &&
            tok_stream_push(s->stream, tok, piece, sizeof(piece),
                            &piece_len) != BT_OK)
            piece_len = 0;
        reason = stop_feed(s->stop, tok, piece, piece_len,
                           shown + shown_len, sizeof(shown) - shown_len,
                           &len);
        shown_len += len;
        if (reason != STOP_EOS) {
            s->n_generated++;
            ids[n_ids++] = tok;
        }
        if (reason == STOP_NONE && s->n_tokens > dec->max_context)
            reason = STOP_LENGTH; /* the new token cannot be fed */
        if (reason != STOP_NONE) {
            finish = reason == STOP_LENGTH
                         ? BATON__FINISH_REASON__FINISH_LENGTH
                         : BATON__FINISH_REASON__FINISH_STOP;
            if (reason != STOP_STRING) {
                size_t tail = 0;
                stop_flush(s->stop, shown + shown_len,
                           sizeof(shown) - shown_len, &tail);
                shown_len += tail;
                if (s->stream != NULL &&
                    tok_stream_flush(s->stream, shown + shown_len,
                                     sizeof(shown) - shown_len,
                                     &tail) == BT_OK)
                    shown_len += tail;
            }
        }
    }
    if (n_ids > 0 || shown_len > 0 ||
        finish != BATON__FINISH_REASON__FINISH_NONE)
        send_tokens(dec, s, index, ids, n_ids, shown, shown_len, finish,
                    lp);
    s->has_lp = false;
    dec->tokens_out += (uint64_t)n_ids;
    return finish != BATON__FINISH_REASON__FINISH_NONE;
}

/* Handles one sampled token of `s`; returns true when it finished. */
static bool seq_emit(decode_t *dec, decode_seq_t *s, int tok)
{
    return seq_emit_n(dec, s, &tok, 1);
}

/* Takes the KV block the next token of `s` needs; false when the pool is
 * full (the sequence waits a step). */
static bool seq_has_room(decode_t *dec, decode_seq_t *s)
{
    int want = BT_DIV_UP(s->n_cached + 1, dec->block_size);

    if (want <= s->n_blocks)
        return true;
    if (want > s->max_blocks ||
        kv_allocator_alloc(dec->kv, 1, s->blocks + s->n_blocks) != BT_OK)
        return false;
    s->n_blocks++;
    return true;
}

/* Makes the rows buffer of prompt logprobs, once; false: no memory (the
 * prompt waits). */
static bool lp_logits_ready(decode_t *dec)
{
    if (dec->lp_logits == NULL)
        dec->lp_logits = bt_malloc(((size_t)dec->max_seqs + DECODE_LP_ROWS) *
                                       (size_t)dec->vocab * sizeof(float),
                                   "decode_lp_logits");
    return dec->lp_logits != NULL;
}

/* Speculative decoding: one spec_step over the running batch.  Each
 * sequence first gets the KV slot plain decoding needs (else it waits a
 * step, as in plain mode); the draft tree's extra slots are taken by
 * spec_step only where the pool has them, within the request's
 * admission promise (spec_seq_set_max_slots). */
static void step_spec(decode_t *dec)
{
    int n = 0, max_step = spec_max_step_tokens(dec->spec);
    uint64_t now = bt_time_ns();
    decode_seq_t *s, *next;
    bt_status_t status;

    for (s = dec->seqs; s && n < dec->max_seqs && n < dec->budget; s = next) {
        int cached = engine_seq_cached(s->eseq);
        next = s->next;
        if (engine_seq_reserve(dec->engine, s->eseq, cached + 1) != BT_OK) {
            if (s->wait_since == 0)
                s->wait_since = now;
            if (now - s->wait_since > DECODE_BLOCK_WAIT_NS) {
                send_task_error(dec, s->id, s->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                                "KV pool full for too long");
                seq_remove(dec, s);
            }
            continue;
        }
        s->wait_since = 0;
        dec->bmap[n] = s;
        dec->sseqs[n++] = s->sseq;
    }
    if (n == 0)
        return;
    status = spec_step(dec->spec, dec->sseqs, n, dec->n_out, dec->out);
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
            send_task_error(dec, s->id, s->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                            bt_error_last());
            seq_remove(dec, s);
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
            seq_emit_n(dec, s, dec->out + (size_t)i * max_step,
                       dec->n_out[i]))
            seq_remove(dec, s);
    }
    send_outbox(dec);
}

/* Host time per plain decode step (µs), at shutdown or every 1000
 * timed steps (DEBUG). */
static void log_step_times(decode_t *dec, bool final)
{
    double n = (double)(dec->n_timed ? dec->n_timed : 1);

    if (dec->n_timed == 0 || (!final && dec->n_timed % 1000 != 0))
        return;
    if (final)
        BT_LOG_INFO("DECODE", "host us per step over %llu steps: build %.1f, "
                    "enqueue %.1f, emit %.1f (overlapped), wait %.1f, "
                    "post %.1f", (unsigned long long)dec->n_timed,
                    dec->t_build_ns / n / 1e3, dec->t_begin_ns / n / 1e3,
                    dec->t_emit_ns / n / 1e3, dec->t_wait_ns / n / 1e3,
                    dec->t_post_ns / n / 1e3);
    else
        BT_LOG_DEBUG("DECODE", "host us per step over %llu steps: build "
                     "%.1f, enqueue %.1f, emit %.1f, wait %.1f, post %.1f",
                     (unsigned long long)dec->n_timed,
                     dec->t_build_ns / n / 1e3, dec->t_begin_ns / n / 1e3,
                     dec->t_emit_ns / n / 1e3, dec->t_wait_ns / n / 1e3,
                     dec->t_post_ns / n / 1e3);
}

/* Emits the tokens the previous step sampled (step() calls it while the
 * GPU runs the next step).  A sequence that ends here is removed, or,
 * when the running step holds it, marked so step() drops its row and
 * removes it after the wait. */
static void emit_pending(decode_t *dec)
{
    uint64_t t0 = bt_time_ns();
    int n = dec->n_emit;

    dec->n_emit = 0;
    for (int i = 0; i < n; i++) {
        decode_seq_t *s = dec->emit_q[i];
        s->pend = false;
        s->n_tokens--; /* seq_emit appends it again */
        if (seq_emit(dec, s, dec->emit_tok[i])) {
            if (s->in_step)
                s->finished = true;
            else
                seq_remove(dec, s);
        }
    }
    send_outbox(dec);
    dec->t_emit_ns += bt_time_ns() - t0;
}

/* One plain step (spec_step handles the decode batch with a draft
 * head).  Overlapped with the GPU: the batch is built from every running
 * sequence, the forward and the device sampling are enqueued
 * (backend_forward_sample_begin), the previous step's tokens go out
 * (detokenize, stop conditions, TokenOut) while the device works, then
 * the step's ids are collected.  The token a sequence was just given is
 * fed before it is emitted, so a sequence that the emission ends (stop
 * string, stop id, length) rides one step for nothing: its row is
 * dropped and it is removed after the wait (its KV blocks are its own
 * until then).  What clients see is unchanged. */
static void step(decode_t *dec)
{
    int n = 0, n_decode, n_rows, n_fed = 0; /* n_fed: prompt tokens */
    int lp_i = -1; /* the batch entry with a row per prompt position */
    uint64_t now = bt_time_ns(), t0 = now, t1;
    decode_seq_t *s, *next;
    bt_status_t status = BT_OK;

    if (dec->spec != NULL)
        step_spec(dec); /* the decode batch; local prefill below */
    for (s = dec->spec != NULL ? NULL : dec->seqs;
         s && n < dec->max_seqs && n < dec->budget; s = next) {
        next = s->next;
        if (s->pend && s->n_tokens > dec->max_context)
            continue; /* cannot be fed: its emission ends it */
        if (!seq_has_room(dec, s)) {
            if (s->wait_since == 0)
                s->wait_since = now;
            if (now - s->wait_since > DECODE_BLOCK_WAIT_NS) {
                send_task_error(dec, s->id, s->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                                "KV pool full for too long");
                seq_remove(dec, s);
            }
            continue;
        }
        s->wait_since = 0;
        if (s->grammar != NULL &&
            grammar_mask(s->grammar, s->gstate, s->gmask) != BT_OK) {
            /* this request only, never the batch */
            send_task_error(dec, s->id, s->epoch,
                            BATON__ERROR_CODE__ERROR_INVALID,
                            bt_error_last());
            seq_remove(dec, s);
            continue;
        }
        if (dec->engine != NULL) {
            backend_seq_t *bs = &dec->bseqs[n];
            memset(bs, 0, sizeof(*bs));
            bs->n_tokens = 1;
            bs->ctx_len = s->n_cached;
            bs->tokens = s->tokens + s->n_cached;
            bs->block_table = s->blocks;
            bs->n_logits = 1;
            dec->rsamp[n] = s->sampler;
        }
        dec->bmap[n++] = s;
    }
    n_decode = n_rows = n;
    /* Aggregated mode: prompt chunks fill what the decode tokens left of
     * the step's budget (decode first: running streams never stall). */
    if (dec->cfg.can_prefill && dec->engine != NULL) {
        /* Under a TPOT target the running streams' step time bounds the
         * prompt tokens (decode_budget.h); a floor keeps prompts moving. */
        int budget = decode_budget_prefill_tokens(
            &dec->cost, n_decode, dec->cfg.tpot_target_ms,
            dec->budget - n_decode,
            BT_MIN(dec->budget - n_decode, DECODE_PREFILL_FLOOR));
        for (int i = 0; i < dec->cfg.max_reservations && n < dec->max_seqs &&
                        budget > 0; i++) {
            decode_resv_t *r = &dec->resv[i];
            backend_seq_t *bs = &dec->bseqs[n];
            sampler_t *ps = NULL;
            int take;
            if (!r->local)
                continue;
            take = BT_MIN(r->p.n_tokens - r->n_fed,
                          BT_MIN(budget, dec->cfg.chunk_tokens));
            if (take <= 0)
                continue;
            if (r->plp != NULL) {
                if (lp_i >= 0 || !lp_logits_ready(dec))
                    continue; /* a later step */
                take = BT_MIN(take, DECODE_LP_ROWS);
                lp_i = n;
            }
            if (r->n_fed + take == r->p.n_tokens &&
                (ps = local_prefill_sampler(dec, r)) == NULL)
                continue; /* refused (failure sent) */
            memset(bs, 0, sizeof(*bs));
            bs->n_tokens = take;
            bs->ctx_len = r->n_fed;
            bs->tokens = r->p.tokens + r->n_fed;
            bs->block_table = r->blocks;
            bs->n_logits = ps != NULL ? 1 : 0;
            if (lp_i == n) { /* prompt rows, then the sampled one */
                for (int k = 0; k < take - bs->n_logits; k++)
                    dec->rsamp[n_rows++] = NULL;
                bs->n_logits = take;
            }
            if (ps != NULL)
                dec->rsamp[n_rows++] = ps;
            dec->psamp[n - n_decode] = ps;
            dec->pmap[n - n_decode] = r;
            n++;
            budget -= take;
            n_fed += take;
        }
    }
    t1 = bt_time_ns();
    if (n == 0) {
        emit_pending(dec);
        return;
    }
    dec->t_build_ns += t1 - t0;
    for (int i = 0; i < n_decode; i++)
        dec->bmap[i]->in_step = true;
    if (dec->engine != NULL) {
        backend_t *be = engine_backend(dec->engine);
        backend_batch_t batch;
        uint64_t t2, t3;

        memset(&batch, 0, sizeof(batch));
        batch.n_seqs = n;
        batch.seqs = dec->bseqs;
        status = backend_forward_sample_begin(be, &batch, dec->rsamp,
                                              dec->rids,
                                              lp_i >= 0 ? dec->lp_logits
                                                        : NULL,
                                              dec->hidden);
        t2 = bt_time_ns();
        emit_pending(dec); /* while the GPU works */
        t3 = bt_time_ns();
        if (status == BT_OK)
            status = backend_forward_sample_end(be);
        dec->t_begin_ns += t2 - t1;
        dec->t_wait_ns += bt_time_ns() - t3;
    } else {
        emit_pending(dec);
    }
    if (n_fed > 0 && status == BT_OK && bt_time_ns() > t1) {
        /* Local prefill rate (aggregated): the router's prefill
         * deadlines for this worker come from it. */
        double rate = n_fed * 1e9 / (double)(bt_time_ns() - t1);
        dec->tps = dec->tps > 0 ? 0.8 * dec->tps + 0.2 * rate : rate;
    }
    t1 = bt_time_ns();
    dec->steps++;
    for (int i = n_decode, row = n_decode; i < n; i++) {
        decode_resv_t *r = dec->pmap[i - n_decode];
        sampler_t *ps = dec->psamp[i - n_decode];
        if (status != BT_OK) {
            send_prefill_failure(dec, r->id, r->epoch,
                                 BATON__ERROR_CODE__ERROR_WORKER,
                                 bt_error_last());
            r->local = false;
            sampler_destroy(&ps);
            continue;
        }
        r->n_fed += dec->bseqs[i].n_tokens;
        if (i == lp_i) {
            int n_lp = dec->bseqs[i].n_logits - (ps != NULL ? 1 : 0);
            sampler_prompt_lp_rows(r->plp,
                                   dec->lp_logits + (size_t)row * dec->vocab,
                                   dec->vocab, r->p.tokens,
                                   r->n_fed - dec->bseqs[i].n_tokens, n_lp);
            row += n_lp;
        }
        if (ps != NULL) {
            if (dec->hidden != NULL && r->feat == NULL) {
                /* speculation: the request drafts from its first step */
                r->feat = bt_malloc(sizeof(float) * (size_t)dec->dim,
                                    "decode_resv");
                if (r->feat != NULL)
                    memcpy(r->feat, dec->hidden + (size_t)row * dec->dim,
                           sizeof(float) * (size_t)dec->dim);
            }
            local_prefill_done(dec, r, dec->rids[row++],
                               sampler_last_logprobs(ps));
        }
        sampler_destroy(&ps);
    }
    for (int i = 0; i < n_decode; i++) {
        int tok;
        s = dec->bmap[i];
        s->in_step = false;
        if (s->finished) { /* ended by the emission above: row dropped */
            seq_remove(dec, s);
            continue;
        }
        if (status != BT_OK) {
            send_task_error(dec, s->id, s->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                            bt_error_last());
            seq_remove(dec, s);
            continue;
        }
        s->n_cached++;
        if (dec->engine != NULL) {
            tok = dec->rids[i];
            sampler_observe(s->sampler, tok);
            if (s->grammar != NULL &&
                grammar_advance_token(s->grammar, &s->gstate, tok) !=
                    BT_OK) {
                send_task_error(dec, s->id, s->epoch,
                                BATON__ERROR_CODE__ERROR_INTERNAL,
                                bt_error_last());
                seq_remove(dec, s);
                continue;
            }
        } else {
            tok = proto_null_next_token(s->tokens[s->n_tokens - 1],
                                        s->n_tokens);
        }
        /* fed next step, emitted while that step runs */
        if (s->sampler != NULL && sampler_last_logprobs(s->sampler)) {
            s->lp = *sampler_last_logprobs(s->sampler);
            s->has_lp = true;
        }
        s->tokens[s->n_tokens++] = tok;
        s->pend = true;
        dec->emit_q[dec->n_emit] = s;
        dec->emit_tok[dec->n_emit++] = tok;
    }
    dec->t_post_ns += bt_time_ns() - t1;
    decode_budget_observe(&dec->cost, n_decode, n_fed,
                          (double)(bt_time_ns() - t0) * 1e-6);
    dec->n_timed++;
    log_step_times(dec, false);
    if (dec->cfg.step_delay_ms > 0)
        usleep((useconds_t)dec->cfg.step_delay_ms * 1000u);
    if (dec->cfg.metrics != NULL) { /* metrics hook */
        uint64_t pre = 0;
        for (int i = n_decode; status == BT_OK && i < n; i++)
            pre += (uint64_t)dec->bseqs[i].n_tokens;
        workerproc_metrics_step(dec->cfg.metrics, n,
                                (double)(bt_time_ns() - t0) * 1e-9, pre,
                                status == BT_OK ? (uint64_t)n_decode : 0);
    }
}

// ---------------------------------------------------------------------------
// Prefix cache (issue 38): blocks enter it as they are computed

/* Caches the full blocks of s computed since its cursor (the engine
 * sequence's tables under speculation).  Only KV below the computed
 * count is final: the step in flight and speculative drafts write at or
 * after it. */
static void seq_cache_blocks(decode_t *dec, decode_seq_t *s)
{
    if (dec->prefix == NULL || !s->pcache || s->in_step)
        return;
    if (s->eseq != NULL) {
        int n_blocks;
        const int *blocks = engine_seq_blocks(s->eseq, &n_blocks);
        workerproc_prefix_insert(dec->prefix, &s->pcur,
                                 engine_seq_tokens(s->eseq),
                                 BT_MIN(engine_seq_cached(s->eseq),
                                        n_blocks * dec->block_size),
                                 blocks);
    } else {
        workerproc_prefix_insert(dec->prefix, &s->pcur, s->tokens,
                                 BT_MIN(s->n_cached,
                                        s->n_blocks * dec->block_size),
                                 s->blocks);
    }
}

/* After a step: the blocks that became full in local prompts and in
 * running sequences are cached, so a request arriving while they still
 * run hits them too. */
static void cache_new_blocks(decode_t *dec)
{
    if (dec->prefix == NULL)
        return;
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        decode_resv_t *r = &dec->resv[i];
        if (!r->used || !(r->local || r->local_done) || r->blocks == NULL)
            continue;
        workerproc_prefix_insert(dec->prefix, &r->pcur, r->p.tokens,
                                 BT_MIN(r->n_fed,
                                        r->n_blocks * dec->block_size),
                                 r->blocks);
    }
    for (decode_seq_t *s = dec->seqs; s; s = s->next)
        seq_cache_blocks(dec, s);
}

static void expire(decode_t *dec)
{
    uint64_t now = bt_time_ns();

    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        decode_resv_t *r = &dec->resv[i];
        decode_quarantine_t *q = &dec->quar[i];
        /* A prompt prefilled here (aggregated) waits for this worker's
         * own steps, not for a remote writer: it never expires while
         * queued (a cold burst of long prompts took longer than the
         * timeout and lost every request behind it; issue 36). */
        if (r->used && !r->local && now > r->expires_ns) {
            BT_LOG_WARN("KV", "reservation of request %llu expired: its KV "
                        "never arrived", (unsigned long long)r->id);
            resv_free(dec, r, false);
        }
        if (q->blocks != NULL && now > q->release_ns) {
            kv_allocator_release(dec->kv, q->n_blocks, q->blocks);
            bt_free(q->blocks);
            memset(q, 0, sizeof(*q));
        }
    }
    if (dec->links != NULL)
        kv_link_receiver_expire(dec->links, now);
}

// ---------------------------------------------------------------------------
// Lifecycle

/* Frees the reservation and batch arrays and the engine (or the null
 * model's allocator); the error path of decode_create() and
 * decode_destroy() both end with it (then the links: UCX may back the
 * KV). */
static void bufs_teardown(decode_t *dec)
{
    bt_free(dec->resv);
    bt_free(dec->quar);
    bt_free(dec->rsamp);
    bt_free(dec->lp_logits);
    bt_free(dec->rids);
    bt_free(dec->psamp);
    bt_free(dec->emit_q);
    bt_free(dec->emit_tok);
    bt_free(dec->bseqs);
    bt_free(dec->bmap);
    bt_free(dec->pmap);
    /* the cache lets go of its blocks before the pool goes */
    workerproc_prefix_destroy(&dec->prefix);
    if (dec->engine != NULL)
        engine_destroy(&dec->engine); /* frees the KV through UCX */
    else
        kv_allocator_destroy(&dec->kv);
}

/* The KV links this worker receives on (kv_link.h), before the engine:
 * the UCX link may provide the pool memory.  One that cannot start is
 * left out with a warning; its KV arrives inline. */
static bt_status_t links_create(decode_t *dec)
{
    const decode_config_t *cfg = &dec->cfg;
    kv_link_recv_config_t lc = {
        .use_ucx = cfg->use_ucx,
        .ucx_shm_pool = cfg->ucx_shm_pool,
        .use_cuda_ipc = cfg->use_cuda_ipc,
        .kv_stage = cfg->kv_stage,
        .kv_stage_direct = cfg->kv_stage_direct,
        .kv_stage_host = cfg->kv_stage_host,
        .kv_stage_blocks = cfg->kv_stage_blocks,
        .n_slots = cfg->max_reservations,
        .quarantine_ms = cfg->quarantine_ms,
        .device_index = cfg->engine.backend.device_index,
    };

    return kv_link_receiver_create(&lc, &dec->links);
}

bt_status_t decode_create(const decode_config_t *cfg, decode_t **dec_p)
{
    decode_t *dec;
    bt_status_t status;
    const backend_config_t *b = &cfg->engine.backend;

    dec = bt_calloc(1, sizeof(*dec), "decode");
    if (dec == NULL)
        return BT_ERR_NO_MEMORY;
    dec->cfg = *cfg;
    dec->next_epoch = bt_time_ns(); /* grows across restarts too */
    decode_budget_init(&dec->cost);
    workerproc_name_init(dec->name, sizeof(dec->name), cfg->name, "decode");
    if (cfg->max_reservations <= 0 || b->max_seqs < 0 ||
        b->n_kv_blocks < 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "DECODE",
                          "max reservations must be positive, KV blocks "
                          "and seqs not negative");
        goto err_free;
    }
    dec->budget = cfg->step_tokens > 0
                      ? BT_MIN(cfg->step_tokens, b->max_batch_tokens)
                      : b->max_batch_tokens;
    if (cfg->null_model) {
        /* no memory to size: the library defaults */
        backend_config_t nb;

        backend_config_init(&nb);
        if (b->n_kv_blocks > 0)
            nb.n_kv_blocks = b->n_kv_blocks;
        if (b->max_seqs > 0)
            nb.max_seqs = b->max_seqs;
        dec->cfg.engine.backend.n_kv_blocks = nb.n_kv_blocks;
        dec->cfg.engine.backend.max_seqs = nb.max_seqs;
        dec->vocab = PROTO_NULL_VOCAB;
        dec->max_context = PROTO_NULL_CONTEXT;
        dec->block_size = b->block_size;
        dec->layout = (kv_layout_t){ 0, nb.n_kv_blocks, b->block_size, 0, 0,
                                     0 };
        status = kv_allocator_create(nb.n_kv_blocks, &dec->kv);
        if (status != BT_OK)
            goto err_free;
    } else {
        const model_config_t *mc;
        engine_config_t ecfg = cfg->engine;
        /* The links first, so the backend can put its KV arrays in
         * memory UCX maps into prefill workers: puts become one-sided
         * memcpys. */
        status = links_create(dec);
        if (status != BT_OK)
            goto err_free;
        kv_link_receiver_kv_alloc(dec->links, &ecfg.backend);
        status = engine_create(&ecfg, &dec->engine);
        if (status != BT_OK)
            goto err_free_links;
        /* the sizes the backend chose (KV from memory, max_seqs) */
        dec->cfg.engine.backend.n_kv_blocks =
            engine_config(dec->engine)->backend.n_kv_blocks;
        dec->cfg.engine.backend.max_seqs =
            engine_config(dec->engine)->backend.max_seqs;
        mc = model_config(engine_model(dec->engine));
        dec->kv = engine_kv(dec->engine);
        dec->vocab = mc->vocab_size;
        dec->max_context = engine_max_context(dec->engine);
        dec->block_size = engine_block_size(dec->engine);
        dec->n_layers = mc->n_layers;
        dec->layout = *backend_kv_layout(engine_backend(dec->engine));
        dec->kv_on_device =
            strcmp(backend_name(engine_backend(dec->engine)), "cuda") == 0;
        if (cfg->prefix_cache) {
            status = workerproc_prefix_create(dec->engine, &ecfg,
                                              &dec->prefix);
            if (status != BT_OK)
                goto err_bufs;
        }
    }
    dec->max_seqs = dec->cfg.engine.backend.max_seqs;
    BT_LOG_INFO("DECODE", "%s KV capacity: %d blocks of %d tokens = %lld "
                "tokens (%s); at most %d sequences a step",
                dec->name, kv_allocator_total(dec->kv), dec->block_size,
                (long long)kv_allocator_total(dec->kv) * dec->block_size,
                b->n_kv_blocks > 0 ? "--kv-blocks"
                : dec->engine == NULL ? "null model default"
                : "sized from memory", dec->max_seqs);
    dec->resv = bt_calloc((size_t)cfg->max_reservations, sizeof(*dec->resv),
                          "decode_resv");
    dec->quar = bt_calloc((size_t)cfg->max_reservations, sizeof(*dec->quar),
                          "decode_resv");
    dec->rsamp = bt_calloc((size_t)dec->max_seqs + DECODE_LP_ROWS,
                           sizeof(*dec->rsamp), "decode_batch");
    dec->rids = bt_calloc((size_t)dec->max_seqs + DECODE_LP_ROWS,
                          sizeof(int), "decode_batch");
    dec->psamp = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->psamp),
                           "decode_batch");
    dec->emit_q = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->emit_q),
                            "decode_batch");
    dec->emit_tok = bt_calloc((size_t)dec->max_seqs, sizeof(int),
                              "decode_batch");
    dec->bseqs = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->bseqs),
                           "decode_batch");
    dec->bmap = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->bmap),
                          "decode_batch");
    dec->pmap = bt_calloc((size_t)dec->max_seqs, sizeof(*dec->pmap),
                          "decode_batch");
    if (dec->resv == NULL || dec->quar == NULL || dec->rsamp == NULL ||
        dec->rids == NULL || dec->psamp == NULL || dec->emit_q == NULL ||
        dec->emit_tok == NULL ||
        dec->bseqs == NULL || dec->bmap == NULL || dec->pmap == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_bufs;
    }
    status = spec_setup(dec);
    if (status != BT_OK)
        goto err_bufs;
    if (dec->links != NULL) {
        status = kv_link_receiver_attach(dec->links,
                                         engine_backend(dec->engine),
                                         dec->kv_on_device, dec->max_context);
        if (status != BT_OK)
            goto err_links;
    }
    /* Warm before the router hears of this worker (issue 36): GEMM
     * tuning and graph capture must not run inside the first requests. */
    if (dec->engine != NULL &&
        workerproc_opts_warmup_wanted(cfg->warmup,
                                 backend_name(engine_backend(dec->engine)))) {
        status = engine_warmup(dec->engine,
                               cfg->can_prefill ? cfg->chunk_tokens : 0,
                               cfg->can_prefill ? dec->budget : 0, true);
        if (status != BT_OK)
            goto err_links;
    }
    status = workerproc_connect(cfg->router, dec->name, &dec->ctx,
                                &dec->sock);
    if (status != BT_OK)
        goto err_links;
    status = workerproc_link_create(dec->sock, dec->name, &dec->link);
    if (status != BT_OK) {
        workerproc_close(&dec->ctx, &dec->sock);
        goto err_links;
    }
    workerproc_metrics_attach(cfg->metrics, dec->link, dec->name);
    *dec_p = dec;
    return BT_OK;

err_links:
    kv_link_receiver_detach(dec->links); /* before the pool goes */
err_bufs:
    spec_teardown(dec);
    bufs_teardown(dec);
err_free_links:
    kv_link_receiver_destroy(&dec->links); /* after: it may back the KV */
err_free:
    bt_free(dec);
    return status;
}

void decode_destroy(decode_t **dec_p)
{
    decode_t *dec = *dec_p;

    if (dec == NULL)
        return;
    while (dec->seqs != NULL)
        seq_remove(dec, dec->seqs);
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        if (dec->resv[i].used)
            resv_free(dec, &dec->resv[i], true);
        if (dec->quar[i].blocks != NULL) {
            kv_allocator_release(dec->kv, dec->quar[i].n_blocks,
                                 dec->quar[i].blocks);
            bt_free(dec->quar[i].blocks);
        }
    }
    spec_teardown(dec); /* after its sequences */
    workerproc_metrics_attach(dec->cfg.metrics, NULL, NULL); /* /health */
    proto_batch_cleanup(&dec->outbox);
    workerproc_link_destroy(&dec->link); /* its thread uses the socket */
    workerproc_close(&dec->ctx, &dec->sock);
    kv_link_receiver_detach(dec->links); /* before the pool goes */
    bufs_teardown(dec);
    kv_link_receiver_destroy(&dec->links); /* after: it may back the KV */
    bt_free(dec);
    *dec_p = NULL;
}

void decode_stop(decode_t *dec)
{
    dec->stop = 1;
}

static bool has_reservations(const decode_t *dec)
{
    for (int i = 0; i < dec->cfg.max_reservations; i++)
        if (dec->resv[i].used)
            return true;
    return false;
}

bt_status_t decode_run(decode_t *dec)
{
    uint64_t drain_deadline = 0;
    const char *links = dec->links ? kv_link_receiver_names(dec->links) : "";
    char stats[128];

    BT_LOG_INFO("DECODE", "%s serving %s via %s: %d KV blocks of %d "
                "tokens (KV links: %s)%s", dec->name,
                dec->engine ? dec->cfg.engine.model_path : "the null model",
                dec->cfg.router, kv_allocator_total(dec->kv), dec->block_size,
                links[0] != '\0' ? links : "inline",
                dec->cfg.can_prefill ? ", prefills too (role both)" : "");
    for (;;) {
        bt_status_t status;
        int timeout, fd = -1;

        if (dec->stop && !dec->draining) {
            workerproc_send_drain(dec->sock, dec->name);
            dec->draining = true;
            drain_deadline = bt_time_ns() + 60ull * 1000000000ull;
            BT_LOG_INFO("DECODE", "draining: %d sequences running",
                        dec->n_seqs);
        }
        if (dec->draining &&
            ((dec->seqs == NULL && !has_reservations(dec)) ||
             bt_time_ns() > drain_deadline))
            break;
        timeout = dec->seqs != NULL || has_local_prefill(dec) ||
                  has_arrivals_pending(dec) ? 0 : 50;
        if (timeout > 0 && dec->links != NULL &&
            kv_link_receiver_arm_fd(dec->links, &fd) == BT_IN_PROGRESS)
            timeout = 0; /* events pending: progress first */
        status = workerproc_poll_fd(dec->sock, fd, timeout);
        if (status != BT_OK)
            return status;
        workerproc_link_turn_begin(dec->link);
        if (dec->links != NULL)
            kv_link_receiver_progress(dec->links);
        arrivals_pending(dec);
        handle_messages(dec);
        send_outbox(dec); /* the grants, before the step */
        switch (workerproc_link_check(dec->link)) {
        case WORKERPROC_LINK_REGISTER:
            send_register(dec); /* drops what the old session held */
            break;
        case WORKERPROC_LINK_REFUSED:
            workerproc_link_turn_end(dec->link);
            return BT_ERROR(BT_ERR_REMOTE, "DECODE", "the router refused "
                            "this worker: %s",
                            workerproc_link_refusal(dec->link));
        case WORKERPROC_LINK_OK:
            break;
        }
        step(dec);
        cache_new_blocks(dec);
        expire(dec);
        if (dec->prefix != NULL && workerproc_link_registered(dec->link))
            workerproc_prefix_publish(dec->prefix, dec->sock,
                                      DECODE_KV_EVENTS_MS);
        send_outbox(dec);
        workerproc_link_turn_end(dec->link);
        publish_beat(dec);
    }
    workerproc_send_shutdown(dec->sock, dec->name);
    stats[0] = '\0';
    if (dec->links != NULL)
        kv_link_receiver_stats(dec->links, stats, sizeof(stats));
    BT_LOG_INFO("DECODE", "%s stopped: %llu steps, %llu tokens, KV "
                "hand-offs by link: %s kv_cap_rejected:%llu", dec->name,
                (unsigned long long)dec->steps,
                (unsigned long long)dec->tokens_out, stats,
                (unsigned long long)dec->cap_rejected);
    log_step_times(dec, true);
    if (dec->prefix != NULL) {
        kv_prefix_stats_t st;

        kv_prefix_stats(workerproc_prefix_cache(dec->prefix), &st);
        BT_LOG_INFO("KV", "%s prefix cache: lookups:%llu lookup_tokens:%llu "
                    "hit_tokens:%llu hit_blocks:%llu inserted:%llu "
                    "evictions:%llu cached:%d", dec->name,
                    (unsigned long long)st.lookups,
                    (unsigned long long)st.lookup_tokens,
                    (unsigned long long)st.hit_tokens,
                    (unsigned long long)st.hit_blocks,
                    (unsigned long long)st.inserted,
                    (unsigned long long)st.evictions, st.cached_blocks);
    }
    return BT_OK;
}
