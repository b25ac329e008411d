/*
 * decode.c - the decode worker's state machine: its loop, message
 * dispatch, the running sequences and the continuous-batching step (see
 * decode.h; decode_int.h says which file holds the other concerns).
 */
#include "decode_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    cfg->kv_unbounded_promise = DECODE_UNBOUNDED_PROMISE;
}

// ---------------------------------------------------------------------------
// Messages

/* Sends what the outbox holds, as one ControlBatch when the router takes
 * them: CURVE boxes one message per step (every sequence's TokenOut) and
 * one per burst of requests handled (their KvGrants), not one per
 * request (issue 42). */
void decode__send_outbox(decode_t *dec)
{
    workerproc_send_batch(dec->sock, &dec->outbox,
                          workerproc_link_batches(dec->link));
}

/* Queues msg in the outbox (sent by decode__send_outbox within this turn,
 * in order); alone, after the queued ones, when it cannot be queued. */
void decode__send_msg(decode_t *dec, Baton__ControlMessage *msg)
{
    workerproc_queue(dec->sock, &dec->outbox,
                     workerproc_link_batches(dec->link), msg);
}

void decode__fill_layout(const decode_t *dec, Baton__KvLayout *l)
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
    decode__fill_layout(dec, &lay);
    reg->kv_layout = &lay;
    reg->has_can_prefill = 1;
    reg->can_prefill = dec->cfg.can_prefill;
    reg->has_unbounded_promise = dec->cfg.kv_overcommit ||
                                 dec->cfg.kv_unbounded_promise >= 0;
    reg->unbounded_promise = dec->cfg.kv_overcommit
                                 ? 0
                                 : (uint32_t)dec->cfg.kv_unbounded_promise;
    reg->has_admits_on_promise = 1;
    reg->admits_on_promise = !dec->cfg.kv_overcommit;
    decode__send_outbox(dec); /* the old session's last words go first */
    workerproc_send_register(dec->sock, reg);
}

/* The blocks s holds (a drafting stream's: its engine sequence's). */
static int seq_held(const decode_seq_t *s)
{
    int held = s->n_blocks;

    if (s->eseq != NULL)
        engine_seq_blocks(s->eseq, &held);
    return held;
}

/* Blocks promised to admitted requests beyond what they hold now. */
static int promised_blocks(const decode_t *dec)
{
    int n = 0;
    DECODE_RESV_FOREACH(dec, i)
        n += BT_MAX(0, dec->resv[i].limit_blocks - dec->resv[i].n_blocks);
    for (const decode_seq_t *s = dec->seqs; s; s = s->next)
        n += BT_MAX(0, s->limit_blocks - seq_held(s));
    return n;
}

/* Blocks --kv-overcommit keeps from admission for the running streams'
 * growth (0 without it: every stream's growth is promised instead). */
static int overcommit_watermark(const decode_t *dec)
{
    if (!dec->cfg.kv_overcommit)
        return 0;
    return BT_MAX(BT_MAX(1, dec->n_seqs), kv_allocator_total(dec->kv) /
                                              DECODE_OVERCOMMIT_WATERMARK_DIV);
}

/* Free blocks not promised to anyone: what new requests may take. */
int decode__available_blocks(const decode_t *dec)
{
    return BT_MAX(0, kv_allocator_free_count(dec->kv) - promised_blocks(dec) -
                         overcommit_watermark(dec));
}

/* Publishes what the heartbeats and the metrics say (the link's thread
 * sends the heartbeats on schedule); one goes out at once, at most every
 * 10 ms, when the free block count moved or, after a grant refused for
 * receive room, when a reservation holding some ended, so the router's
 * view stays fresh.  Called once a turn: one pass over the
 * reservations. */
static void publish_beat(decode_t *dec)
{
    workerproc_beat_t b;
    uint64_t now = bt_time_ns();
    bool urgent;

    memset(&b, 0, sizeof(b));
    b.running = (uint32_t)dec->n_seqs;
    b.outstanding = (uint64_t)dec->n_seqs; /* a token each */
    DECODE_RESV_FOREACH(dec, i) {
        const decode_resv_t *r = &dec->resv[i];
        b.waiting++;
        b.reserved += (uint32_t)r->n_blocks;
        if (r->local)
            b.outstanding += (uint64_t)(r->p.n_tokens - r->n_fed);
    }
    b.has_reserved = true;
    b.draining = dec->draining;
    b.has_kv = true;
    b.free_kv = (uint32_t)decode__available_blocks(dec);
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
    /* The count the router last heard at once: a change inside the
     * 10 ms goes out at a later turn's publish, not with the next
     * scheduled beat (the router admits on these counts: a request
     * waiting for a promise's room waited a whole heartbeat period) */
    b.has_recv_frees = dec->links != NULL;
    b.recv_frees = dec->recv_frees;
    dec->hb_owed = (int)b.free_kv != dec->last_hb_free ||
                   (dec->recv_refused &&
                    dec->recv_frees != dec->last_hb_recv_frees);
    urgent = dec->hb_owed && now - dec->last_hb_ns >= DECODE_HB_URGENT_NS;
    workerproc_link_publish(dec->link, &b, urgent);
    if (urgent) {
        dec->last_hb_free = (int)b.free_kv;
        if (dec->recv_frees != dec->last_hb_recv_frees)
            dec->recv_refused = false; /* the router hears of room */
        dec->last_hb_recv_frees = dec->recv_frees;
        dec->last_hb_ns = now;
        dec->hb_owed = false;
    }
}

/* TaskError; retry: not a failure, the attempt given back (seq_preempt) */
static void send_task_error(decode_t *dec, uint64_t id, uint64_t epoch,
                            Baton__ErrorCode code, const char *text,
                            bool retry)
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
    te.has_retry = retry;
    te.retry = retry;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_TASK_ERROR;
    msg.task_error = &te;
    decode__send_msg(dec, &msg);
}

void decode__send_task_error(decode_t *dec, uint64_t id, uint64_t epoch,
                             Baton__ErrorCode code, const char *text)
{
    send_task_error(dec, id, epoch, code, text, false);
}

// ---------------------------------------------------------------------------
// Sequences

void decode__seq_destroy(decode_t *dec, decode_seq_t *s)
{
    /* a finished sequence leaves them cached */
    decode__seq_cache_blocks(dec, s);
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

void decode__seq_remove(decode_t *dec, decode_seq_t *s)
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
    decode__seq_destroy(dec, s);
}

/* One request fails alone: the router hears why, the sequence goes. */
void decode__seq_fail(decode_t *dec, decode_seq_t *s, Baton__ErrorCode code,
                      const char *why)
{
    decode__send_task_error(dec, s->id, s->epoch, code, why);
    decode__seq_remove(dec, s);
}

/* A stream at or past its promise when the pool runs short: gives s
 * back to the router (TaskError with retry), which re-queues it; the
 * next attempt recomputes the KV of its prompt and of the tokens
 * streamed so far and goes on from there (its full blocks enter the
 * prefix cache, and the shortage reclaims them at once unless a host
 * tier keeps them: then they are loaded back).  A sampled token not yet
 * emitted is dropped with s: the next attempt samples it again at the
 * same place of the random stream. */
static void seq_preempt(decode_t *dec, decode_seq_t *s)
{
    send_task_error(dec, s->id, s->epoch, BATON__ERROR_CODE__ERROR_WORKER,
                    "preempted: the KV pool ran short of blocks past its "
                    "promise", true);
    BT_LOG_DEBUG("DECODE", "request %llu preempted at %d tokens",
                 (unsigned long long)s->id, s->n_tokens);
    dec->preempted++;
    decode__seq_remove(dec, s);
}

/* True when the step feeds s (one past the context is not fed) a token
 * that starts a new block.  A drafting sequence's blocks are its engine
 * sequence's; its draft tree takes slots only where the pool has them
 * (decode__step_spec), so only the plain token counts. */
static bool seq_needs_block(const decode_t *dec, const decode_seq_t *s)
{
    if (s->eseq != NULL)
        return BT_DIV_UP(engine_seq_cached(s->eseq) + 1, dec->block_size) >
               seq_held(s);
    return !(s->pend && s->n_tokens > dec->max_context) &&
           BT_DIV_UP(s->n_cached + 1, dec->block_size) > s->n_blocks;
}

/* Before a step is built: the blocks its rows need beyond their own
 * against what the pool can give.  Only a stream promised less than its
 * growth (--kv-overcommit, or --kv-unbounded-promise for a request
 * without max_tokens) runs the pool short, by growing past its promise
 * into blocks nobody was promised; while short, the latest request to
 * arrive among the streams at or past their promise goes back to the
 * router (vLLM's recompute preemption: the earliest keep going), so no
 * stream inside its promise is ever given back.  The router numbers
 * requests as they arrive, so the largest id is the latest: not the
 * list's head, the latest admitted, which may be a stream given back and
 * taken again (its recomputation would be lost again).  With every
 * stream's growth promised this never happens. */
static void preempt_for_room(decode_t *dec)
{
    const decode_seq_t *b = dec->seqs;
    int need = 0;

    while (b != NULL && !b->borrows) /* every step: the common case */
        b = b->next;
    if (b == NULL)
        return;
    for (const decode_seq_t *s = dec->seqs; s; s = s->next)
        need += seq_needs_block(dec, s);
    while (need > kv_allocator_free_count(dec->kv)) {
        decode_seq_t *v = NULL;

        for (decode_seq_t *s = dec->seqs; s; s = s->next)
            if (s->borrows && seq_held(s) >= s->limit_blocks &&
                (v == NULL || s->id > v->id))
                v = s;
        if (v == NULL)
            break; /* the promises hold the rest (decode__seq_no_room) */
        need -= seq_needs_block(dec, v);
        if (dec->n_seqs == 1 && dec->n_resv == 0) {
            /* alone, it holds the whole pool: given back, it would only
             * outgrow it again at the same token */
            char why[160];

            snprintf(why, sizeof(why), "the request outgrew the whole KV "
                     "pool (%d tokens) running alone: give it max_tokens, "
                     "or a larger pool", kv_allocator_total(dec->kv) *
                                             dec->block_size);
            decode__seq_fail(dec, v, BATON__ERROR_CODE__ERROR_TOO_LONG, why);
            continue;
        }
        seq_preempt(dec, v);
    }
}

/* s has no room for its next token this step: it waits for blocks, and
 * one that waited longer than DECODE_BLOCK_WAIT_NS fails (removed). */
void decode__seq_no_room(decode_t *dec, decode_seq_t *s, uint64_t now)
{
    if (s->wait_since == 0)
        s->wait_since = now;
    if (now - s->wait_since > DECODE_BLOCK_WAIT_NS) {
        decode__seq_fail(dec, s, BATON__ERROR_CODE__ERROR_WORKER,
                         "KV pool full for too long");
    }
}

// ---------------------------------------------------------------------------
// Message dispatch

static void on_cancel(decode_t *dec, uint64_t id)
{
    decode_resv_t *r = decode__resv_find(dec, id);

    if (r != NULL)
        decode__resv_free(dec, r, false);
    for (decode_seq_t *s = dec->seqs; s; s = s->next) {
        if (s->id == id) {
            decode__seq_remove(dec, s);
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
        decode__seq_remove(dec, dec->seqs);
    DECODE_RESV_FOREACH(dec, i) {
        decode__resv_free(dec, &dec->resv[i], false);
        n_resv++;
    }
    if (n_seqs > 0 || n_resv > 0)
        BT_LOG_WARN("DECODE", "%s: new session: dropped %d sequences and %d "
                    "reservations of the old one (the router resumes them)",
                    dec->name, n_seqs, n_resv);
}

/* Adds [t0, now) to the host work of `kind`. */
static void host_add(decode_t *dec, int kind, uint64_t t0)
{
    uint64_t ns = bt_time_ns() - t0;

    dec->host_ns[kind] += ns;
    dec->host_n[kind]++;
    if (ns > dec->host_max_ns[kind])
        dec->host_max_ns[kind] = ns;
}

/* The decode role's message kinds. */
static workerproc_msg_t dispatch_msg(decode_t *dec,
                                     Baton__ControlMessage *msg)
{
    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_KV_RESERVE:
        decode__on_reserve(dec, msg->kv_reserve);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_RELEASE:
        decode__on_release(dec, msg->kv_release);
        return WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_KV_READY:
        /* kept until its staged copies finished */
        return decode__on_ready(dec, msg) ? WORKERPROC_MSG_KEPT
                                          : WORKERPROC_MSG_DONE;
    case BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK:
        decode__on_prefill_task(dec, msg->prefill_task);
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

/* workerproc_handlers_t.on_msg: dispatch_msg, timed by kind. */
static workerproc_msg_t on_msg(void *arg, Baton__ControlMessage *msg)
{
    decode_t *dec = arg;
    int kind = msg->body_case == BATON__CONTROL_MESSAGE__BODY_KV_RESERVE
                   ? DECODE_HOST_RESERVE
               : msg->body_case == BATON__CONTROL_MESSAGE__BODY_KV_READY
                   ? DECODE_HOST_READY
                   : DECODE_HOST_OTHER_MSG;
    uint64_t t0 = bt_time_ns();
    workerproc_msg_t r = dispatch_msg(dec, msg);

    host_add(dec, kind, t0);
    return r;
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

/* Mean µs per step of each phase, at shutdown (INFO) or every 1000
 * steps (DEBUG). */
static void log_step_times(decode_t *dec, bool final)
{
    const workerproc_step_split_t *t = &dec->split_sum;
    double us = 1e6 / (double)(dec->n_timed ? dec->n_timed : 1);

    if (dec->n_timed == 0 || (!final && dec->n_timed % 1000 != 0))
        return;
    BT_LOG_AT(final ? BT_LOG_LEVEL_INFO : BT_LOG_LEVEL_DEBUG, "DECODE",
              "host us per step over %llu steps: serial %.1f (build %.1f + "
              "post %.1f), enqueue %.1f, emit %.1f (overlapped), wait %.1f",
              (unsigned long long)dec->n_timed, (t->build + t->post) * us,
              t->build * us, t->post * us, t->enqueue * us, t->emit * us,
              t->wait * us);
}

/* The loop's host work by kind, at shutdown: count, total and longest. */
static void log_host_work(const decode_t *dec)
{
    static const char *const names[DECODE_HOST_KINDS] = {
        "KvReserve", "KvReady", "other messages", "KV links' progress",
        "KvReady retried",
    };
    char line[512];
    size_t n = 0;

    line[0] = '\0';
    for (int k = 0; k < DECODE_HOST_KINDS && n < sizeof(line); k++)
        n += (size_t)snprintf(line + n, sizeof(line) - n,
                              "%s%s %llu in %.1f ms (longest %.2f)",
                              k ? ", " : "", names[k],
                              (unsigned long long)dec->host_n[k],
                              (double)dec->host_ns[k] * 1e-6,
                              (double)dec->host_max_ns[k] * 1e-6);
    BT_LOG_INFO("DECODE", "%s host work: %s", dec->name, line);
}

/* Counts the step of this turn, if one ran: its post phase ends now.
 * Called at the turn's end and after a speculative step, so that every
 * step workerproc_metrics_step() counted is split once. */
void decode__step_split_observe(decode_t *dec)
{
    uint64_t now = bt_time_ns();
    workerproc_step_split_t *t = &dec->split;

    if (dec->step_ended_ns == 0)
        return;
    t->post = (double)(now - dec->step_ended_ns) * 1e-9;
    workerproc_metrics_step_split(dec->cfg.metrics, t); /* metrics hook */
    dec->split_sum.build += t->build;
    dec->split_sum.enqueue += t->enqueue;
    dec->split_sum.emit += t->emit;
    dec->split_sum.wait += t->wait;
    dec->split_sum.post += t->post;
    dec->n_timed++;
    log_step_times(dec, false);
    dec->step_ended_ns = 0;
    dec->turn_t0 = now; /* a later step of this turn starts here */
}

static void cache_new_blocks(decode_t *dec);

static int arrival_cmp(const void *a, const void *b)
{
    const decode_arrival_t *x = a, *y = b;

    if (x->t_start != y->t_start)
        return x->t_start < y->t_start ? -1 : 1;
    return x->epoch < y->epoch ? -1 : x->epoch > y->epoch;
}

/* Fills dec->porder with the local prompts that still have tokens to
 * prefill, oldest first; returns how many.  Slot order would let a new
 * request that took a freed low slot pass one waiting in a high slot,
 * again and again: under a TPOT budget that lets a few prompts in a step,
 * the H200's 2048/128 run at 256 streams had TTFT p50 1.2 s but p99
 * 31.6 s (issue 36). */
static int local_prompts_by_arrival(decode_t *dec)
{
    int n = 0;

    DECODE_RESV_FOREACH(dec, i) {
        const decode_resv_t *r = &dec->resv[i];

        if (r->local && r->n_fed < r->p.n_tokens)
            dec->porder[n++] = (decode_arrival_t){ r->t_start, r->epoch, i };
    }
    qsort(dec->porder, (size_t)n, sizeof(*dec->porder), arrival_cmp);
    return n;
}

/* One plain step (spec_step handles the decode batch with a draft
 * head).  Overlapped with the GPU: the batch is built from every running
 * sequence, the forward and the device sampling are enqueued
 * (backend_forward_sample_begin), the previous step's tokens go out
 * (detokenize, stop conditions, TokenOut) and newly full blocks enter
 * the prefix cache while the device works, then the step's ids are
 * collected.  The token a sequence was just given is
 * fed before it is emitted, so a sequence that the emission ends (stop
 * string, stop id, length) rides one step for nothing: its row is
 * dropped and it is removed after the wait (its KV blocks are its own
 * until then).  What clients see is unchanged. */
static void step(decode_t *dec)
{
    int n = 0, n_decode, n_rows, n_fed = 0; /* n_fed: prompt tokens */
    int lp_i = -1; /* the batch entry with a row per prompt position */
    uint64_t now = bt_time_ns(), t0 = now, t1, t2, t3;
    decode_seq_t *s, *next;
    bt_status_t status = BT_OK;

    if (dec->busy_end_ns != 0 && now > dec->busy_end_ns)
        decode_budget_observe_between(
            &dec->cost, (double)(now - dec->busy_end_ns) * 1e-6);
    dec->busy_end_ns = 0;
    preempt_for_room(dec);
    if (dec->spec != NULL)
        decode__step_spec(dec); /* the decode batch; local prefill below */
    for (s = dec->spec != NULL ? NULL : dec->seqs;
         s && n < dec->max_seqs && n < dec->budget; s = next) {
        next = s->next;
        if (s->pend && s->n_tokens > dec->max_context)
            continue; /* cannot be fed: its emission ends it */
        if (!seq_has_room(dec, s)) {
            decode__seq_no_room(dec, s, now);
            continue;
        }
        s->wait_since = 0;
        if (s->grammar != NULL &&
            grammar_mask(s->grammar, s->gstate, s->gmask) != BT_OK) {
            /* this request only, never the batch */
            decode__seq_fail(dec, s, BATON__ERROR_CODE__ERROR_INVALID,
                             bt_error_last());
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
        int n_wait = local_prompts_by_arrival(dec);

        budget = decode_budget_round_step(n_decode, budget, dec->step_quantum,
                                          DECODE_PREFILL_FLOOR);
        for (int k = 0; k < n_wait; k++) {
            decode_resv_t *r = &dec->resv[dec->porder[k].slot];
            backend_seq_t *bs = &dec->bseqs[n];
            sampler_t *ps = NULL;
            int take;
            if (n >= dec->max_seqs || budget <= 0)
                break;
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
                (ps = decode__local_prefill_sampler(dec, r)) == NULL)
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
    if (n == 0) {
        decode__emit_pending(dec);
        cache_new_blocks(dec);
        return;
    }
    for (int i = 0; i < n_decode; i++)
        dec->bmap[i]->in_step = true;
    t1 = t2 = bt_time_ns();
    dec->split.build = (double)(t1 - dec->turn_t0) * 1e-9;
    if (dec->engine != NULL) {
        backend_t *be = engine_backend(dec->engine);
        backend_batch_t batch;

        memset(&batch, 0, sizeof(batch));
        batch.n_seqs = n;
        batch.seqs = dec->bseqs;
        status = backend_forward_sample_begin(be, &batch, dec->rsamp,
                                              dec->rids,
                                              lp_i >= 0 ? dec->lp_logits
                                                        : NULL,
                                              dec->hidden);
        t2 = bt_time_ns();
    }
    decode__emit_pending(dec); /* while the GPU works */
    cache_new_blocks(dec);
    t3 = bt_time_ns();
    if (dec->engine != NULL && status == BT_OK)
        status = backend_forward_sample_end(engine_backend(dec->engine));
    dec->step_ended_ns = bt_time_ns();
    dec->split.enqueue = (double)(t2 - t1) * 1e-9;
    dec->split.emit = (double)(t3 - t2) * 1e-9;
    dec->split.wait = (double)(dec->step_ended_ns - t3) * 1e-9;
    if (n_fed > 0 && status == BT_OK && bt_time_ns() > t1) {
        /* Local prefill rate (aggregated): the router's prefill
         * deadlines for this worker come from it. */
        double rate = n_fed * 1e9 / (double)(bt_time_ns() - t1);
        dec->tps = dec->tps > 0 ? 0.8 * dec->tps + 0.2 * rate : rate;
    }
    dec->steps++;
    for (int i = n_decode, row = n_decode; i < n; i++) {
        decode_resv_t *r = dec->pmap[i - n_decode];
        sampler_t *ps = dec->psamp[i - n_decode];
        if (status != BT_OK) {
            decode__send_prefill_failure(dec, r->id, r->epoch,
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
            decode__local_prefill_done(dec, r, dec->rids[row++],
                                       sampler_last_logprobs(ps));
        }
        sampler_destroy(&ps);
    }
    for (int i = 0; i < n_decode; i++) {
        int tok;
        s = dec->bmap[i];
        s->in_step = false;
        if (s->finished) { /* ended by the emission above: row dropped */
            decode__seq_remove(dec, s);
            continue;
        }
        if (status != BT_OK) {
            decode__seq_fail(dec, s, BATON__ERROR_CODE__ERROR_WORKER,
                             bt_error_last());
            continue;
        }
        s->n_cached++;
        if (dec->engine != NULL) {
            tok = dec->rids[i];
            sampler_observe(s->sampler, tok);
            if (s->grammar != NULL &&
                grammar_advance_token(s->grammar, &s->gstate, tok) !=
                    BT_OK) {
                decode__seq_fail(dec, s, BATON__ERROR_CODE__ERROR_INTERNAL,
                                 bt_error_last());
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
    decode_budget_observe(&dec->cost, n_decode, n_fed,
                          (double)(bt_time_ns() - t0) * 1e-6);
    if (dec->seqs != NULL)
        dec->busy_end_ns = bt_time_ns();
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
 * after it, so only full blocks below it are cached, and this may run
 * while s is in the step in flight (cache_new_blocks does). */
void decode__seq_cache_blocks(decode_t *dec, decode_seq_t *s)
{
    if (dec->prefix == NULL || !s->pcache)
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

/* The blocks that became full in local prompts and in running
 * sequences up to the last step are cached, so a request arriving while
 * they still run hits them too.  step() calls it while the device runs
 * the next step (issue 36: ~20 us a step at 256 streams that no longer
 * add to it); the step in flight writes only above what is cached. */
static void cache_new_blocks(decode_t *dec)
{
    if (dec->prefix == NULL)
        return;
    DECODE_RESV_FOREACH(dec, i) {
        decode_resv_t *r = &dec->resv[i];
        if (!(r->local || r->local_done) || r->blocks == NULL)
            continue;
        workerproc_prefix_insert(dec->prefix, &r->pcur, r->p.tokens,
                                 BT_MIN(r->n_fed,
                                        r->n_blocks * dec->block_size),
                                 r->blocks);
    }
    for (decode_seq_t *s = dec->seqs; s; s = s->next)
        decode__seq_cache_blocks(dec, s);
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
    bt_free(dec->resv_bits);
    bt_free(dec->quar_bits);
    bt_free(dec->rsamp);
    bt_free(dec->lp_logits);
    bt_free(dec->rids);
    bt_free(dec->psamp);
    bt_free(dec->emit_q);
    bt_free(dec->emit_tok);
    bt_free(dec->bseqs);
    bt_free(dec->bmap);
    bt_free(dec->pmap);
    bt_free(dec->porder);
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
        .kv_direct_writes = cfg->kv_direct_writes,
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
        dec->step_quantum = backend_step_quantum(engine_backend(dec->engine));
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
    dec->resv_bits = bt_calloc(DECODE_BIT_WORDS(cfg->max_reservations),
                               sizeof(uint64_t), "decode_resv");
    dec->quar_bits = bt_calloc(DECODE_BIT_WORDS(cfg->max_reservations),
                               sizeof(uint64_t), "decode_resv");
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
    dec->porder = bt_calloc((size_t)dec->cfg.max_reservations,
                            sizeof(*dec->porder), "decode_batch");
    if (dec->resv == NULL || dec->quar == NULL || dec->resv_bits == NULL ||
        dec->quar_bits == NULL || dec->rsamp == NULL ||
        dec->rids == NULL || dec->psamp == NULL || dec->emit_q == NULL ||
        dec->emit_tok == NULL ||
        dec->bseqs == NULL || dec->bmap == NULL || dec->pmap == NULL ||
        dec->porder == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_bufs;
    }
    status = decode__spec_setup(dec);
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
    decode__spec_teardown(dec);
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
        decode__seq_remove(dec, dec->seqs);
    for (int i = 0; i < dec->cfg.max_reservations; i++) {
        if (dec->resv[i].used)
            decode__resv_free(dec, &dec->resv[i], true);
        if (dec->quar[i].blocks != NULL) {
            kv_allocator_release(dec->kv, dec->quar[i].n_blocks,
                                 dec->quar[i].blocks);
            bt_free(dec->quar[i].blocks);
        }
    }
    decode__spec_teardown(dec); /* after its sequences */
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
    return dec->n_resv > 0;
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
        timeout = dec->seqs != NULL || decode__has_local_prefill(dec) ||
                  decode__has_arrivals_pending(dec) ? 0 : 50;
        if (timeout > 0 && dec->hb_owed) { /* the owed beat's turn */
            const uint64_t since = bt_time_ns() - dec->last_hb_ns;
            const int owed_ms =
                since >= DECODE_HB_URGENT_NS
                    ? 0
                    : (int)((DECODE_HB_URGENT_NS - since) / 1000000ull);

            timeout = BT_MIN(timeout, owed_ms + 1);
        }
        if (timeout > 0 && dec->links != NULL &&
            kv_link_receiver_arm_fd(dec->links, &fd) == BT_IN_PROGRESS)
            timeout = 0; /* events pending: progress first */
        /* a turn's host work starts at the poll, unless it idles there */
        dec->turn_t0 = bt_time_ns();
        status = workerproc_poll_fd(dec->sock, fd, timeout);
        if (status != BT_OK)
            return status;
        if (timeout > 0)
            dec->turn_t0 = bt_time_ns();
        workerproc_link_turn_begin(dec->link);
        if (dec->links != NULL) {
            uint64_t refused, t0 = bt_time_ns();
            kv_link_receiver_progress(dec->links);
            host_add(dec, DECODE_HOST_LINKS, t0);
            refused = kv_link_receiver_writes_refused(dec->links);
            if (refused != dec->writes_refused) /* stale or forged */
                workerproc_metrics_kv_writes_refused(
                    dec->cfg.metrics, refused - dec->writes_refused);
            dec->writes_refused = refused;
        }
        if (decode__has_arrivals_pending(dec)) {
            uint64_t t0 = bt_time_ns();
            decode__arrivals_pending(dec);
            host_add(dec, DECODE_HOST_PENDING, t0);
        }
        handle_messages(dec);
        decode__send_outbox(dec); /* the grants, before the step */
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
        decode__resv_expire(dec);
        if (dec->prefix != NULL && workerproc_link_registered(dec->link))
            workerproc_prefix_publish(dec->prefix, dec->sock,
                                      DECODE_KV_EVENTS_MS);
        decode__send_outbox(dec);
        workerproc_link_turn_end(dec->link);
        publish_beat(dec);
        decode__step_split_observe(dec);
    }
    workerproc_send_shutdown(dec->sock, dec->name);
    stats[0] = '\0';
    if (dec->links != NULL)
        kv_link_receiver_stats(dec->links, stats, sizeof(stats));
    BT_LOG_INFO("DECODE", "%s stopped: %llu steps, %llu tokens, KV "
                "hand-offs by link: %s kv_cap_rejected:%llu "
                "kv_grants_waited:%llu kv_preempted:%llu "
                "kv_windows:%llu kv_windows_revoked:%llu "
                "kv_writes_refused:%llu",
                dec->name, (unsigned long long)dec->steps,
                (unsigned long long)dec->tokens_out, stats,
                (unsigned long long)dec->cap_rejected,
                (unsigned long long)dec->grants_waited,
                (unsigned long long)dec->preempted,
                (unsigned long long)dec->windows_mapped,
                (unsigned long long)dec->windows_revoked,
                (unsigned long long)dec->writes_refused);
    log_step_times(dec, true);
    log_host_work(dec);
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
