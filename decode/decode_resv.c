/*
 * decode_resv.c - the reservation table: KvReserve grants blocks (the
 * prefix cache's held blocks first), KvRelease and expiry free them, and
 * blocks a remote writer may still target wait in quarantine.
 */
#include "decode_int.h"

#include <string.h>

#include "bt_kv_promise.h"

static void quarantine(decode_t *dec, int *blocks, int n)
{
    int i = decode__bit_first_clear(dec->quar_bits,
                                    dec->cfg.max_reservations);

    if (i >= 0) {
        decode_quarantine_t *q = &dec->quar[i];
        decode__bit_put(dec->quar_bits, i, true);
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
void decode__resv_free(decode_t *dec, decode_resv_t *r, bool safe)
{
    /* Only a writer holding a key to the pool itself makes freed blocks
     * wait; receive windows are revoked by the reset below. */
    bool remote = dec->links != NULL &&
                  kv_link_receiver_pool_exposed(dec->links);

    if (r->local || r->local_done)
        safe = true; /* prefilled here: no remote writer */
    else if (r->used && dec->links != NULL)
        dec->recv_frees++; /* its receive room, if any, comes free */
    if (dec->links != NULL &&
        kv_link_receiver_reset(dec->links, (int)(r - dec->resv), !safe)) {
        dec->windows_revoked++;
        workerproc_metrics_kv_window_revoked(dec->cfg.metrics);
    }
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
    if (r->used) {
        decode__bit_put(dec->resv_bits, (int)(r - dec->resv), false);
        dec->n_resv--;
    }
    memset(r, 0, sizeof(*r));
}

void decode__cap_rejected(decode_t *dec)
{
    dec->cap_rejected++;
    workerproc_metrics_kv_rejected(dec->cfg.metrics);
}

/* Whether the capability a KvReady (or a local PrefillTask's grant)
 * presents is r's: 16 bytes, compared in constant time. */
bool decode__capability_ok(const decode_resv_t *r,
                           const ProtobufCBinaryData *cap, bool has)
{
    return has && cap->len == sizeof(r->cap) &&
           bt_ct_equal(cap->data, r->cap, sizeof(r->cap));
}

decode_resv_t *decode__resv_find(decode_t *dec, uint64_t id)
{
    DECODE_RESV_FOREACH(dec, i)
        if (dec->resv[i].id == id)
            return &dec->resv[i];
    return NULL;
}

/* The chain hash of tokens' first n_blocks full blocks under root. */
bt_blockhash_t decode__held_chain(const decode_t *dec, bt_blockhash_t root,
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
        *hash_p = decode__held_chain(dec, root, m->prompt_ids, hit);
        BT_LOG_DEBUG("KV", "request %llu: %d of %d reserved blocks held "
                     "(prefix cache): the hand-off moves the rest",
                     (unsigned long long)m->request_id, hit, need);
    }
    return hit;
}

void decode__on_reserve(decode_t *dec, const Baton__KvReserve *m)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvGrant g = BATON__KV_GRANT__INIT;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;
    decode_resv_t *r = NULL;
    const int64_t total = m->has_max_total_tokens
                              ? (int64_t)m->max_total_tokens
                              : (int64_t)dec->max_context;
    const bool past_ctx = total > dec->max_context;
    const int need = (int)bt_kv_prompt_blocks(m->n_tokens, dec->max_context,
                                              dec->block_size);
    /* what max_tokens allows (to the context), and the promise: all of
     * it; with no bound (asked past the context) the prompt and
     * --kv-unbounded-promise tokens; overcommitted, the prompt.  Past its
     * promise a stream grows from unpromised blocks, and goes back to
     * the router when they run out (preempt_for_room). */
    const int growth = (int)bt_kv_promise_blocks(
        m->n_tokens, total, dec->max_context, dec->block_size, past_ctx, -1);
    const int limit =
        dec->cfg.kv_overcommit
            ? need
            : (int)bt_kv_promise_blocks(m->n_tokens, total, dec->max_context,
                                        dec->block_size, past_ctx,
                                        dec->cfg.kv_unbounded_promise);
    int *blocks = NULL;
    int *recv_ids = NULL;
    int held = 0, slot;
    bt_blockhash_t held_hash = { 0, 0 };
    uint8_t cap[PROTO_CAPABILITY_BYTES];

    g.has_request_id = 1;
    g.request_id = m->request_id;
    g.has_ok = 1;
    if (decode__resv_find(dec, m->request_id) != NULL) {
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
    slot = decode__bit_first_clear(dec->resv_bits, dec->cfg.max_reservations);
    if (slot >= 0)
        r = &dec->resv[slot];
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
    if (decode__available_blocks(dec) < limit) {
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
            .has_want_link = m->has_kv_transport,
            .want_link = (int)m->kv_transport,
        };
        bt_status_t st = BT_OK;
        /* The announced link implies the receive area; an older router
         * only says kv_stage. */
        lg.want_recv_area = lg.has_want_link
                                ? kv_link_wants_recv_area(lg.want_link)
                                : m->has_kv_stage && m->kv_stage;
        if (lg.want_recv_area) {
            recv_ids = bt_malloc((size_t)lg.n * sizeof(int), "decode_resv");
            lg.recv_ids = recv_ids;
            if (recv_ids == NULL)
                lg.want_recv_area = false;
        }
        st = kv_link_receiver_arm(dec->links, &lg);
        if (st == BT_ERR_NO_RESOURCE) {
            /* The staged link's area or the windows' budget holds the
             * hand-offs in flight: the router asks again when one ends. */
            kv_allocator_release(dec->kv, need, blocks);
            bt_free(blocks);
            dec->grants_waited++;
            workerproc_metrics_kv_grant_waited(dec->cfg.metrics);
            g.error = "KV receive area full";
            g.has_recv_full = 1;
            g.recv_full = 1;
            g.has_recv_frees = 1;
            g.recv_frees = dec->recv_frees;
            dec->recv_refused = true;
            goto reply;
        }
        if (lg.ucx_window != NULL) {
            dec->windows_mapped++;
            workerproc_metrics_kv_window_mapped(dec->cfg.metrics);
        }
        /* valid until the slot is reset: the reply below is sent first */
        g.has_ucx_window = lg.ucx_window != NULL;
        g.ucx_window.data = (uint8_t *)lg.ucx_window;
        g.ucx_window.len = lg.ucx_window_len;
        g.has_cipc_window = lg.cipc_window != NULL;
        g.cipc_window.data = (uint8_t *)lg.cipc_window;
        g.cipc_window.len = lg.cipc_window_len;
        if (!lg.has_recv_ids) { /* the grant goes without: another link */
            bt_free(recv_ids);
            recv_ids = NULL;
        }
    }
    r->used = true;
    decode__bit_put(dec->resv_bits, slot, true);
    dec->n_resv++;
    r->id = m->request_id;
    memcpy(r->cap, cap, sizeof(cap));
    r->epoch = ++dec->next_epoch;
    r->blocks = blocks;
    r->n_blocks = need;
    r->held = held;
    r->held_hash = held_hash;
    r->limit_blocks = limit;
    r->growth_blocks = growth;
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
    g.free_blocks = (uint32_t)decode__available_blocks(dec);
    decode__fill_layout(dec, &lay);
    g.kv_layout = &lay;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_GRANT;
    msg.kv_grant = &g;
    decode__send_msg(dec, &msg);
    bt_free(recv_ids);
}

void decode__on_release(decode_t *dec, const Baton__KvRelease *m)
{
    decode_resv_t *r = decode__resv_find(dec, m->request_id);

    if (r != NULL && (m->epoch == 0 || m->epoch == r->epoch))
        decode__resv_free(dec, r, false);
}

void decode__resv_expire(decode_t *dec)
{
    uint64_t now = bt_time_ns();

    DECODE_RESV_FOREACH(dec, i) {
        decode_resv_t *r = &dec->resv[i];
        /* A prompt prefilled here (aggregated) waits for this worker's
         * own steps, not for a remote writer: it never expires while
         * queued (a cold burst of long prompts took longer than the
         * timeout and lost every request behind it; issue 36). */
        if (!r->local && now > r->expires_ns) {
            BT_LOG_WARN("KV", "reservation of request %llu expired: its KV "
                        "never arrived", (unsigned long long)r->id);
            decode__resv_free(dec, r, false);
        }
    }
    for (int i = decode__bit_next(dec->quar_bits, dec->cfg.max_reservations,
                                  0);
         i >= 0; i = decode__bit_next(dec->quar_bits,
                                      dec->cfg.max_reservations, i + 1)) {
        decode_quarantine_t *q = &dec->quar[i];
        if (now > q->release_ns) {
            kv_allocator_release(dec->kv, q->n_blocks, q->blocks);
            bt_free(q->blocks);
            memset(q, 0, sizeof(*q));
            decode__bit_put(dec->quar_bits, i, false);
        }
    }
    if (dec->links != NULL)
        kv_link_receiver_expire(dec->links, now);
}
