/*
 * router_kvindex.c - per-worker sets of cached block hashes, fed by KV
 * event batches in sequence order.
 *
 * One open-addressing set of 64-bit wire hashes per worker slot (0 marks
 * an empty cell: workers never publish 0), linear probing, deleted by
 * backward shift because evictions are as common as stores, grown at half
 * load.  Overlap walks the prompt's chain until the first miss: a
 * worker's set may hold children whose parent was evicted, and a prefix
 * is only reusable from its start.
 */
#include "router_kvindex.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

typedef struct {
    uint64_t *cells;      /* (mask + 1) hashes, 0 = empty */
    uint32_t mask;        /* cells - 1, a power of two (0: no table) */
    int count;            /* hashes held */
    uint64_t instance;    /* stream being followed, 0 = none yet */
    uint64_t seq_next;    /* sequence number expected next */
    bool needs_resync;    /* events lost: empty until a snapshot */
    bool has_identity;    /* identity and block_size published */
    bt_blockhash_t identity; /* the worker's pool identity */
    int block_size;       /* its tokens per block */
} kvindex_slot_t;

struct router_kvindex_s {
    router_kvindex_config_t cfg;
    kvindex_slot_t *slots; /* (cfg.max_workers) */
};

void router_kvindex_config_init(router_kvindex_config_t *cfg)
{
    cfg->max_workers = 256;
    cfg->max_blocks_per_worker = 1 << 22;
    cfg->max_events = 1 << 20;
}

// ----------------------------------------------------------------------------
// hash set

static uint32_t set_home(const kvindex_slot_t *s, uint64_t h)
{
    return (uint32_t)(h ^ (h >> 32)) & s->mask;
}

static bool set_has(const kvindex_slot_t *s, uint64_t h)
{
    if (s->cells == NULL)
        return false;
    for (uint32_t i = set_home(s, h);; i = (i + 1) & s->mask) {
        if (s->cells[i] == h)
            return true;
        if (s->cells[i] == 0)
            return false;
    }
}

static void set_put_cell(kvindex_slot_t *s, uint64_t h)
{
    uint32_t i = set_home(s, h);

    while (s->cells[i] != 0)
        i = (i + 1) & s->mask;
    s->cells[i] = h;
}

static bt_status_t set_grow(kvindex_slot_t *s)
{
    size_t old_n = s->cells != NULL ? (size_t)s->mask + 1 : 0;
    size_t n = old_n > 0 ? 2 * old_n : 64;
    uint64_t *old = s->cells;

    s->cells = bt_calloc(n, sizeof(*s->cells), "router_kvindex");
    if (s->cells == NULL) {
        s->cells = old;
        return BT_ERR_NO_MEMORY;
    }
    s->mask = (uint32_t)(n - 1);
    for (size_t i = 0; i < old_n; i++)
        if (old[i] != 0)
            set_put_cell(s, old[i]);
    bt_free(old);
    return BT_OK;
}

static bt_status_t set_add(kvindex_slot_t *s, uint64_t h)
{
    bt_status_t status;

    if (set_has(s, h))
        return BT_OK;
    if (s->cells == NULL || 2 * ((size_t)s->count + 1) > (size_t)s->mask + 1) {
        status = set_grow(s);
        if (status != BT_OK)
            return status;
    }
    set_put_cell(s, h);
    s->count++;
    return BT_OK;
}

static void set_del(kvindex_slot_t *s, uint64_t h)
{
    uint32_t i;

    if (!set_has(s, h))
        return;
    i = set_home(s, h);
    while (s->cells[i] != h)
        i = (i + 1) & s->mask;
    for (uint32_t j = (i + 1) & s->mask; s->cells[j] != 0;
         j = (j + 1) & s->mask) {
        uint32_t home = set_home(s, s->cells[j]);

        /* cells[j] may move into the hole at i unless its home lies
         * cyclically in (i, j]. */
        if (((j - home) & s->mask) >= ((j - i) & s->mask)) {
            s->cells[i] = s->cells[j];
            i = j;
        }
    }
    s->cells[i] = 0;
    s->count--;
}

static void set_clear(kvindex_slot_t *s)
{
    BT_FREE(s->cells);
    s->mask = 0;
    s->count = 0;
}

// ----------------------------------------------------------------------------
// create / destroy

bt_status_t router_kvindex_create(const router_kvindex_config_t *cfg,
                                  router_kvindex_t **idx_p)
{
    router_kvindex_t *idx;

    if (cfg->max_workers <= 0 || cfg->max_blocks_per_worker <= 0 ||
        cfg->max_events <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                        "KV index needs positive limits (workers %d, blocks "
                        "%d, events %d)", cfg->max_workers,
                        cfg->max_blocks_per_worker, cfg->max_events);
    idx = bt_calloc(1, sizeof(*idx), "router_kvindex");
    if (idx == NULL)
        return BT_ERR_NO_MEMORY;
    idx->slots = bt_calloc((size_t)cfg->max_workers, sizeof(*idx->slots),
                           "router_kvindex");
    if (idx->slots == NULL) {
        bt_free(idx);
        return BT_ERR_NO_MEMORY;
    }
    idx->cfg = *cfg;
    *idx_p = idx;
    return BT_OK;
}

void router_kvindex_destroy(router_kvindex_t **idx_p)
{
    router_kvindex_t *idx = *idx_p;

    if (idx == NULL)
        return;
    for (int w = 0; w < idx->cfg.max_workers; w++)
        set_clear(&idx->slots[w]);
    bt_free(idx->slots);
    bt_free(idx);
    *idx_p = NULL;
}

void router_kvindex_reset(router_kvindex_t *idx, int w)
{
    kvindex_slot_t *s;

    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    s = &idx->slots[w];
    set_clear(s);
    memset(s, 0, sizeof(*s));
}

// ----------------------------------------------------------------------------
// applying batches

/* Events were lost: the slot forgets everything until a snapshot. */
static void slot_lost(kvindex_slot_t *s)
{
    set_clear(s);
    s->needs_resync = true;
}

static bt_status_t validate(const router_kvindex_t *idx, uint64_t seq_first,
                            int n_events,
                            const router_kvindex_event_t *events)
{
    if (seq_first == 0)
        return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                        "KV events: sequence numbers start at 1, got 0");
    if (n_events < 0 || n_events > idx->cfg.max_events)
        return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                        "KV events: %d events in one batch (limit %d)",
                        n_events, idx->cfg.max_events);
    if (seq_first > UINT64_MAX - (uint64_t)n_events)
        return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                        "KV events: sequence %llu + %d events overflows",
                        (unsigned long long)seq_first, n_events);
    for (int i = 0; i < n_events; i++) {
        const router_kvindex_event_t *ev = &events[i];

        if (ev->type != BATON__KV_EVENT_TYPE__KV_EVENT_STORED &&
            ev->type != BATON__KV_EVENT_TYPE__KV_EVENT_EVICTED &&
            ev->type != BATON__KV_EVENT_TYPE__KV_EVENT_CLEARED)
            return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                            "KV events: event %d has unknown type %d", i,
                            ev->type);
        if (ev->n_hashes < 0 || (ev->n_hashes > 0 && ev->hashes == NULL))
            return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                            "KV events: event %d has a bad hash list", i);
        for (int k = 0; k < ev->n_hashes; k++)
            if (ev->hashes[k] == 0)
                return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                                "KV events: event %d carries hash 0", i);
    }
    return BT_OK;
}

/* Applies events[from..n) to slot s.  Returns BT_ERR_NO_RESOURCE when
 * the slot went over its cap, BT_ERR_NO_MEMORY when a set could not
 * grow (either way the caller drops the slot). */
static bt_status_t apply_events(const router_kvindex_t *idx,
                                kvindex_slot_t *s, int from, int n,
                                const router_kvindex_event_t *events)
{
    for (int i = from; i < n; i++) {
        const router_kvindex_event_t *ev = &events[i];

        if (ev->type == BATON__KV_EVENT_TYPE__KV_EVENT_CLEARED) {
            set_clear(s);
            continue;
        }
        for (int k = 0; k < ev->n_hashes; k++) {
            bt_status_t status;

            if (ev->type == BATON__KV_EVENT_TYPE__KV_EVENT_EVICTED) {
                set_del(s, ev->hashes[k]);
                continue;
            }
            if (s->count >= idx->cfg.max_blocks_per_worker &&
                !set_has(s, ev->hashes[k]))
                return BT_ERR_NO_RESOURCE;
            status = set_add(s, ev->hashes[k]);
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
}

bt_status_t router_kvindex_apply(router_kvindex_t *idx, int w,
                                 uint64_t instance, uint64_t seq_first,
                                 bool resync, int n_events,
                                 const router_kvindex_event_t *events,
                                 router_kvindex_result_t *result_p)
{
    kvindex_slot_t *s;
    uint64_t seq_end;
    int from = 0;
    bt_status_t status;

    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    s = &idx->slots[w];
    status = instance == 0
                 ? BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                            "KV events: instance 0 is reserved")
                 : validate(idx, seq_first, n_events, events);
    if (status != BT_OK) {
        slot_lost(s);
        return status;
    }
    seq_end = seq_first + (uint64_t)n_events;
    if (instance != s->instance) {
        /* A new stream: the worker restarted (its cache is empty) or we
         * never followed it.  Complete only from its first event. */
        set_clear(s);
        s->instance = instance;
        s->needs_resync = false;
        s->seq_next = 1;
        if (!resync && seq_first != 1) {
            slot_lost(s);
            *result_p = ROUTER_KVINDEX_RESYNC;
            return BT_OK;
        }
    }
    if (resync) {
        /* A snapshot older than what we applied is stale (the channel is
         * ordered, so this is a duplicate); otherwise it is the truth. */
        if (!s->needs_resync && seq_end <= s->seq_next && s->seq_next > 1) {
            *result_p = ROUTER_KVINDEX_STALE;
            return BT_OK;
        }
        set_clear(s);
        s->needs_resync = false;
    } else if (s->needs_resync) {
        *result_p = ROUTER_KVINDEX_RESYNC;
        return BT_OK;
    } else if (seq_end <= s->seq_next &&
               !(n_events == 0 && seq_first == s->seq_next)) {
        /* An empty batch at the expected number is the stream's position
         * confirmed (it reveals a gap otherwise): applied, not stale. */
        *result_p = ROUTER_KVINDEX_STALE;
        return BT_OK;
    } else if (seq_first > s->seq_next) {
        BT_LOG_WARN("ROUTER", "KV events of worker slot %d: expected "
                    "sequence %llu, got %llu: dropping its index until a "
                    "resync", w, (unsigned long long)s->seq_next,
                    (unsigned long long)seq_first);
        slot_lost(s);
        *result_p = ROUTER_KVINDEX_RESYNC;
        return BT_OK;
    } else {
        from = (int)(s->seq_next - seq_first); /* skip what we had */
    }
    status = apply_events(idx, s, from, n_events, events);
    if (status != BT_OK) {
        BT_LOG_WARN("ROUTER", "KV index of worker slot %d: %s at %d blocks:"
                    " dropping it until a resync", w,
                    status == BT_ERR_NO_RESOURCE ? "over the block cap"
                                                 : "out of memory",
                    s->count);
        slot_lost(s);
        *result_p = ROUTER_KVINDEX_RESYNC;
        return BT_OK;
    }
    s->seq_next = seq_end;
    *result_p = ROUTER_KVINDEX_APPLIED;
    return BT_OK;
}

bt_status_t router_kvindex_apply_msg(router_kvindex_t *idx, int w,
                                     const Baton__KvEvents *msg,
                                     router_kvindex_result_t *result_p)
{
    router_kvindex_event_t *events = NULL;
    kvindex_slot_t *s;
    bt_status_t status;

    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    s = &idx->slots[w];
    if (msg->n_events > (size_t)idx->cfg.max_events) {
        slot_lost(s);
        return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                        "KV events: %zu events in one batch (limit %d)",
                        msg->n_events, idx->cfg.max_events);
    }
    if (msg->has_identity && msg->identity.len != 16) {
        slot_lost(s);
        return BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                        "KV events: identity of %zu bytes, not 16",
                        msg->identity.len);
    }
    if (msg->n_events > 0) {
        events = bt_calloc(msg->n_events, sizeof(*events), "router_kvindex");
        if (events == NULL)
            return BT_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < msg->n_events; i++) {
        const Baton__KvEvent *ev = msg->events[i];

        if (ev->n_block_hashes > (size_t)idx->cfg.max_blocks_per_worker) {
            slot_lost(s);
            status = BT_ERROR(BT_ERR_FORMAT, "ROUTER",
                              "KV events: event of %zu hashes",
                              ev->n_block_hashes);
            goto out_free_events;
        }
        events[i].type = (int)ev->type;
        events[i].parent = ev->has_parent_hash ? ev->parent_hash : 0;
        events[i].n_hashes = (int)ev->n_block_hashes;
        events[i].hashes = ev->block_hashes;
    }
    status = router_kvindex_apply(idx, w, msg->instance, msg->seq_first,
                                  msg->has_resync && msg->resync,
                                  (int)msg->n_events, events, result_p);
    if (status == BT_OK && msg->has_identity && msg->has_block_size &&
        msg->block_size > 0 && msg->block_size <= (1u << 20)) {
        const uint8_t *b = msg->identity.data;

        s->identity.lo = 0;
        s->identity.hi = 0;
        for (int k = 7; k >= 0; k--) {
            s->identity.lo = (s->identity.lo << 8) | b[k];
            s->identity.hi = (s->identity.hi << 8) | b[8 + k];
        }
        s->block_size = (int)msg->block_size;
        s->has_identity = true;
    }
out_free_events:
    bt_free(events);
    return status;
}

// ----------------------------------------------------------------------------
// queries

bool router_kvindex_needs_resync(const router_kvindex_t *idx, int w)
{
    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    return idx->slots[w].needs_resync;
}

uint64_t router_kvindex_instance(const router_kvindex_t *idx, int w)
{
    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    return idx->slots[w].instance;
}

uint64_t router_kvindex_seq_next(const router_kvindex_t *idx, int w)
{
    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    return idx->slots[w].seq_next;
}

int router_kvindex_blocks(const router_kvindex_t *idx, int w)
{
    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    return idx->slots[w].count;
}

bool router_kvindex_identity(const router_kvindex_t *idx, int w,
                             bt_blockhash_t *identity_p, int *block_size_p)
{
    const kvindex_slot_t *s;

    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    s = &idx->slots[w];
    if (!s->has_identity)
        return false;
    *identity_p = s->identity;
    *block_size_p = s->block_size;
    return true;
}

int router_kvindex_overlap(const router_kvindex_t *idx, int w,
                           const uint64_t *chain, int n)
{
    const kvindex_slot_t *s;
    int k = 0;

    BT_ASSERT(w >= 0 && w < idx->cfg.max_workers);
    s = &idx->slots[w];
    while (k < n && set_has(s, chain[k]))
        k++;
    return k;
}
