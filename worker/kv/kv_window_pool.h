/*
 * kv_window_pool.h - allocations for KV windows made ahead of their
 * grants and released after them on a thread of the pool's own, so that
 * the loop that grants them does neither (the CUDA IPC link's windows,
 * kv_transport_cuda_ipc.c: ~1.1 ms to make one, ~1.0 ms to release it).
 * Allocations are opaque to the pool: the owner's callbacks make and
 * release them, so the pool knows nothing of CUDA and is tested with
 * plain memory.
 *
 * What makes it fit a security boundary (docs/SECURITY.md 5):
 *   - an allocation is taken at most once, and one put back is only ever
 *     released, never taken again: a writer that mapped it for an ended
 *     grant may still hold that mapping;
 *   - every allocation the pool knows of counts against the budget,
 *     whatever its state: taken, ready, being made, waiting for release
 *     or being released; neither thread makes one past the budget.
 * What the owner does with a taken allocation (hand it to a writer,
 * revoke that) is its own business, on its own thread.
 *
 * Sizes come in classes: an allocation for n blocks is made for n
 * rounded up to a power of two (at most max_blocks), so that one ready
 * allocation serves every grant of its class.  A take for n blocks gets
 * a ready allocation of n's class (never a larger class: that would
 * spend more of the budget than rounding does, under 2x), else one made
 * now for exactly n on the caller's thread (as without the pool); either
 * way the thread then refills
 * n's class up to ready_per_class, the ready bytes staying within
 * ready_budget (a class not asked for lately gives its ready ones up
 * first) and leaving room for the largest take yet beside them; after
 * ready_idle_ms without a take they are released.  Past
 * the budget, the take first releases ready and pending allocations
 * itself, then waits a little for the thread's own work in flight, and
 * only then says BT_ERR_NO_RESOURCE: as many bytes can be taken as
 * without the pool (at once when the taken ones alone leave no room:
 * the thread cannot free those, and the loop must not wait).  A take
 * past the whole budget can never be served: BT_ERR_UNSUPPORTED, not
 * BT_ERR_NO_RESOURCE (which the decode worker answers with "wait").
 *
 * Threading: take, put and stats from any one thread at a time (the
 * loop); make and release run on the pool's thread, or on the caller's
 * in a take, never under the pool's lock.
 */
#ifndef BT_WORKER_KV_KV_WINDOW_POOL_H
#define BT_WORKER_KV_KV_WINDOW_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *ctx;                /* the callbacks' */
    /* Makes an allocation of bytes(ctx, n_blocks) bytes. */
    bt_status_t (*make)(void *ctx, int n_blocks, void **alloc_p);
    /* Releases one (it is gone when this returns). */
    void (*release)(void *ctx, void *alloc);
    /* Bytes of an allocation for n_blocks; non-decreasing in n_blocks. */
    size_t (*bytes)(void *ctx, int n_blocks);
    int max_blocks;           /* the largest take */
    size_t budget;            /* every allocation the pool knows of */
    size_t ready_budget;      /* the ready ones (made ahead) */
    int ready_per_class;      /* 0: nothing made ahead */
    int ready_idle_ms;        /* no take this long: the ready ones are
                                 released (0: kept) */
} kv_winpool_config_t;

/* A taken allocation.  Read-only for its taker, who puts it back. */
typedef struct kv_winpool_item_s {
    void *alloc;              /* make's */
    int n_blocks;             /* what it was made for: >= the take's */
    size_t bytes;             /* bytes(n_blocks) */
    bool made_ahead;          /* came ready: the take made nothing */
    struct kv_winpool_item_s *next; /* the pool's lists */
} kv_winpool_item_t;

typedef struct {
    size_t live;              /* bytes taken and not put back */
    size_t held;              /* bytes of every allocation in any state */
    size_t ready;             /* bytes ready */
    uint64_t taken_ready;     /* takes served ready */
    uint64_t taken_made;      /* takes that made theirs */
    uint64_t made_ahead;      /* allocations the thread made */
    uint64_t released;        /* allocations released (either thread) */
    uint64_t released_by_take; /* of which by a take, to make room */
} kv_winpool_stats_t;

typedef struct kv_winpool_s kv_winpool_t;

/* Starts the pool's thread (it makes nothing until a take asks).
 * BT_ERR_INVALID_ARG for a config without callbacks or budget, or with
 * max_blocks outside 1..2^24. */
bt_status_t kv_winpool_create(const kv_winpool_config_t *cfg,
                              kv_winpool_t **pool_p);

/* Stops the thread (after the allocation in its hands) and releases the
 * ready and pending allocations.  Every taken one must have been put
 * back (asserted).  NULL-safe. */
void kv_winpool_destroy(kv_winpool_t **pool_p);

/* An allocation for n_blocks (1..max_blocks) that nobody else has had.
 * BT_ERR_NO_RESOURCE past the budget, BT_ERR_INVALID_ARG, or make's
 * error. */
bt_status_t kv_winpool_take(kv_winpool_t *pool, int n_blocks,
                            kv_winpool_item_t **item_p);

/* Gives a taken allocation back for release on the pool's thread; it is
 * never taken again.  NULL-safe; *item_p becomes NULL. */
void kv_winpool_put(kv_winpool_t *pool, kv_winpool_item_t **item_p);

void kv_winpool_stats(kv_winpool_t *pool, kv_winpool_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_WINDOW_POOL_H */
