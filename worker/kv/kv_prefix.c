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
 * Host tier: entries n_blocks .. n_blocks + host_blocks - 1 of the same
 * per-entry array and map are the host slots (slot = entry - n_blocks),
 * with their own LRU list and a stack of free slots.  A pool block moves
 * there when evicted (evict_one: saved, then re-keyed) and back when a
 * match reaches it (host_fetch: a pool block taken, loaded, re-keyed), so
 * a hash names at most one entry in either tier.
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
    bool cached;           /* in the map; the cache holds a reference (a
                              pool block) */
    bool in_lru;           /* cached and no sequence uses it (a host
                              entry: cached and not being loaded) */
    int lru_prev;          /* older neighbour, KV_PREFIX_NONE at the head */
    int lru_next;          /* newer neighbour, KV_PREFIX_NONE at the tail */
} kv_prefix_block_t;

typedef struct {
    int head;              /* least recently used */
    int tail;              /* most recently used */
    int n;
} kv_prefix_lru_t;

struct kv_prefix_s {
    kv_allocator_t *alloc;     /* the pool's allocator, not owned */
    int n_blocks;              /* pool size */
    int block_size;            /* tokens per block */
    bt_blockhash_t identity;   /* model, dtype, block size */
    uint64_t instance;         /* names this cache's event stream */
    kv_prefix_block_t *blocks; /* (n_blocks + host_blocks) per entry */
    int *map;                  /* (map_mask + 1) entries, NONE = empty */
    uint32_t map_mask;         /* slots - 1, slots a power of two */
    kv_prefix_lru_t lru;       /* unused cached pool blocks */
    int n_cached;              /* pool blocks in the map */
    /* host tier */
    int host_blocks;           /* slots (0: no tier) */
    size_t host_block_bytes;
    char *host_mem;            /* the caller's */
    bt_status_t (*host_save)(void *, int, const int *, void *const *);
    bt_status_t (*host_load)(void *, int, const int *, void *const *);
    void *host_arg;
    kv_prefix_lru_t host_lru;  /* cached host entries */
    int *host_free;            /* (host_blocks) stack of free entries */
    int n_host_free;
    int n_host_cached;         /* host entries in the map */
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

/* The list entry id belongs to: the pool's or the host tier's. */
static kv_prefix_lru_t *lru_of(kv_prefix_t *p, int id)
{
    return id < p->n_blocks ? &p->lru : &p->host_lru;
}

static void lru_push_tail(kv_prefix_t *p, int id)
{
    kv_prefix_block_t *b = &p->blocks[id];
    kv_prefix_lru_t *l = lru_of(p, id);

    BT_ASSERT(b->cached && !b->in_lru);
    b->in_lru = true;
    b->lru_prev = l->tail;
    b->lru_next = KV_PREFIX_NONE;
    if (l->tail != KV_PREFIX_NONE)
        p->blocks[l->tail].lru_next = id;
    else
        l->head = id;
    l->tail = id;
    l->n++;
}

static void lru_unlink(kv_prefix_t *p, int id)
{
    kv_prefix_block_t *b = &p->blocks[id];
    kv_prefix_lru_t *l = lru_of(p, id);

    BT_ASSERT(b->in_lru);
    if (b->lru_prev != KV_PREFIX_NONE)
        p->blocks[b->lru_prev].lru_next = b->lru_next;
    else
        l->head = b->lru_next;
    if (b->lru_next != KV_PREFIX_NONE)
        p->blocks[b->lru_next].lru_prev = b->lru_prev;
    else
        l->tail = b->lru_prev;
    b->in_lru = false;
    b->lru_prev = KV_PREFIX_NONE;
    b->lru_next = KV_PREFIX_NONE;
    l->n--;
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
                                  int tier, uint64_t parent)
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
    ev->tier = tier;
    ev->parent = parent;
    p->next_seq++;
    return ev;
}

/* Appends one hash to the log, extending the last event when it
 * continues it (a STORED chain, a run of EVICTED) so batches stay small.
 * A full or failing log is dropped; the next take is then a snapshot. */
static void log_event(kv_prefix_t *p, kv_prefix_ev_type_t type, int tier,
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

        if (last->type != type || last->tier != tier)
            ev = NULL;
        else if (type == KV_PREFIX_EV_EVICTED)
            ev = last;
        else if (type == KV_PREFIX_EV_STORED &&
                 last->hashes[last->n_hashes - 1] == parent)
            ev = last;
    }
    if (ev == NULL && (ev = log_new(p, type, tier, parent)) == NULL)
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
    events = bt_calloc((size_t)(p->n_cached + p->n_host_cached) + 1,
                       sizeof(*events), "kv_prefix_log");
    if (events == NULL)
        return BT_ERR_NO_MEMORY;
    events[0].type = KV_PREFIX_EV_CLEARED;
    /* Blocks in id order (the pool's, then the host tier's): a
     * sequence's blocks are mostly adjacent runs, so its chain folds
     * into one STORED event. */
    for (int id = 0; id < p->n_blocks + p->host_blocks; id++) {
        const kv_prefix_block_t *b = &p->blocks[id];
        kv_prefix_event_t *last = &events[n - 1];
        int tier = id < p->n_blocks ? 0 : 1;

        if (!b->cached)
            continue;
        if (n == 1 || last->tier != tier ||
            last->hashes[last->n_hashes - 1] != b->parent.lo) {
            last = &events[n++];
            last->type = KV_PREFIX_EV_STORED;
            last->tier = tier;
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

    if (short_by > p->lru.n)
        return false;
    for (int i = 0; i < short_by; i++)
        evict_one(p);
    return true;
}

static int hook_reclaimable(const void *arg)
{
    const kv_prefix_t *p = arg;

    return p->lru.n;
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
    if (cfg->host_blocks < 0 || cfg->host_blocks > (1 << 28) ||
        (cfg->host_blocks > 0 &&
         (cfg->host_mem == NULL || cfg->host_block_bytes == 0 ||
          cfg->host_save == NULL || cfg->host_load == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "prefix cache host tier of %d blocks needs 0 to "
                        "2^28 blocks, memory, a block size in bytes and "
                        "save / load hooks", cfg->host_blocks);
    n_blocks = kv_allocator_total(alloc);
    while (slots < 2 * ((size_t)n_blocks + (size_t)cfg->host_blocks))
        slots *= 2;
    p = bt_calloc(1, sizeof(*p), "kv_prefix");
    if (p == NULL)
        return BT_ERR_NO_MEMORY;
    p->blocks = bt_calloc((size_t)n_blocks + (size_t)cfg->host_blocks,
                          sizeof(*p->blocks), "kv_prefix");
    if (p->blocks == NULL)
        goto err_free_prefix;
    p->map = bt_malloc(slots * sizeof(*p->map), "kv_prefix");
    if (p->map == NULL)
        goto err_free_blocks;
    p->host_free = bt_malloc(((size_t)cfg->host_blocks + 1) *
                                 sizeof(*p->host_free), "kv_prefix");
    if (p->host_free == NULL)
        goto err_free_map;
    for (size_t i = 0; i < slots; i++)
        p->map[i] = KV_PREFIX_NONE;
    for (int id = 0; id < n_blocks + cfg->host_blocks; id++) {
        p->blocks[id].lru_prev = KV_PREFIX_NONE;
        p->blocks[id].lru_next = KV_PREFIX_NONE;
    }
    /* Lowest slot on top: the first spills fill the tier in order. */
    for (int i = 0; i < cfg->host_blocks; i++)
        p->host_free[i] = n_blocks + cfg->host_blocks - 1 - i;
    p->n_host_free = cfg->host_blocks;
    p->host_blocks = cfg->host_blocks;
    p->host_block_bytes = cfg->host_block_bytes;
    p->host_mem = cfg->host_mem;
    p->host_save = cfg->host_save;
    p->host_load = cfg->host_load;
    p->host_arg = cfg->host_arg;
    p->host_lru.head = p->host_lru.tail = KV_PREFIX_NONE;
    p->alloc = alloc;
    p->n_blocks = n_blocks;
    p->block_size = cfg->block_size;
    p->identity = bt_blockhash_identity(cfg->block_size, cfg->model_id,
                                        cfg->kv_dtype);
    p->instance = cfg->instance != 0 ? cfg->instance : bt_random_u64();
    p->map_mask = (uint32_t)(slots - 1);
    p->lru.head = KV_PREFIX_NONE;
    p->lru.tail = KV_PREFIX_NONE;
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
            goto err_free_host;
    }
    *prefix_p = p;
    return BT_OK;

err_free_host:
    bt_free(p->host_free);
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

/* Host slot entry e's bytes. */
static void *host_ptr(const kv_prefix_t *p, int e)
{
    return p->host_mem + (size_t)(e - p->n_blocks) * p->host_block_bytes;
}

/* Takes host entry e (cached) out of the tier: its slot is free again. */
static void host_uncache(kv_prefix_t *p, int e)
{
    kv_prefix_block_t *b = &p->blocks[e];

    if (b->in_lru)
        lru_unlink(p, e);
    map_remove(p, e);
    b->cached = false;
    p->n_host_cached--;
    p->host_free[p->n_host_free++] = e;
}

/* Drops host entry e for good (an EVICTED of tier 1). */
static void host_evict(kv_prefix_t *p, int e)
{
    log_event(p, KV_PREFIX_EV_EVICTED, 1, 0, p->blocks[e].hash.lo);
    host_uncache(p, e);
    p->stats.host_evictions++;
}

/* A free host entry, evicting the host LRU's oldest when none is free;
 * KV_PREFIX_NONE without a tier or when every entry is being loaded. */
static int host_take(kv_prefix_t *p)
{
    if (p->n_host_free == 0 && p->host_lru.head != KV_PREFIX_NONE)
        host_evict(p, p->host_lru.head);
    if (p->n_host_free == 0)
        return KV_PREFIX_NONE;
    return p->host_free[--p->n_host_free];
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
    bt_free(p->host_free);
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

/* Brings host entry e back into a pool block: taken from the allocator
 * (which may evict pool LRU blocks, spilling them to the host; e is out
 * of the host LRU meanwhile so that cannot drop it), loaded, re-keyed.
 * Returns the block, cached, with the cache's reference and one for the
 * caller (kv_prefix_match's, so it is not in the LRU), or KV_PREFIX_NONE:
 * no pool block free (e stays in the host tier) or the load failed (e
 * dropped: fail closed, the caller computes those tokens). */
static int host_fetch(kv_prefix_t *p, int e)
{
    kv_prefix_block_t *h = &p->blocks[e];
    void *src = host_ptr(p, e);
    kv_prefix_block_t *b;
    bt_status_t status;
    int id;

    lru_unlink(p, e);
    if (kv_allocator_alloc(p->alloc, 1, &id) != BT_OK) {
        lru_push_tail(p, e);
        return KV_PREFIX_NONE;
    }
    status = p->host_load(p->host_arg, 1, &id, &src);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "prefix cache: loading a block from the host "
                    "tier failed (%s): dropped, recomputed",
                    bt_status_str(status));
        kv_allocator_release(p->alloc, 1, &id);
        host_evict(p, e);
        return KV_PREFIX_NONE;
    }
    b = &p->blocks[id];
    b->hash = h->hash;
    b->parent = h->parent;
    log_event(p, KV_PREFIX_EV_EVICTED, 1, 0, h->hash.lo);
    host_uncache(p, e);
    b->cached = true;
    map_put(p, id);
    p->n_cached++;
    kv_allocator_ref(p->alloc, id); /* the cache's own; alloc's: caller's */
    log_event(p, KV_PREFIX_EV_STORED, 0, b->parent.lo, b->hash.lo);
    p->stats.host_loads++;
    return id;
}

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
        if (id >= p->n_blocks) {
            /* host_fetch takes the caller's reference itself */
            if ((id = host_fetch(p, id)) == KV_PREFIX_NONE)
                break;
        } else {
            if (p->blocks[id].in_lru)
                lru_unlink(p, id);
            kv_allocator_ref(p->alloc, id);
        }
        ids[n] = id;
    }
    p->stats.hit_blocks += (uint64_t)n;
    p->stats.hit_tokens += (uint64_t)n * (uint64_t)p->block_size;
    return n;
}

/* Evicts the least recently used unused cached block. */
/* Evicts the least recently used unused cached block of the pool: with
 * a host tier, saved to a host slot and cached there (the router still
 * sees it cached: removed from tier 0, stored in tier 1). */
static void evict_one(kv_prefix_t *p)
{
    int id = p->lru.head;
    kv_prefix_block_t *b;
    int e;

    BT_ASSERT(id != KV_PREFIX_NONE);
    b = &p->blocks[id];
    log_event(p, KV_PREFIX_EV_EVICTED, 0, 0, b->hash.lo);
    p->stats.evictions++;
    e = host_take(p);
    if (e != KV_PREFIX_NONE) {
        void *dst = host_ptr(p, e);
        bt_status_t status = p->host_save(p->host_arg, 1, &id, &dst);

        if (status != BT_OK) {
            BT_LOG_WARN("KV", "prefix cache: saving a block to the host "
                        "tier failed (%s): dropped", bt_status_str(status));
            p->host_free[p->n_host_free++] = e;
            e = KV_PREFIX_NONE;
        }
    }
    if (e == KV_PREFIX_NONE) {
        uncache(p, id);
        return;
    }
    p->blocks[e].hash = b->hash;
    p->blocks[e].parent = b->parent;
    uncache(p, id); /* out of the map before its host copy goes in */
    p->blocks[e].cached = true;
    map_put(p, e);
    p->n_host_cached++;
    lru_push_tail(p, e);
    log_event(p, KV_PREFIX_EV_STORED, 1, p->blocks[e].parent.lo,
              p->blocks[e].hash.lo);
    p->stats.host_saves++;
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
        /* Already cached (matched, or inserted before), or another pool
         * block holds this prefix: nothing to add.  A host copy gives
         * way to this one, which needs no load. */
        if (!b->cached) {
            int other = map_find(p, h);

            if (other >= p->n_blocks)
                host_evict(p, other);
            else if (other != KV_PREFIX_NONE)
                b = NULL;
        }
        if (b == NULL || b->cached) {
            parent = h;
            continue;
        }
        b->hash = h;
        b->parent = parent;
        b->cached = true;
        map_put(p, id);
        p->n_cached++;
        kv_allocator_ref(p->alloc, id); /* the cache's own reference */
        log_event(p, KV_PREFIX_EV_STORED, 0, parent.lo, h.lo);
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
    for (int e = p->n_blocks; e < p->n_blocks + p->host_blocks; e++)
        if (p->blocks[e].cached)
            host_uncache(p, e);
    /* Pending events stay: they carry sequence numbers the reader must
     * see, and applying them before the CLEARED ends in the same state. */
    if (!p->overflowed)
        (void)log_new(p, KV_PREFIX_EV_CLEARED, 0, 0);
}

int kv_prefix_available(const kv_prefix_t *p)
{
    return kv_allocator_free_list_count(p->alloc) + p->lru.n;
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
    stats->cached_unused = p->lru.n;
    stats->host_cached = p->n_host_cached;
    stats->host_blocks = p->host_blocks;
}

#define CHECK_OR_FAIL(_cond, ...)                                           \
    do {                                                                    \
        if (!(_cond)) {                                                     \
            BT_LOG_ERROR("KV", __VA_ARGS__);                                \
            return false;                                                   \
        }                                                                   \
    } while (0)

/* The host tier: every slot free (on the stack once) or cached (in the
 * map and the host LRU), and the counts agree. */
static bool host_check(const kv_prefix_t *p)
{
    int cached = 0, walked = 0, mapped = 0;

    for (int e = p->n_blocks; e < p->n_blocks + p->host_blocks; e++) {
        const kv_prefix_block_t *b = &p->blocks[e];
        int on_stack = 0;

        for (int i = 0; i < p->n_host_free; i++)
            on_stack += p->host_free[i] == e;
        if (b->cached) {
            cached++;
            CHECK_OR_FAIL(on_stack == 0 && b->in_lru &&
                          map_find(p, b->hash) == e,
                          "host entry %d: cached but free %d, in LRU %d, "
                          "found %d", e, on_stack, b->in_lru,
                          map_find(p, b->hash));
        } else {
            CHECK_OR_FAIL(on_stack == 1 && !b->in_lru,
                          "host entry %d: free %d times, in LRU %d", e,
                          on_stack, b->in_lru);
        }
    }
    for (uint32_t i = 0; i <= p->map_mask; i++)
        if (p->map[i] >= p->n_blocks)
            mapped++;
    for (int e = p->host_lru.head; e != KV_PREFIX_NONE;
         e = p->blocks[e].lru_next) {
        CHECK_OR_FAIL(e >= p->n_blocks && p->blocks[e].in_lru,
                      "host LRU walk hit entry %d", e);
        CHECK_OR_FAIL(++walked <= p->host_blocks, "host LRU has a cycle");
    }
    CHECK_OR_FAIL(cached == p->n_host_cached && mapped == cached &&
                  walked == cached && p->host_lru.n == cached &&
                  cached + p->n_host_free == p->host_blocks,
                  "host tier: %d cached, %d counted, %d mapped, %d walked, "
                  "%d free of %d", cached, p->n_host_cached, mapped, walked,
                  p->n_host_free, p->host_blocks);
    return true;
}

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
        if (p->map[i] != KV_PREFIX_NONE && p->map[i] < p->n_blocks)
            mapped++;
    if (!host_check(p))
        return false;
    for (int id = p->lru.head; id != KV_PREFIX_NONE;
         id = p->blocks[id].lru_next) {
        CHECK_OR_FAIL(p->blocks[id].in_lru, "LRU walk hit block %d not "
                      "marked in it", id);
        CHECK_OR_FAIL(++walked <= p->n_blocks, "LRU list has a cycle");
    }
    CHECK_OR_FAIL(cached == p->n_cached && mapped == cached,
                  "cached blocks: %d marked, %d mapped, %d counted", cached,
                  mapped, p->n_cached);
    CHECK_OR_FAIL(in_lru == p->lru.n && walked == in_lru,
                  "LRU: %d marked, %d walked, %d counted", in_lru, walked,
                  p->lru.n);
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
