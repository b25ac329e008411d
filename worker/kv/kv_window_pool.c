/*
 * kv_window_pool.c - allocations made ahead and released later on a
 * thread of their own (kv_window_pool.h).
 *
 * One lock and one condition variable (broadcast: the thread waits for
 * work, a take past the budget waits for the thread's work in flight);
 * make and release never run under the lock.  `held` counts the bytes of
 * every allocation in any state and is what the budget bounds.
 */
#include "kv/kv_window_pool.h"

#include <pthread.h>
#include <time.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

#define WINPOOL_MAX_CLASSES 25   /* takes of up to 2^24 blocks */
#define WINPOOL_IDLE_MS 1000     /* the thread's nap; work wakes it */
#define WINPOOL_TAKE_WAIT_MS 20  /* a take past the budget waits this long
                                    for the thread's make or release */

struct kv_winpool_s {
    kv_winpool_config_t cfg;
    int n_classes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    bool stop;
    kv_winpool_item_t *ready[WINPOOL_MAX_CLASSES]; /* LIFO per class */
    int n_ready[WINPOOL_MAX_CLASSES];
    uint64_t asked[WINPOOL_MAX_CLASSES]; /* tick of its last take; 0 never */
    bool too_big[WINPOOL_MAX_CLASSES];   /* one exceeds the ready budget */
    uint64_t tick;
    uint64_t last_take_ns;      /* when the last take came */
    bool refill_failed;         /* a make failed: none until the next take */
    kv_winpool_item_t *pending, *pending_tail; /* put back: release, FIFO */
    size_t pending_bytes;
    size_t ready_bytes;
    size_t live;
    size_t held;
    size_t claimed;             /* a take's room while it waits or makes */
    size_t headroom;            /* the largest take yet: what the thread
                                   leaves free so that a take made here
                                   need not release ready ones first */
    int thread_busy;            /* an allocation in the thread's hands */
    kv_winpool_stats_t counts;
};

static int class_of(int n_blocks)
{
    int c = 0;

    while (c < WINPOOL_MAX_CLASSES - 1 && (1 << c) < n_blocks)
        c++;
    return c;
}

static int class_blocks(const kv_winpool_t *p, int c)
{
    return BT_MIN(1 << c, p->cfg.max_blocks);
}

static struct timespec deadline_in(int ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void pending_push(kv_winpool_t *p, kv_winpool_item_t *it)
{
    it->next = NULL;
    if (p->pending_tail != NULL)
        p->pending_tail->next = it;
    else
        p->pending = it;
    p->pending_tail = it;
    p->pending_bytes += it->bytes;
}

static kv_winpool_item_t *pending_pop(kv_winpool_t *p)
{
    kv_winpool_item_t *it = p->pending;

    if (it == NULL)
        return NULL;
    p->pending = it->next;
    if (p->pending == NULL)
        p->pending_tail = NULL;
    p->pending_bytes -= it->bytes;
    return it;
}

static kv_winpool_item_t *ready_pop(kv_winpool_t *p, int c)
{
    kv_winpool_item_t *it = p->ready[c];

    if (it == NULL)
        return NULL;
    p->ready[c] = it->next;
    p->n_ready[c]--;
    p->ready_bytes -= it->bytes;
    return it;
}

/* The class with ready allocations asked for least lately, other than
 * `keep`, and only one asked for before `before` (-1: none). */
static int stalest_ready(const kv_winpool_t *p, int keep, uint64_t before)
{
    int best = -1;

    for (int c = 0; c < p->n_classes; c++)
        if (c != keep && p->n_ready[c] > 0 && p->asked[c] < before &&
            (best < 0 || p->asked[c] < p->asked[best]))
            best = c;
    return best;
}

/* The class asked for last that is short of ready allocations (and
 * could have one). */
static int class_to_refill(const kv_winpool_t *p)
{
    int best = -1;

    if (p->refill_failed)
        return -1;
    for (int c = 0; c < p->n_classes; c++)
        if (p->asked[c] != 0 && !p->too_big[c] &&
            p->n_ready[c] < p->cfg.ready_per_class &&
            (best < 0 || p->asked[c] > p->asked[best]))
            best = c;
    return best;
}

/* Releases `it` unlocked; the lock is held on entry and on return. */
static void release_unlocked(kv_winpool_t *p, kv_winpool_item_t *it)
{
    pthread_mutex_unlock(&p->lock);
    p->cfg.release(p->cfg.ctx, it->alloc);
    pthread_mutex_lock(&p->lock);
    p->held -= it->bytes;
    p->counts.released++;
    bt_free(it);
}

/* No take for ready_idle_ms: the device memory of the ready ones goes
 * back (to the rest of the process, or a process beside it on the GPU)
 * and the classes are forgotten until asked for again. */
static bool trim_idle(kv_winpool_t *p)
{
    if (p->cfg.ready_idle_ms <= 0 || p->ready_bytes == 0 ||
        bt_time_ns() - p->last_take_ns <
            (uint64_t)p->cfg.ready_idle_ms * 1000000ull)
        return false;
    for (int c = 0; c < p->n_classes; c++) {
        kv_winpool_item_t *it;
        while ((it = ready_pop(p, c)) != NULL)
            pending_push(p, it);
        p->asked[c] = 0;
    }
    p->headroom = 0;
    return true;
}

/* One step of the thread's work (the lock held).  False: nothing to do. */
static bool thread_step(kv_winpool_t *p)
{
    kv_winpool_item_t *it = pending_pop(p);
    size_t b;
    void *alloc = NULL;
    bt_status_t status;
    int c;

    if (it != NULL) {
        p->thread_busy++;
        release_unlocked(p, it);
        p->thread_busy--;
        return true;
    }
    if (trim_idle(p))
        return true;
    c = class_to_refill(p);
    if (c < 0)
        return false;
    b = p->cfg.bytes(p->cfg.ctx, class_blocks(p, c));
    if (p->ready_bytes + b > p->cfg.ready_budget) {
        /* the ready bytes follow the traffic: a class asked for less
         * lately gives one up */
        int v = stalest_ready(p, c, p->asked[c]);
        if (v < 0)
            return false;
        pending_push(p, ready_pop(p, v));
        return true;
    }
    if (p->held + p->claimed + p->headroom + b > p->cfg.budget)
        return false;
    it = bt_calloc(1, sizeof(*it), "kv_winpool_item");
    if (it == NULL) {
        p->refill_failed = true;
        return false;
    }
    p->held += b;
    p->thread_busy++;
    pthread_mutex_unlock(&p->lock);
    status = p->cfg.make(p->cfg.ctx, class_blocks(p, c), &alloc);
    if (status != BT_OK)
        bt_error_clear(); /* a take will make its own and say why */
    pthread_mutex_lock(&p->lock);
    p->thread_busy--;
    if (status != BT_OK) {
        p->held -= b;
        p->refill_failed = true;
        bt_free(it);
        return true;
    }
    it->alloc = alloc;
    it->n_blocks = class_blocks(p, c);
    it->bytes = b;
    it->made_ahead = true;
    it->next = p->ready[c];
    p->ready[c] = it;
    p->n_ready[c]++;
    p->ready_bytes += b;
    p->counts.made_ahead++;
    return true;
}

static void *winpool_thread(void *arg)
{
    kv_winpool_t *p = arg;

    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        if (thread_step(p)) {
            pthread_cond_broadcast(&p->cond);
            continue;
        }
        struct timespec ts = deadline_in(
            p->cfg.ready_idle_ms > 0
                ? BT_MIN(WINPOOL_IDLE_MS, p->cfg.ready_idle_ms)
                : WINPOOL_IDLE_MS);
        pthread_cond_timedwait(&p->cond, &p->lock, &ts);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

bt_status_t kv_winpool_create(const kv_winpool_config_t *cfg,
                              kv_winpool_t **pool_p)
{
    pthread_condattr_t attr;
    kv_winpool_t *p;

    if (cfg->make == NULL || cfg->release == NULL || cfg->bytes == NULL ||
        cfg->budget == 0 || cfg->max_blocks < 1 || cfg->ready_per_class < 0 ||
        cfg->ready_idle_ms < 0 ||
        cfg->max_blocks > (1 << (WINPOOL_MAX_CLASSES - 1)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "bad window pool config");
    p = bt_calloc(1, sizeof(*p), "kv_winpool");
    if (p == NULL)
        return BT_ERR_NO_MEMORY;
    p->cfg = *cfg;
    p->n_classes = class_of(cfg->max_blocks) + 1;
    /* made ahead it would only push the others out */
    for (int c = 0; c < p->n_classes; c++)
        p->too_big[c] = cfg->bytes(cfg->ctx, class_blocks(p, c)) >
                        cfg->ready_budget;
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&p->thread, NULL, winpool_thread, p) != 0) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        bt_free(p);
        return BT_ERROR(BT_ERR_IO, "KV", "window pool thread");
    }
    *pool_p = p;
    return BT_OK;
}

void kv_winpool_destroy(kv_winpool_t **pool_p)
{
    kv_winpool_t *p = *pool_p;
    kv_winpool_item_t *it;

    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    /* the owner's windows are gone: what is left is ours alone */
    BT_ASSERT(p->live == 0);
    pthread_mutex_lock(&p->lock);
    while ((it = pending_pop(p)) != NULL)
        release_unlocked(p, it);
    for (int c = 0; c < p->n_classes; c++)
        while ((it = ready_pop(p, c)) != NULL)
            release_unlocked(p, it);
    BT_ASSERT(p->held == 0);
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    bt_free(p);
    *pool_p = NULL;
}

bt_status_t kv_winpool_take(kv_winpool_t *p, int n_blocks,
                            kv_winpool_item_t **item_p)
{
    struct timespec until = deadline_in(WINPOOL_TAKE_WAIT_MS);
    kv_winpool_item_t *victims = NULL, *it;
    size_t need, victim_bytes = 0;
    bt_status_t status;
    int c;

    if (n_blocks < 1 || n_blocks > p->cfg.max_blocks)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "window of %d blocks",
                        n_blocks);
    c = class_of(n_blocks);
    need = p->cfg.bytes(p->cfg.ctx, n_blocks);
    if (need > p->cfg.budget) /* never: not a wait (BT_ERR_NO_RESOURCE) */
        return BT_ERROR(BT_ERR_UNSUPPORTED, "KV", "a window of %d blocks "
                        "(%zu MiB) is past the whole budget (%zu MiB)",
                        n_blocks, need >> 20, p->cfg.budget >> 20);
    pthread_mutex_lock(&p->lock);
    p->asked[c] = ++p->tick;
    p->last_take_ns = bt_time_ns();
    p->refill_failed = false;
    p->headroom = BT_MAX(p->headroom, need);
    for (;;) {
        it = ready_pop(p, c);
        if (it != NULL) {
            p->claimed = 0;
            p->live += it->bytes;
            p->counts.taken_ready++;
            pthread_cond_broadcast(&p->cond); /* refill its class */
            pthread_mutex_unlock(&p->lock);
            *item_p = it;
            return BT_OK;
        }
        /* what neither the ready nor the pending ones give back */
        if (p->held - p->ready_bytes - p->pending_bytes + need <=
            p->cfg.budget)
            break;
        /* the thread's make or release in flight may give room; it
         * starts no other make meanwhile (the claim).  Not when the
         * taken ones alone leave none: only the loop's own puts free
         * those, and a grant refused here is asked for again (every
         * 20 ms while the windows are full: waiting would stall the
         * decode loop that often) */
        p->claimed = need;
        if (p->thread_busy == 0 || p->live + need > p->cfg.budget ||
            pthread_cond_timedwait(&p->cond, &p->lock, &until) != 0) {
            p->claimed = 0;
            /* back-pressure, not a failure: the caller asks again (no
             * ERROR line every 20 ms while a loaded receiver is full) */
            BT_LOG_DEBUG("KV", "windows: %zu of %zu MiB taken",
                         p->live >> 20, p->cfg.budget >> 20);
            pthread_mutex_unlock(&p->lock);
            return BT_ERR_NO_RESOURCE;
        }
    }
    /* room first: releasing what is pending, then what is ready asked
     * for least lately (today's cost, on this thread, only when the
     * budget is short) */
    while (p->held - victim_bytes + need > p->cfg.budget) {
        int v = stalest_ready(p, -1, UINT64_MAX);
        BT_ASSERT(p->pending != NULL || v >= 0); /* the check above */
        it = p->pending != NULL ? pending_pop(p) : ready_pop(p, v);
        it->next = victims;
        victims = it;
        victim_bytes += it->bytes;
    }
    p->claimed = need;
    while ((it = victims) != NULL) {
        victims = it->next;
        release_unlocked(p, it);
        p->counts.released_by_take++;
    }
    pthread_mutex_unlock(&p->lock);
    it = bt_calloc(1, sizeof(*it), "kv_winpool_item");
    status = it == NULL ? BT_ERR_NO_MEMORY
                        : p->cfg.make(p->cfg.ctx, n_blocks, &it->alloc);
    pthread_mutex_lock(&p->lock);
    p->claimed = 0;
    if (status == BT_OK) {
        it->n_blocks = n_blocks;
        it->bytes = need;
        p->held += need;
        p->live += need;
        p->counts.taken_made++;
    }
    pthread_cond_broadcast(&p->cond); /* refill the class */
    pthread_mutex_unlock(&p->lock);
    if (status != BT_OK) {
        bt_free(it);
        return status;
    }
    *item_p = it;
    return BT_OK;
}

void kv_winpool_put(kv_winpool_t *p, kv_winpool_item_t **item_p)
{
    kv_winpool_item_t *it = *item_p;

    if (it == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    BT_ASSERT(p->live >= it->bytes);
    p->live -= it->bytes;
    pending_push(p, it);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    *item_p = NULL;
}

void kv_winpool_stats(kv_winpool_t *p, kv_winpool_stats_t *stats)
{
    pthread_mutex_lock(&p->lock);
    *stats = p->counts;
    stats->live = p->live;
    stats->held = p->held;
    stats->ready = p->ready_bytes;
    pthread_mutex_unlock(&p->lock);
}
