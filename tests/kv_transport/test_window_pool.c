/*
 * test_window_pool.c - the window pool (worker/kv/kv_window_pool.h) with
 * fake allocations: heap buffers, each with a generation number and a
 * state (live, taken, released) the fake checks on every call, and the
 * bytes really held at any moment measured by the fake itself.
 *
 *   - the first take of a class makes its allocation on the caller's
 *     thread, for exactly the blocks asked; the thread then makes the
 *     class's ready ones and later takes get them (a larger class too);
 *   - an allocation is taken at most once and never again after it is
 *     put back; a put-back one is released (the callback runs, once);
 *   - the budget bounds every allocation in any state (the fake's peak
 *     never passes it), yet a take succeeds whenever the taken bytes
 *     plus its own fit, as without the pool (ready and pending ones make
 *     room); past that, BT_ERR_NO_RESOURCE; the thread leaves room for
 *     the largest take yet, so such a take releases nothing first;
 *   - the ready bytes follow the traffic: a class asked for lately
 *     takes the room of one asked for earlier; a class too big for the
 *     ready budget is never made ahead and pushes nothing out;
 *   - without takes for ready_idle_ms the ready ones are released, and
 *     nothing is made ahead again until a take asks;
 *   - a take that the taken ones alone leave no room for is refused at
 *     once, even while the thread releases something (that could not
 *     make room; the decode loop asks again, it must not wait);
 *   - a failing make fails the take and leaks nothing;
 *   - destroy releases the ready and pending ones;
 *   - a hammer: this thread takes and puts while the pool's thread makes
 *     and releases, for a bounded time; nothing leaks, nothing is
 *     released twice (the ASan build checks the memory itself).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_window_pool.h"

#define UNIT 100              /* bytes of a block */
#define MAX_GENS 200000
#define WAIT_MS 3000          /* the longest any check waits for the thread */
#define HAMMER_MS 1500

enum { GEN_NONE, GEN_LIVE, GEN_TAKEN, GEN_RELEASED };

typedef struct {
    uint64_t gen;
    int n_blocks;
    unsigned char *mem;       /* the allocation's bytes */
} fake_alloc_t;

typedef struct {
    pthread_mutex_t lock;
    unsigned char state[MAX_GENS];
    uint64_t next_gen;
    size_t held, peak;        /* bytes allocated now, at most */
    int made, released;
    bool fail_here;           /* makes on fail_thread fail */
    pthread_t fail_thread;
    int make_delay_us, release_delay_us; /* random, up to */
    int release_fixed_us;                /* exactly (when > 0) */
} fake_t;

static size_t fake_bytes(void *ctx, int n_blocks)
{
    (void)ctx;
    return (size_t)n_blocks * UNIT;
}

static bt_status_t fake_make(void *ctx, int n_blocks, void **alloc_p)
{
    fake_t *f = ctx;
    fake_alloc_t *a;

    if (f->make_delay_us > 0)
        usleep((useconds_t)(rand() % (f->make_delay_us + 1)));
    pthread_mutex_lock(&f->lock);
    if (f->fail_here && pthread_equal(pthread_self(), f->fail_thread)) {
        pthread_mutex_unlock(&f->lock);
        return BT_ERROR(BT_ERR_CUDA, "TEST", "make refused");
    }
    BT_CHECK(f->next_gen < MAX_GENS);
    a = malloc(sizeof(*a));
    BT_CHECK(a != NULL);
    a->gen = f->next_gen++;
    a->n_blocks = n_blocks;
    a->mem = malloc(fake_bytes(f, n_blocks));
    BT_CHECK(a->mem != NULL);
    memset(a->mem, (int)(a->gen & 0xff), fake_bytes(f, n_blocks));
    f->state[a->gen] = GEN_LIVE;
    f->held += fake_bytes(f, n_blocks);
    if (f->held > f->peak)
        f->peak = f->held;
    f->made++;
    pthread_mutex_unlock(&f->lock);
    *alloc_p = a;
    return BT_OK;
}

static void fake_release(void *ctx, void *alloc)
{
    fake_t *f = ctx;
    fake_alloc_t *a = alloc;

    if (f->release_fixed_us > 0)
        usleep((useconds_t)f->release_fixed_us);
    else if (f->release_delay_us > 0)
        usleep((useconds_t)(rand() % (f->release_delay_us + 1)));
    pthread_mutex_lock(&f->lock);
    if (f->state[a->gen] != GEN_LIVE && f->state[a->gen] != GEN_TAKEN)
        BT_TEST_FAIL("generation %llu released in state %d",
                     (unsigned long long)a->gen, f->state[a->gen]);
    /* its bytes are still the ones it was made with: nobody else had it */
    for (size_t i = 0; i < fake_bytes(f, a->n_blocks); i += 97)
        BT_ASSERT_EQ(a->mem[i], a->gen & 0xff);
    f->state[a->gen] = GEN_RELEASED;
    f->held -= fake_bytes(f, a->n_blocks);
    f->released++;
    pthread_mutex_unlock(&f->lock);
    free(a->mem);
    free(a);
}

static fake_t *fake_new(void)
{
    fake_t *f = calloc(1, sizeof(*f));

    BT_CHECK(f != NULL);
    pthread_mutex_init(&f->lock, NULL);
    return f;
}

static void fake_free(fake_t *f)
{
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* Destroys the pool and checks it released every allocation the fake
 * made (none left held), then frees the fake. */
static void destroy_all_released(fake_t *f, kv_winpool_t **p)
{
    kv_winpool_destroy(p);
    BT_CHECK(*p == NULL);
    BT_ASSERT_EQ(f->released, f->made);
    BT_ASSERT_EQ(f->held, 0);
    fake_free(f);
}

static kv_winpool_config_t config(fake_t *f, size_t budget,
                                  size_t ready_budget, int per_class)
{
    kv_winpool_config_t c = {
        .ctx = f,
        .make = fake_make,
        .release = fake_release,
        .bytes = fake_bytes,
        .max_blocks = 64,
        .budget = budget,
        .ready_budget = ready_budget,
        .ready_per_class = per_class,
    };
    return c;
}

/* Takes n blocks; checks the allocation was never taken before. */
static kv_winpool_item_t *take(fake_t *f, kv_winpool_t *p, int n)
{
    kv_winpool_item_t *it = NULL;
    fake_alloc_t *a;

    BT_ASSERT_OK(kv_winpool_take(p, n, &it));
    BT_CHECK(it != NULL && it->n_blocks >= n);
    BT_ASSERT_EQ(it->bytes, fake_bytes(f, it->n_blocks));
    a = it->alloc;
    pthread_mutex_lock(&f->lock);
    if (f->state[a->gen] != GEN_LIVE)
        BT_TEST_FAIL("generation %llu taken in state %d",
                     (unsigned long long)a->gen, f->state[a->gen]);
    f->state[a->gen] = GEN_TAKEN;
    pthread_mutex_unlock(&f->lock);
    return it;
}

static kv_winpool_stats_t stats(kv_winpool_t *p)
{
    kv_winpool_stats_t s;

    kv_winpool_stats(p, &s);
    return s;
}

/* A counter of the fake, read under its lock (the pool's thread runs). */
static int counted(fake_t *f, const int *counter)
{
    int n;

    pthread_mutex_lock(&f->lock);
    n = *counter;
    pthread_mutex_unlock(&f->lock);
    return n;
}

static int released(fake_t *f)
{
    return counted(f, &f->released);
}

static void fail_makes_here(fake_t *f, bool on)
{
    pthread_mutex_lock(&f->lock);
    f->fail_thread = pthread_self();
    f->fail_here = on;
    pthread_mutex_unlock(&f->lock);
}

/* Polls until the pool's ready bytes are `bytes` (the thread's work). */
static void wait_ready(kv_winpool_t *p, size_t bytes)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    while (stats(p).ready != bytes) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("ready bytes %zu, want %zu", stats(p).ready, bytes);
        usleep(500);
    }
}

static void wait_released(fake_t *f, int n)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    while (released(f) != n) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("released %d, want %d", released(f), n);
        usleep(500);
    }
}

static void test_made_then_ready(void)
{
    fake_t *f = fake_new();
    kv_winpool_config_t c = config(f, 100 * 64 * UNIT, 100 * 64 * UNIT, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a, *b, *d, *e;

    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    /* nothing made before a take asks */
    usleep(20000);
    BT_ASSERT_EQ(counted(f, &f->made), 0);
    /* the first of its class: made here, for exactly what was asked */
    a = take(f, p, 5);
    BT_CHECK(!a->made_ahead);
    BT_ASSERT_EQ(a->n_blocks, 5);
    /* then the class (8) is refilled to two */
    wait_ready(p, 2 * fake_bytes(f, 8));
    b = take(f, p, 6);
    BT_CHECK(b->made_ahead);
    BT_ASSERT_EQ(b->n_blocks, 8);
    d = take(f, p, 8);
    BT_CHECK(d->made_ahead);
    BT_CHECK(d->alloc != b->alloc);
    wait_ready(p, 2 * fake_bytes(f, 8));
    /* only its own class serves a take: a larger one would spend more
     * of the budget than the grant needs */
    e = take(f, p, 1);
    BT_CHECK(!e->made_ahead);
    BT_ASSERT_EQ(e->n_blocks, 1);
    BT_ASSERT_EQ(stats(p).live, fake_bytes(f, 5) + 2 * fake_bytes(f, 8) +
                                    fake_bytes(f, 1));
    /* put back: released by the thread, never taken again (take checks) */
    kv_winpool_put(p, &a);
    kv_winpool_put(p, &b);
    BT_CHECK(a == NULL && b == NULL);
    wait_released(f, 2);
    kv_winpool_put(p, &d);
    kv_winpool_put(p, &e);
    wait_released(f, 4);
    BT_ASSERT_EQ(stats(p).live, 0);
    BT_ASSERT_EQ(stats(p).taken_made, 2);
    BT_ASSERT_EQ(stats(p).taken_ready, 2);
    /* destroy releases the ready ones too */
    destroy_all_released(f, &p);
    BT_TEST_PASS("made_then_ready");
}

static void test_budget(void)
{
    fake_t *f = fake_new();
    size_t budget = 3 * fake_bytes(f, 8);
    kv_winpool_config_t c = config(f, budget, budget, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a, *b, *d, *x = NULL;
    uint64_t by_take;

    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    a = take(f, p, 8);
    /* one ready fits beside the taken one and room for another take of
     * the largest size yet; a second does not */
    wait_ready(p, fake_bytes(f, 8));
    usleep(20000);
    BT_ASSERT_EQ(stats(p).ready, fake_bytes(f, 8));
    b = take(f, p, 8);
    BT_CHECK(b->made_ahead);
    /* the headroom: this one is made at once, nothing released for it */
    d = take(f, p, 8);
    BT_CHECK(!d->made_ahead);
    BT_ASSERT_EQ(stats(p).released_by_take, 0);
    /* full: a take of even one block is refused and changes nothing */
    BT_ASSERT_EQ(kv_winpool_take(p, 1, &x), BT_ERR_NO_RESOURCE);
    bt_error_clear();
    BT_CHECK(x == NULL);
    BT_ASSERT_EQ(stats(p).live, budget);
    /* one put back (pending release, still counted): a take of its size
     * still succeeds at once, as without the pool */
    kv_winpool_put(p, &a);
    a = take(f, p, 8);
    kv_winpool_put(p, &a);
    kv_winpool_put(p, &b);
    kv_winpool_put(p, &d);
    /* released, then two ready again: 8 live beside them is the budget */
    wait_released(f, 4);
    wait_ready(p, 2 * fake_bytes(f, 8));
    a = take(f, p, 8);
    BT_CHECK(a->made_ahead);
    /* a take larger than any yet releases a ready one to fit, here */
    by_take = stats(p).released_by_take;
    b = take(f, p, 16);
    BT_CHECK(!b->made_ahead);
    BT_ASSERT_EQ(stats(p).released_by_take, by_take + 1);
    BT_ASSERT_EQ(stats(p).held, budget);
    kv_winpool_put(p, &a);
    kv_winpool_put(p, &b);
    kv_winpool_destroy(&p);
    BT_ASSERT_EQ(f->released, f->made);
    BT_CHECK(f->peak <= budget);
    fake_free(f);
    BT_TEST_PASS("budget");
}

static void test_full_refuses_at_once(void)
{
    fake_t *f = fake_new();
    size_t budget = 3 * fake_bytes(f, 8);
    kv_winpool_config_t c = config(f, budget, budget, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a, *b, *d, *x = NULL;
    uint64_t t0, took;

    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    a = take(f, p, 8);
    wait_ready(p, fake_bytes(f, 8));
    b = take(f, p, 8);
    d = take(f, p, 8); /* the budget, all taken */
    f->release_fixed_us = 200000;
    kv_winpool_put(p, &d); /* its release holds the thread 200 ms */
    usleep(20000);
    /* 16 + 9 blocks taken would pass 24 whatever the thread frees */
    t0 = bt_time_ns();
    BT_ASSERT_EQ(kv_winpool_take(p, 9, &x), BT_ERR_NO_RESOURCE);
    took = bt_time_ns() - t0;
    bt_error_clear();
    BT_CHECK(x == NULL);
    if (took >= 10000000ull) /* the old wait was 20 ms */
        BT_TEST_FAIL("refused after %.1f ms, not at once", took / 1e6);
    /* once the release ended, one that fits beside the taken ones */
    wait_released(f, 1);
    f->release_fixed_us = 0;
    x = take(f, p, 8);
    kv_winpool_put(p, &x);
    kv_winpool_put(p, &a);
    kv_winpool_put(p, &b);
    destroy_all_released(f, &p);
    BT_TEST_PASS("full_refuses_at_once");
}

static void test_ready_follows_traffic(void)
{
    fake_t *f = fake_new();
    /* room for two ready 8s, or one 8 and two 2s, not more */
    kv_winpool_config_t c = config(f, 100 * 64 * UNIT, 2 * fake_bytes(f, 8),
                                   2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a, *b;

    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    a = take(f, p, 8);
    wait_ready(p, 2 * fake_bytes(f, 8));
    /* 32 blocks never fit the ready budget: made here, nothing moves */
    b = take(f, p, 32);
    BT_CHECK(!b->made_ahead);
    kv_winpool_put(p, &b);
    wait_released(f, 1);
    usleep(20000);
    BT_ASSERT_EQ(stats(p).ready, 2 * fake_bytes(f, 8));
    BT_ASSERT_EQ(released(f), 1);
    b = take(f, p, 2);
    BT_CHECK(!b->made_ahead);
    /* the 2s are asked for now: an 8 gives its room up */
    wait_ready(p, fake_bytes(f, 8) + 2 * fake_bytes(f, 2));
    wait_released(f, 2);
    kv_winpool_put(p, &a);
    kv_winpool_put(p, &b);
    destroy_all_released(f, &p);
    BT_TEST_PASS("ready_follows_traffic");
}

static void test_idle_release(void)
{
    fake_t *f = fake_new();
    kv_winpool_config_t c = config(f, 100 * 64 * UNIT, 100 * 64 * UNIT, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a;

    c.ready_idle_ms = 100;
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    a = take(f, p, 4);
    kv_winpool_put(p, &a);
    wait_ready(p, 2 * fake_bytes(f, 4));
    /* idle: all three released, nothing made again */
    wait_released(f, 3);
    usleep(250000);
    BT_ASSERT_EQ(stats(p).ready, 0);
    BT_ASSERT_EQ(counted(f, &f->made), 3);
    /* asked again: made here, then ahead again */
    a = take(f, p, 4);
    BT_CHECK(!a->made_ahead);
    wait_ready(p, 2 * fake_bytes(f, 4));
    kv_winpool_put(p, &a);
    destroy_all_released(f, &p);
    BT_TEST_PASS("idle_release");
}

static void test_make_fails(void)
{
    fake_t *f = fake_new();
    kv_winpool_config_t c = config(f, 100 * 64 * UNIT, 100 * 64 * UNIT, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *a = NULL;

    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    /* this thread's makes fail, the pool thread's do not */
    fail_makes_here(f, true);
    BT_ASSERT_EQ(kv_winpool_take(p, 3, &a), BT_ERR_CUDA);
    bt_error_clear();
    fail_makes_here(f, false);
    BT_CHECK(a == NULL);
    BT_ASSERT_EQ(stats(p).live, 0);
    /* the thread still refills the class asked for */
    wait_ready(p, 2 * fake_bytes(f, 4));
    a = take(f, p, 3);
    BT_CHECK(a->made_ahead);
    kv_winpool_put(p, &a);
    /* destroy at once: the pending one and the ready ones go too */
    destroy_all_released(f, &p);
    BT_TEST_PASS("make_fails");
}

static void test_hammer(void)
{
    enum { SLOTS = 6 };
    fake_t *f = fake_new();
    size_t budget = 6 * fake_bytes(f, 16);
    kv_winpool_config_t c = config(f, budget, budget / 3, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *slot[SLOTS] = {0};
    uint64_t until = bt_time_ns() + (uint64_t)HAMMER_MS * 1000000ull;
    int takes = 0, refused = 0;
    kv_winpool_stats_t s;

    f->make_delay_us = 200;
    f->release_delay_us = 200;
    srand(42);
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    while (bt_time_ns() < until) {
        int i = rand() % SLOTS;
        if (slot[i] != NULL) {
            kv_winpool_put(p, &slot[i]);
        } else {
            /* a few sizes, as a workload's prompts */
            static const int sizes[] = {1, 3, 7, 12, 16, 16, 30, 40};
            int n = sizes[rand() % 8];
            kv_winpool_item_t *it = NULL;
            bt_status_t st = kv_winpool_take(p, n, &it);
            if (st == BT_OK) {
                fake_alloc_t *a = it->alloc;
                pthread_mutex_lock(&f->lock);
                BT_ASSERT_EQ(f->state[a->gen], GEN_LIVE);
                f->state[a->gen] = GEN_TAKEN;
                pthread_mutex_unlock(&f->lock);
                slot[i] = it;
                takes++;
            } else {
                BT_ASSERT_EQ(st, BT_ERR_NO_RESOURCE);
                bt_error_clear();
                refused++;
            }
        }
        s = stats(p);
        BT_CHECK(s.held <= budget);
        pthread_mutex_lock(&f->lock);
        BT_CHECK(f->held <= budget);
        pthread_mutex_unlock(&f->lock);
        usleep((useconds_t)(rand() % 300));
    }
    for (int i = 0; i < SLOTS; i++)
        kv_winpool_put(p, &slot[i]);
    s = stats(p);
    kv_winpool_destroy(&p);
    fprintf(stderr, "hammer: %d takes (%llu ready, %llu made), %d refused, "
            "%llu made ahead, %d released (%llu by takes), peak %zu of %zu "
            "bytes\n", takes, (unsigned long long)s.taken_ready,
            (unsigned long long)s.taken_made, refused,
            (unsigned long long)s.made_ahead, f->released,
            (unsigned long long)s.released_by_take, f->peak, budget);
    BT_CHECK(takes > 100);
    BT_CHECK(s.taken_ready > 0); /* the thread did make some ahead */
    BT_ASSERT_EQ(f->released, f->made);
    BT_ASSERT_EQ(f->held, 0);
    BT_CHECK(f->peak <= budget);
    fake_free(f);
    BT_TEST_PASS("hammer");
}

static void test_bad_args(void)
{
    fake_t *f = fake_new();
    kv_winpool_config_t c = config(f, 0, 0, 2);
    kv_winpool_t *p = NULL;
    kv_winpool_item_t *it = NULL;

    BT_ASSERT_EQ(kv_winpool_create(&c, &p), BT_ERR_INVALID_ARG);
    c = config(f, 1000 * UNIT, 0, 0);
    c.ready_idle_ms = -1;
    BT_ASSERT_EQ(kv_winpool_create(&c, &p), BT_ERR_INVALID_ARG);
    c = config(f, 1000 * UNIT, 0, 0);
    c.max_blocks = (1 << 24) + 1;
    BT_ASSERT_EQ(kv_winpool_create(&c, &p), BT_ERR_INVALID_ARG);
    c.max_blocks = 1 << 24; /* the largest: a grant's limit */
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    kv_winpool_destroy(&p);
    bt_error_clear();
    c = config(f, 1000 * UNIT, 0, 0);
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    BT_ASSERT_EQ(kv_winpool_take(p, 0, &it), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_winpool_take(p, 65, &it), BT_ERR_INVALID_ARG);
    bt_error_clear();
    kv_winpool_destroy(&p);
    /* past the whole budget: never, so not "no resource" (a wait) */
    c = config(f, 10 * UNIT, 0, 0);
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    BT_ASSERT_EQ(kv_winpool_take(p, 11, &it), BT_ERR_UNSUPPORTED);
    BT_CHECK(it == NULL);
    bt_error_clear();
    kv_winpool_destroy(&p);
    c = config(f, 1000 * UNIT, 0, 0);
    BT_ASSERT_OK(kv_winpool_create(&c, &p));
    /* nothing is made ahead with no ready allocations per class */
    it = take(f, p, 2);
    usleep(20000);
    BT_ASSERT_EQ(counted(f, &f->made), 1);
    kv_winpool_put(p, &it);
    kv_winpool_put(p, &it); /* NULL-safe */
    kv_winpool_destroy(&p);
    kv_winpool_destroy(&p);
    BT_ASSERT_EQ(f->released, 1);
    fake_free(f);
    BT_TEST_PASS("bad_args");
}

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    test_bad_args();
    test_made_then_ready();
    test_budget();
    test_full_refuses_at_once();
    test_ready_follows_traffic();
    test_idle_release();
    test_make_fails();
    test_hammer();
    return 0;
}
