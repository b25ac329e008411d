/*
 * kv_prefix.h - the prefix cache of one KV pool (issue 38).
 *
 * Every full block a sequence computed is named by its chained hash
 * (common/bt_blockhash.h: model identity, KV dtype, block size and the
 * request's cache salt in the root) and, once inserted, stays in the pool
 * after its sequences finish: a later request whose prompt starts with
 * the same blocks (same salt) takes references on them instead of
 * computing them again.  Blocks no sequence uses wait in LRU order and are
 * evicted, oldest first, when an allocation finds the free list short.
 * Partial last blocks are never inserted, so never shared.
 *
 * The cache sits on top of the pool's kv_allocator_t: it holds one
 * allocator reference of its own on every cached block, so "cached at
 * refcount 0" in the words is allocator refcount 1 here.  It
 * attaches to the allocator (kv_allocator_set_cache), which then tells it
 * of every release and asks it to evict when an allocation finds the
 * free list short, and counts evictable blocks as free: the allocator's
 * users (engine, workers) run unchanged with a cache, and
 * kv_prefix_alloc / kv_prefix_release are the same calls by name.
 *
 * Every change of the cached set is logged as an event (STORED / EVICTED /
 * CLEARED with wire hashes and sequence numbers) that the worker publishes
 * to the router; see docs/KV_EVENTS.md.
 *
 * Host tier (optional, config host_blocks): a block the pool evicts is
 * first saved to a host slot (the caller's save hook copies its K/V
 * there) and stays cached in tier 1, LRU there too; evicting it from the
 * host drops it for good.  A match that reaches a host block takes a pool
 * block (evicting pool LRU blocks, never one the match holds), loads the
 * bytes back (the load hook) and returns it like any hit.  Both tiers are
 * keyed by the same chain hash, so by the salt too.
 *
 * Not thread-safe: the scheduler thread that owns the allocator owns it.
 */
#ifndef BT_WORKER_KV_KV_PREFIX_H
#define BT_WORKER_KV_KV_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_blockhash.h"
#include "bt_status.h"
#include "kv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int block_size;        /* tokens per block (the pool's) */
    const char *model_id;  /* names the weights and how they compute (name,
                              checksum, compute precision): KV is shared
                              only between equal ids; hashed at create,
                              not kept */
    const char *kv_dtype;  /* "f32", "bf16", ...; hashed, not kept */
    uint64_t instance;     /* events' instance; 0 = a random one */
    int max_pending;       /* event hashes held unpublished before the log
                              gives up and the next take is a snapshot */
    /* Host tier: host_blocks slots of host_block_bytes each at host_mem
     * (the caller's, kept until destroy; 0 slots: no tier).  save copies
     * the K/V of pool blocks[i] to host[i], load copies host[i] back
     * into blocks[i]; both complete before they return (a load before
     * any later forward reads the blocks).  A failing save drops the
     * block; a failing load drops the host copy and ends the match. */
    int host_blocks;
    size_t host_block_bytes;
    void *host_mem;
    bt_status_t (*host_save)(void *arg, int n, const int *blocks,
                             void *const *host);
    bt_status_t (*host_load)(void *arg, int n, const int *blocks,
                             void *const *host);
    void *host_arg;
} kv_prefix_config_t;

/* Defaults: block_size 16, model "", dtype "f32", random instance,
 * 65536 pending hashes, no host tier. */
void kv_prefix_config_init(kv_prefix_config_t *cfg);

typedef struct kv_prefix_s kv_prefix_t;

/* Creates the cache of `alloc`'s pool and attaches it there.  Does not
 * take ownership: `alloc` must outlive the cache.  BT_ERR_INVALID_ARG for
 * a bad block size, a NULL model id / dtype, a host tier without memory,
 * block bytes or hooks, or a pool that has a cache already. */
bt_status_t kv_prefix_create(const kv_prefix_config_t *cfg,
                             kv_allocator_t *alloc, kv_prefix_t **prefix_p);

/* Detaches from the allocator and drops the cache's reference on every
 * cached block (unused ones return to the free list; ones in use stay
 * with their sequences). */
void kv_prefix_destroy(kv_prefix_t **prefix_p);

/* The pool's identity hash (published in every event batch). */
bt_blockhash_t kv_prefix_identity(const kv_prefix_t *prefix);

/* The chain root for a request's cache salt (salt_len bytes, may be 0). */
bt_blockhash_t kv_prefix_root(const kv_prefix_t *prefix, const void *salt,
                              size_t salt_len);

uint64_t kv_prefix_instance(const kv_prefix_t *prefix);

// ----------------------------------------------------------------------------
// sequences

/* Looks up the leading full blocks of tokens[0..n_tokens) under `root`,
 * at most `max_blocks` of them (a caller that must compute at least one
 * prompt token passes (n_tokens - 1) / block_size).  Writes the cached
 * block ids, in order, to ids[] and takes one reference on each for the
 * caller (release with kv_prefix_release); returns how many (0..).  Counts
 * the lookup in the hit-rate statistics.  Blocks found in the host tier
 * are loaded into newly taken pool blocks first (the match stops where
 * no pool block is left for one). */
int kv_prefix_match(kv_prefix_t *prefix, bt_blockhash_t root,
                    const int *tokens, int n_tokens, int max_blocks,
                    int *ids);

/* Takes n blocks (refcount 1 each) into ids, evicting least recently used
 * unreferenced cached blocks when the free list is short.  All or
 * nothing: BT_ERR_NO_RESOURCE (not logged) and no change, no eviction,
 * when fewer than n are free or evictable.  kv_allocator_alloc on the
 * pool does the same. */
bt_status_t kv_prefix_alloc(kv_prefix_t *prefix, int n, int *ids);

/* Records the full blocks of a sequence whose KV is computed: ids[k]
 * holds tokens [k*bs, (k+1)*bs) of tokens[0..n_tokens) under `root`
 * (ids: the sequence's block table, at least n_tokens / bs entries).  The
 * partial last block is left out.  A block already cached under its hash
 * is skipped, and so is one whose hash another block already holds (two
 * sequences computed the same prefix: the first stays cached, the copy is
 * freed on release).  Returns the number of blocks newly cached. */
int kv_prefix_insert(kv_prefix_t *prefix, bt_blockhash_t root,
                     const int *tokens, int n_tokens, const int *ids);

/* Where a growing sequence's insertion stands, so a worker that inserts
 * as blocks fill (every step) hashes each block once, not the whole
 * prefix again each time.  Embedded in the caller's sequence state. */
typedef struct {
    bt_blockhash_t last; /* hash of the last block hashed (the root first) */
    int n_hashed;        /* full blocks hashed so far */
} kv_prefix_cursor_t;

/* A cursor at the start of a sequence under `root`. */
void kv_prefix_cursor_init(kv_prefix_cursor_t *cursor, bt_blockhash_t root);

/* kv_prefix_insert for the blocks that became full since the cursor:
 * tokens[0..n_tokens) and ids are the whole sequence so far (same
 * contract), only blocks from cursor->n_hashed on are hashed.  Advances
 * the cursor; returns the number of blocks newly cached. */
int kv_prefix_insert_more(kv_prefix_t *prefix, kv_prefix_cursor_t *cursor,
                          const int *tokens, int n_tokens, const int *ids);

/* Drops the caller's reference on each of ids[0..n): a cached block no
 * one uses any more waits in LRU order (the sequence's head most recent,
 * so its tail is evicted before the prefix others can share); an uncached
 * one returns to the free list.  kv_allocator_release on the pool does
 * the same. */
void kv_prefix_release(kv_prefix_t *prefix, int n, const int *ids);

/* Forgets every cached block (a CLEARED event): unused ones return to the
 * free list, ones in use become plain blocks of their sequences. */
void kv_prefix_clear(kv_prefix_t *prefix);

/* Blocks an allocation can get: free plus evictable (what the pool's
 * kv_allocator_free_count reports while the cache is attached). */
int kv_prefix_available(const kv_prefix_t *prefix);

bool kv_prefix_is_cached(const kv_prefix_t *prefix, int id);

// ----------------------------------------------------------------------------
// statistics

typedef struct {
    uint64_t lookups;       /* kv_prefix_match calls */
    uint64_t lookup_tokens; /* prompt tokens they asked about */
    uint64_t hit_tokens;    /* tokens found cached */
    uint64_t lookup_blocks; /* full blocks they asked about */
    uint64_t hit_blocks;    /* blocks found cached */
    uint64_t inserted;      /* blocks that entered the cache */
    uint64_t evictions;     /* blocks evicted from the pool to make room
                               (spilled to the host tier or not) */
    uint64_t host_saves;    /* pool evictions kept in the host tier */
    uint64_t host_loads;    /* host blocks a match loaded back (hits) */
    uint64_t host_evictions; /* host blocks dropped for good */
    int cached_blocks;      /* blocks cached in the pool now, in use or
                               not */
    int cached_unused;      /* of them, unreferenced (evictable) */
    int host_cached;        /* blocks cached in the host tier now */
    int host_blocks;        /* host tier slots (0: no tier) */
} kv_prefix_stats_t;

void kv_prefix_stats(const kv_prefix_t *prefix, kv_prefix_stats_t *stats);

/* Checks every internal invariant against the allocator: the hash map and
 * the block states agree, the LRU holds exactly the cached blocks at
 * allocator refcount 1, free + cached unused + in use = total, and every
 * host slot is free or cached (in the map and the host LRU).  For
 * tests; returns false (and logs what broke) on the first violation. */
bool kv_prefix_check(const kv_prefix_t *prefix);

// ----------------------------------------------------------------------------
// events

typedef enum {
    KV_PREFIX_EV_STORED = 1,  /* blocks entered the cache */
    KV_PREFIX_EV_EVICTED = 2, /* blocks left it */
    KV_PREFIX_EV_CLEARED = 3, /* everything left it */
} kv_prefix_ev_type_t;

typedef struct {
    kv_prefix_ev_type_t type;
    int tier;          /* STORED / EVICTED: 0 the pool, 1 the host tier */
    uint64_t parent;   /* STORED: wire hash of hashes[0]'s parent (the
                          root's for a first block) */
    int n_hashes;
    uint64_t *hashes;  /* (n_hashes) wire hashes; STORED: a chain, each
                          the parent of the next */
} kv_prefix_event_t;

typedef struct {
    uint64_t instance;   /* the cache's instance */
    uint64_t seq_first;  /* sequence number of events[0]; events[i] has
                            seq_first + i; numbers start at 1 */
    bool resync;         /* a full snapshot: replaces all the reader knew */
    int n_events;
    kv_prefix_event_t *events; /* (n_events) owned by the batch */
} kv_prefix_batch_t;

/* Moves the pending events into *batch (n_events 0 when none).  After the
 * log overflowed (max_pending) this is a snapshot instead.  The caller
 * owns the batch: kv_prefix_batch_cleanup.  BT_ERR_NO_MEMORY (a snapshot
 * could not be built; *batch empty) leaves the snapshot owed to the next
 * take. */
bt_status_t kv_prefix_events_take(kv_prefix_t *prefix,
                                  kv_prefix_batch_t *batch);

/* A resync batch: CLEARED, then STORED for every cached block (pool,
 * then host tier), numbered
 * after everything logged so far (the pending events it covers are
 * dropped).  For a reader that lost track (gap, restart). */
bt_status_t kv_prefix_snapshot(kv_prefix_t *prefix,
                               kv_prefix_batch_t *batch);

void kv_prefix_batch_cleanup(kv_prefix_batch_t *batch);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_PREFIX_H */
