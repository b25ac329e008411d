/*
 * kv_prefix.c - the prefix cache: hash map, LRU of unused cached blocks,
 * eviction, the event log.
 *
 * Per block: its 128-bit chain hash and parent hash while cached, and its
 * place in the LRU list while cached and unused.  The map is open
 * addressing with linear probing over block ids (at most n_blocks entries
 * in 2^k >= 2 n_blocks slots, so probes stay short), deleted by backward
 * shift so no tombstones pile up.  Everything is allocated at create:
 * match, insert, release and eviction never allocate; only the event log
 * grows (bounded by max_pending).
 *
 * No token ids are kept to re-check a hit: a false hit needs two
 * different prefixes with one 128-bit chain hash (bt_blockhash.h gives
 * the odds), so the hash is the name.
 */
#include "kv_prefix.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

#define KV_PREFIX_NONE (-1)

typedef struct {
    bt_blockhash_t hash;   /* chain hash, while cached */
    bt_blockhash_t parent; /* the previous block's hash (or the root) */
    bool cached;           /* in the map; the cache holds a reference */
    bool in_lru;           /* cached and no sequence uses it */
    int lru_prev;          /* older neighbour, KV_PREFIX_NONE at the head */
    int lru_next;          /* newer neighbour, KV_PREFIX_NONE at the tail */
} kv_prefix_block_t;

struct kv_prefix_s {
    kv_allocator_t *alloc;     /* the pool's allocator, not owned */
    int n_blocks;              /* pool size */
    int block_size;            /* tokens per block */
    bt_blockhash_t identity;   /* model, dtype, block size */
    uint64_t instance;         /* names this cache's event stream */
    kv_prefix_block_t *blocks; /* (n_blocks) per-block state */
    int *map;                  /* (map_mask + 1) block ids, NONE = empty */
    uint32_t map_mask;         /* slots - 1, slots a power of two */
    int lru_head;              /* least recently used unused cached block */
    int lru_tail;              /* most recently used */
    int n_cached;              /* blocks in the map */
    int n_lru;                 /* blocks in the LRU list */
    kv_prefix_stats_t stats;   /* counters (cached_* filled on read) */
    /* event log */
    uint64_t next_seq;         /* sequence number of the next event */
    kv_prefix_event_t *pending; /* (cap_pending) events not taken yet */
    int n_pending;             /* events in pending */
    int cap_pending;           /* room in pending */
    int pending_hashes;        /* hashes over all pending events */
    int max_pending;           /* beyond: overflowed */
    bool overflowed;           /* log dropped: next take is a snapshot */
};

void kv_prefix_config_init(kv_prefix_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->block_size = 16;
    cfg->model_id = "";
    cfg->kv_dtype = "f32";
    cfg->max_pending = 65536;
}

// ----------------------------------------------------------------------------
// hash map: chain hash -> block id

static uint32_t map_slot(const kv_prefix_t *p, bt_blockhash_t h)
{
    return (uint32_t)(h.hi ^ (h.hi >> 32)) & p->map_mask;
}

/* The block cached under h, or KV_PREFIX_NONE. */
static int map_find(const kv_prefix_t *p, bt_blockhash_t h)
{
    for (uint32_t i = map_slot(p, h);; i = (i + 1) & p->map_mask) {
        int id = p->map[i];

        if (id == KV_PREFIX_NONE)
            return KV_PREFIX_NONE;
        if (bt_blockhash_eq(p->blocks[id].hash, h))
            return id;
    }
}

static void map_put(kv_prefix_t *p, int id)
{
    uint32_t i = map_slot(p, p->blocks[id].hash);

    while (p->map[i] != KV_PREFIX_NONE)
        i = (i + 1) & p->map_mask;
    p->map[i] = id;
}

/* Removes block id (present) and shifts later entries of its probe run
 * back so every entry stays reachable from its home slot. */
static void map_remove(kv_prefix_t *p, int id)
{
    uint32_t i = map_slot(p, p->blocks[id].hash);

    while (p->map[i] != id)
        i = (i + 1) & p->map_mask;
    for (uint32_t j = (i + 1) & p->map_mask;; j = (j + 1) & p->map_mask) {
        int other = p->map[j];
        uint32_t home;

        if (other == KV_PREFIX_NONE)
            break;
        home = map_slot(p, p->blocks[other].hash);
        /* `other` may fill the hole at i unless its home lies cyclically
         * in (i, j]. */
        if (((j - home) & p->map_mask) >= ((j - i) & p->map_mask)) {
            p->map[i] = other;
            i = j;
        }
    }
    p->map[i] = KV_PREFIX_NONE;
}

// ----------------------------------------------------------------------------
// LRU of unused cached blocks

static void lru_push_tail(kv_prefix_t *p, int id)
{
    kv_prefix_block_t *b = &p->blocks[id];

    BT_ASSERT(b->cached && !b->in_lru);
    b->in_lru = true;
    b->lru_prev = p->lru_tail;
    b->lru_next = KV_PREFIX_NONE;
    if (p->lru_tail != KV_PREFIX_NONE)
        p->blocks[p->lru_tail].lru_next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->n_lru++;
}

static void lru_unlink(kv_prefix_t *p, int id)
{
    kv_prefix_block_t *b = &p->blocks[id];

    BT_ASSERT(b->in_lru);
    if (b->lru_prev != KV_PREFIX_NONE)
        p->blocks[b->lru_prev].lru_next = b->lru_next;
    else
        p->lru_head = b->lru_next;
    if (b->lru_next != KV_PREFIX_NONE)
        p->blocks[b->lru_next].lru_prev = b->lru_prev;
    else
        p->lru_tail = b->lru_prev;
    b->in_lru = false;
    b->lru_prev = KV_PREFIX_NONE;
    b->lru_next = KV_PREFIX_NONE;
    p->n_lru--;
}

// ----------------------------------------------------------------------------
// event log

static void log_drop(kv_prefix_t *p)
{
    for (int i = 0; i < p->n_pending; i++)
        bt_free(p->pending[i].hashes);
    p->n_pending = 0;
    p->pending_hashes = 0;
}

static void log_overflow(kv_prefix_t *p, const char *why)
{
    if (!p->overflowed)
        BT_LOG_WARN("KV", "prefix cache event log %s (%d hashes pending): "
                    "the next publication is a full resync", why,
                    p->pending_hashes);
    log_drop(p);
    p->overflowed = true;
}

/* Appends hash to ev's list; its capacity is the next power of two of
 * its count, so it grows when the count is one. */
static bt_status_t event_push(kv_prefix_event_t *ev, uint64_t hash)
{
    if (ev->n_hashes == 0 || (ev->n_hashes & (ev->n_hashes - 1)) == 0) {
        size_t cap = ev->n_hashes == 0 ? 1 : 2 * (size_t)ev->n_hashes;
        uint64_t *hashes = bt_realloc(ev->hashes, cap * sizeof(*hashes),
                                      "kv_prefix_log");

        if (hashes == NULL)
            return BT_ERR_NO_MEMORY;
        ev->hashes = hashes;
    }
    ev->hashes[ev->n_hashes++] = hash;
    return BT_OK;
}

/* A new event at the end of the log (its sequence number taken), or NULL
 * when the log had to give up. */
static kv_prefix_event_t *log_new(kv_prefix_t *p, kv_prefix_ev_type_t type,
                                  uint64_t parent)
{
    kv_prefix_event_t *ev;

    if (p->n_pending == p->cap_pending) {
        int cap = p->cap_pending > 0 ? 2 * p->cap_pending : 16;
        kv_prefix_event_t *grown = bt_realloc(
            p->pending, (size_t)cap * sizeof(*grown), "kv_prefix_log");

        if (grown == NULL) {
            log_overflow(p, "out of memory");
            return NULL;
        }
        p->pending = grown;
        p->cap_pending = cap;
    }
    ev = &p->pending[p->n_pending++];
    memset(ev, 0, sizeof(*ev));
    ev->type = type;
    ev->parent = parent;
    p->next_seq++;
    return ev;
}

/* Appends one hash to the log, extending the last event when it
 * continues it (a STORED chain, a run of EVICTED) so batches stay small.
 * A full or failing log is dropped; the next take is then a snapshot. */
static void log_event(kv_prefix_t *p, kv_prefix_ev_type_t type,
                      uint64_t parent, uint64_t hash)
{
    kv_prefix_event_t *ev = NULL;

    if (p->overflowed)
        return;
    if (p->pending_hashes >= p->max_pending) {
        log_overflow(p, "full");
        return;
    }
    if (p->n_pending > 0) {
        kv_prefix_event_t *last = &p->pending[p->n_pending - 1];

        if (last->type == type && type == KV_PREFIX_EV_EVICTED)
            ev = last;
        else if (last->type == type && type == KV_PREFIX_EV_STORED &&
                 last->hashes[last->n_hashes - 1] == parent)
            ev = last;
    }
    if (ev == NULL && (ev = log_new(p, type, parent)) == NULL)
        return;
    if (event_push(ev, hash) != BT_OK) {
        log_overflow(p, "out of memory");
        return;
    }
    p->pending_hashes++;
}

void kv_prefix_batch_cleanup(kv_prefix_batch_t *batch)
{
    for (int i = 0; i < batch->n_events; i++)
        bt_free(batch->events[i].hashes);
    bt_free(batch->events);
    memset(batch, 0, sizeof(*batch));
}

bt_status_t kv_prefix_events_take(kv_prefix_t *p, kv_prefix_batch_t *batch)
{
    if (p->overflowed)
        return kv_prefix_snapshot(p, batch);
    memset(batch, 0, sizeof(*batch));
    batch->instance = p->instance;
    batch->seq_first = p->next_seq - (uint64_t)p->n_pending;
    batch->n_events = p->n_pending;
    batch->events = p->pending;
    p->pending = NULL;
    p->n_pending = 0;
    p->cap_pending = 0;
    p->pending_hashes = 0;
    return BT_OK;
}

bt_status_t kv_prefix_snapshot(kv_prefix_t *p, kv_prefix_batch_t *batch)
{
    kv_prefix_event_t *events;
    int n = 1;

    memset(batch, 0, sizeof(*batch)); /* empty on failure too */
    /* The pending events are covered by the snapshot.  Until one is
     * handed out, the log stays overflowed: a failed snapshot is retried
     * by the next take, never skipped. */
    log_drop(p);
    p->overflowed = true;
    /* Worst case one STORED per block, plus the CLEARED. */
    events = bt_calloc((size_t)p->n_cached + 1, sizeof(*events),
                       "kv_prefix_log");
    if (events == NULL)
        return BT_ERR_NO_MEMORY;
    events[0].type = KV_PREFIX_EV_CLEARED;
    /* Blocks in id order: a sequence's blocks are mostly adjacent runs,
     * so its chain folds into one STORED event. */
    for (int id = 0; id < p->n_blocks; id++) {
        const kv_prefix_block_t *b = &p->blocks[id];
        kv_prefix_event_t *last = &events[n - 1];

        if (!b->cached)
            continue;
        if (n == 1 || last->hashes[last->n_hashes - 1] != b->parent.lo) {
            last = &events[n++];
            last->type = KV_PREFIX_EV_STORED;
            last->parent = b->parent.lo;
        }
        if (event_push(last, b->hash.lo) != BT_OK) {
            kv_prefix_batch_t partial = { .n_events = n, .events = events };

            kv_prefix_batch_cleanup(&partial);
            return BT_ERR_NO_MEMORY;
        }
    }
    memset(batch, 0, sizeof(*batch));
    batch->instance = p->instance;
    batch->seq_first = p->next_seq;
    batch->resync = true;
    batch->n_events = n;
    batch->events = events;
    p->next_seq += (uint64_t)n;
    p->overflowed = false;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// create / destroy

// ----------------------------------------------------------------------------
// allocator hooks: every release and every short allocation of the pool,
// whoever makes it (engine, worker), goes through the cache

/* A release left block id at refcount: a cached block down to the
 * cache's own reference is now unused, the most recently used. */
static void hook_released(void *arg, int id, int refcount)
{
    kv_prefix_t *p = arg;
    kv_prefix_block_t *b = &p->blocks[id];

    if (!b->cached)
        return;
    /* Only uncache() drops the cache's own reference, after clearing
     * `cached`: a cached block at 0 is a double release by a user. */
    BT_ASSERT(refcount >= 1 && !b->in_lru);
    if (refcount == 1)
        lru_push_tail(p, id);
}

static void evict_one(kv_prefix_t *p);

static bool hook_reclaim(void *arg, int short_by)
{
    kv_prefix_t *p = arg;

    if (short_by > p->n_lru)
        return false;
    for (int i = 0; i < short_by; i++)
        evict_one(p);
    return true;
}

static int hook_reclaimable(const void *arg)
{
    const kv_prefix_t *p = arg;

    return p->n_lru;
}

bt_status_t kv_prefix_create(const kv_prefix_config_t *cfg,
                             kv_allocator_t *alloc, kv_prefix_t **prefix_p)
{
    kv_prefix_t *p;
    size_t slots = 2;
    int n_blocks;
    bt_status_t status = BT_ERR_NO_MEMORY;

    if (alloc == NULL || cfg->block_size <= 0 || cfg->model_id == NULL ||
        cfg->kv_dtype == NULL || cfg->max_pending <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "prefix cache needs an allocator, a block size > 0 "
                        "(got %d), a model id, a KV dtype and room for "
                        "events (max_pending %d)", cfg->block_size,
                        cfg->max_pending);
    n_blocks = kv_allocator_total(alloc);
    while (slots < 2 * (size_t)n_blocks)
        slots *= 2;
    p = bt_calloc(1, sizeof(*p), "kv_prefix");
    if (p == NULL)
        return BT_ERR_NO_MEMORY;
    p->blocks = bt_calloc((size_t)n_blocks, sizeof(*p->blocks), "kv_prefix");
    if (p->blocks == NULL)
        goto err_free_prefix;
    p->map = bt_malloc(slots * sizeof(*p->map), "kv_prefix");
    if (p->map == NULL)
        goto err_free_blocks;
    for (size_t i = 0; i < slots; i++)
        p->map[i] = KV_PREFIX_NONE;
    for (int id = 0; id < n_blocks; id++) {
        p->blocks[id].lru_prev = KV_PREFIX_NONE;
        p->blocks[id].lru_next = KV_PREFIX_NONE;
    }
    p->alloc = alloc;
    p->n_blocks = n_blocks;
    p->block_size = cfg->block_size;
    p->identity = bt_blockhash_identity(cfg->block_size, cfg->model_id,
                                        cfg->kv_dtype);
    p->instance = cfg->instance != 0 ? cfg->instance : bt_random_u64();
    p->map_mask = (uint32_t)(slots - 1);
    p->lru_head = KV_PREFIX_NONE;
    p->lru_tail = KV_PREFIX_NONE;
    p->next_seq = 1;
    p->max_pending = cfg->max_pending;
    {
        kv_allocator_cache_t hooks = {
            .released = hook_released,
            .reclaim = hook_reclaim,
            .reclaimable = hook_reclaimable,
            .arg = p,
        };

        status = kv_allocator_set_cache(alloc, &hooks);
        if (status != BT_OK)
            goto err_free_map;
    }
    *prefix_p = p;
    return BT_OK;

err_free_map:
    bt_free(p->map);
err_free_blocks:
    bt_free(p->blocks);
err_free_prefix:
    bt_free(p);
    return status;
}

/* Takes block id out of the cache and drops the cache's reference. */
static void uncache(kv_prefix_t *p, int id)
{
    kv_prefix_block_t *b = &p->blocks[id];

    if (b->in_lru)
        lru_unlink(p, id);
    map_remove(p, id);
    b->cached = false;
    p->n_cached--;
    kv_allocator_release(p->alloc, 1, &id);
}

void kv_prefix_destroy(kv_prefix_t **prefix_p)
{
    kv_prefix_t *p = *prefix_p;

    if (p == NULL)
        return;
    (void)kv_allocator_set_cache(p->alloc, NULL);
    for (int id = 0; id < p->n_blocks; id++)
        if (p->blocks[id].cached)
            uncache(p, id);
    log_drop(p);
    bt_free(p->pending);
    bt_free(p->map);
    bt_free(p->blocks);
    bt_free(p);
    *prefix_p = NULL;
}

bt_blockhash_t kv_prefix_identity(const kv_prefix_t *p)
{
    return p->identity;
}

bt_blockhash_t kv_prefix_root(const kv_prefix_t *p, const void *salt,
                              size_t salt_len)
{
    return bt_blockhash_root(p->identity, salt, salt_len);
}

uint64_t kv_prefix_instance(const kv_prefix_t *p)
{
    return p->instance;
}

// ----------------------------------------------------------------------------
// sequences

int kv_prefix_match(kv_prefix_t *p, bt_blockhash_t root, const int *tokens,
                    int n_tokens, int max_blocks, int *ids)
{
    int full = n_tokens > 0 ? n_tokens / p->block_size : 0;
    bt_blockhash_t h = root;
    int n = 0;

    p->stats.lookups++;
    p->stats.lookup_tokens += (uint64_t)BT_MAX(n_tokens, 0);
    p->stats.lookup_blocks += (uint64_t)full;
    full = BT_MIN(full, max_blocks);
    for (; n < full; n++) {
        int id;

        h = bt_blockhash_next(h, tokens + (size_t)n * (size_t)p->block_size,
                              p->block_size);
        id = map_find(p, h);
        if (id == KV_PREFIX_NONE)
            break;
        if (p->blocks[id].in_lru)
            lru_unlink(p, id);
        kv_allocator_ref(p->alloc, id);
        ids[n] = id;
    }
    p->stats.hit_blocks += (uint64_t)n;
    p->stats.hit_tokens += (uint64_t)n * (uint64_t)p->block_size;
    return n;
}

/* Evicts the least recently used unused cached block. */
static void evict_one(kv_prefix_t *p)
{
    int id = p->lru_head;

    BT_ASSERT(id != KV_PREFIX_NONE);
    log_event(p, KV_PREFIX_EV_EVICTED, 0, p->blocks[id].hash.lo);
    uncache(p, id);
    p->stats.evictions++;
}

bt_status_t kv_prefix_alloc(kv_prefix_t *p, int n, int *ids)
{
    /* The allocator asks hook_reclaim for what its free list lacks. */
    return kv_allocator_alloc(p->alloc, n, ids);
}

void kv_prefix_cursor_init(kv_prefix_cursor_t *cursor, bt_blockhash_t root)
{
    cursor->last = root;
    cursor->n_hashed = 0;
}

int kv_prefix_insert_more(kv_prefix_t *p, kv_prefix_cursor_t *cursor,
                          const int *tokens, int n_tokens, const int *ids)
{
    int full = n_tokens > 0 ? n_tokens / p->block_size : 0;
    bt_blockhash_t parent = cursor->last;
    int added = 0;

    for (int k = cursor->n_hashed; k < full; k++) {
        int id = ids[k];
        kv_prefix_block_t *b;
        bt_blockhash_t h = bt_blockhash_next(
            parent, tokens + (size_t)k * (size_t)p->block_size,
            p->block_size);

        BT_ASSERT(id >= 0 && id < p->n_blocks);
        BT_ASSERT(kv_allocator_refcount(p->alloc, id) > 0);
        b = &p->blocks[id];
        /* Already cached (matched, or inserted before), or another block
         * holds this prefix: nothing to add. */
        if (b->cached || map_find(p, h) != KV_PREFIX_NONE) {
            parent = h;
            continue;
        }
        b->hash = h;
        b->parent = parent;
        b->cached = true;
        map_put(p, id);
        p->n_cached++;
        kv_allocator_ref(p->alloc, id); /* the cache's own reference */
        log_event(p, KV_PREFIX_EV_STORED, parent.lo, h.lo);
        p->stats.inserted++;
        added++;
        parent = h;
    }
    if (full > cursor->n_hashed) {
        cursor->last = parent;
        cursor->n_hashed = full;
    }
    return added;
}

int kv_prefix_insert(kv_prefix_t *p, bt_blockhash_t root, const int *tokens,
                     int n_tokens, const int *ids)
{
    kv_prefix_cursor_t cursor;

    kv_prefix_cursor_init(&cursor, root);
    return kv_prefix_insert_more(p, &cursor, tokens, n_tokens, ids);
}

void kv_prefix_release(kv_prefix_t *p, int n, const int *ids)
{
    /* Last block first (kv_allocator_release's order): the LRU then
     * evicts a sequence's tail before the prefix other prompts are
     * likelier to share; hook_released queues what falls to 1. */
    kv_allocator_release(p->alloc, n, ids);
}

void kv_prefix_clear(kv_prefix_t *p)
{
    for (int id = 0; id < p->n_blocks; id++)
        if (p->blocks[id].cached)
            uncache(p, id);
    /* Pending events stay: they carry sequence numbers the reader must
     * see, and applying them before the CLEARED ends in the same state. */
    if (!p->overflowed)
        (void)log_new(p, KV_PREFIX_EV_CLEARED, 0);
}

int kv_prefix_available(const kv_prefix_t *p)
{
    return kv_allocator_free_list_count(p->alloc) + p->n_lru;
}

bool kv_prefix_is_cached(const kv_prefix_t *p, int id)
{
    return id >= 0 && id < p->n_blocks && p->blocks[id].cached;
}

// ----------------------------------------------------------------------------
// statistics and invariants

void kv_prefix_stats(const kv_prefix_t *p, kv_prefix_stats_t *stats)
{
    *stats = p->stats;
    stats->cached_blocks = p->n_cached;
    stats->cached_unused = p->n_lru;
}

#define CHECK_OR_FAIL(_cond, ...)                                           \
    do {                                                                    \
        if (!(_cond)) {                                                     \
            BT_LOG_ERROR("KV", __VA_ARGS__);                                \
            return false;                                                   \
        }                                                                   \
    } while (0)

bool kv_prefix_check(const kv_prefix_t *p)
{
    int cached = 0, in_lru = 0, free_blocks = 0, in_use = 0, walked = 0;
    int mapped = 0;

    for (int id = 0; id < p->n_blocks; id++) {
        const kv_prefix_block_t *b = &p->blocks[id];
        int rc = kv_allocator_refcount(p->alloc, id);

        if (b->cached) {
            cached++;
            CHECK_OR_FAIL(rc >= 1, "cached block %d has refcount %d", id,
                          rc);
            CHECK_OR_FAIL(map_find(p, b->hash) == id,
                          "cached block %d not found by its hash", id);
            CHECK_OR_FAIL(b->in_lru == (rc == 1),
                          "cached block %d: refcount %d but in_lru %d", id,
                          rc, b->in_lru);
        } else {
            CHECK_OR_FAIL(!b->in_lru, "uncached block %d in the LRU", id);
        }
        if (b->in_lru)
            in_lru++;
        else if (rc == 0)
            free_blocks++;
        else
            in_use++;
    }
    for (uint32_t i = 0; i <= p->map_mask; i++)
        if (p->map[i] != KV_PREFIX_NONE)
            mapped++;
    for (int id = p->lru_head; id != KV_PREFIX_NONE;
         id = p->blocks[id].lru_next) {
        CHECK_OR_FAIL(p->blocks[id].in_lru, "LRU walk hit block %d not "
                      "marked in it", id);
        CHECK_OR_FAIL(++walked <= p->n_blocks, "LRU list has a cycle");
    }
    CHECK_OR_FAIL(cached == p->n_cached && mapped == cached,
                  "cached blocks: %d marked, %d mapped, %d counted", cached,
                  mapped, p->n_cached);
    CHECK_OR_FAIL(in_lru == p->n_lru && walked == in_lru,
                  "LRU: %d marked, %d walked, %d counted", in_lru, walked,
                  p->n_lru);
    CHECK_OR_FAIL(free_blocks == kv_allocator_free_list_count(p->alloc),
                  "free blocks: %d at refcount 0, allocator says %d",
                  free_blocks, kv_allocator_free_list_count(p->alloc));
    CHECK_OR_FAIL(kv_allocator_free_count(p->alloc) == free_blocks + in_lru,
                  "allocator offers %d blocks, %d free + %d evictable",
                  kv_allocator_free_count(p->alloc), free_blocks, in_lru);
    CHECK_OR_FAIL(free_blocks + in_lru + in_use == p->n_blocks,
                  "free %d + cached unused %d + in use %d != total %d",
                  free_blocks, in_lru, in_use, p->n_blocks);
    return true;
}
