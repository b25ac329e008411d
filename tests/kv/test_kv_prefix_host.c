/* test_kv_prefix_host.c - the prefix cache's host tier (issue 38 item 4):
 * pool evictions spill to host slots and come back on a match with the
 * same bytes, the host tier's own LRU drops for good, salts stay apart in
 * both tiers, failing hooks fail closed, the events keep a set-based
 * reader (the router's index) in step with both tiers, and 10,000
 * random requests leave every block and slot accounted for.
 *
 * The "pool" is a host array the hooks copy from and into, as the cpu
 * backend's backend_kv_save / backend_kv_load do (the cluster test
 * test_prefix_host runs the real backend). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_prefix.h"

enum { WORDS = 4 }; /* a block's "KV": 4 words */

typedef struct {
    kv_allocator_t *alloc;
    kv_prefix_t *prefix;
    uint64_t (*pool)[WORDS];  /* (n_pool) the pool's bytes */
    uint64_t (*host)[WORDS];  /* (n_host) the host tier's */
    int n_pool, n_host;
    int saves, loads;         /* hook calls */
    bool fail_save, fail_load;
} tier_t;

static bt_status_t hook_save(void *arg, int n, const int *blocks,
                             void *const *host)
{
    tier_t *t = arg;

    if (t->fail_save)
        return BT_ERR_IO;
    for (int i = 0; i < n; i++) {
        BT_CHECK(blocks[i] >= 0 && blocks[i] < t->n_pool);
        memcpy(host[i], t->pool[blocks[i]], sizeof(t->pool[0]));
    }
    t->saves += n;
    return BT_OK;
}

static bt_status_t hook_load(void *arg, int n, const int *blocks,
                             void *const *host)
{
    tier_t *t = arg;

    if (t->fail_load)
        return BT_ERR_IO;
    for (int i = 0; i < n; i++) {
        BT_CHECK(blocks[i] >= 0 && blocks[i] < t->n_pool);
        memcpy(t->pool[blocks[i]], host[i], sizeof(t->pool[0]));
    }
    t->loads += n;
    return BT_OK;
}

static void tier_open(tier_t *t, int n_pool, int n_host, int block_size)
{
    kv_prefix_config_t cfg;

    memset(t, 0, sizeof(*t));
    t->n_pool = n_pool;
    t->n_host = n_host;
    t->pool = calloc((size_t)n_pool, sizeof(t->pool[0]));
    t->host = calloc((size_t)BT_MAX(n_host, 1), sizeof(t->host[0]));
    BT_CHECK(t->pool != NULL && t->host != NULL);
    kv_prefix_config_init(&cfg);
    cfg.block_size = block_size;
    cfg.model_id = "test-model";
    cfg.instance = 7;
    cfg.host_blocks = n_host;
    cfg.host_block_bytes = sizeof(t->host[0]);
    cfg.host_mem = t->host;
    cfg.host_save = hook_save;
    cfg.host_load = hook_load;
    cfg.host_arg = t;
    BT_ASSERT_OK(kv_allocator_create(n_pool, &t->alloc));
    BT_ASSERT_OK(kv_prefix_create(&cfg, t->alloc, &t->prefix));
}

static void tier_close(tier_t *t)
{
    BT_CHECK(kv_prefix_check(t->prefix));
    kv_prefix_destroy(&t->prefix);
    BT_ASSERT_EQ(kv_allocator_free_count(t->alloc),
                 kv_allocator_total(t->alloc));
    kv_allocator_destroy(&t->alloc);
    free(t->pool);
    free(t->host);
}

/* What a block computed from tokens[0..end) under `salt` holds. */
static uint64_t content_of(int salt, const int *tok, int end)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)salt;

    for (int i = 0; i < end; i++)
        h = (h ^ (uint64_t)(uint32_t)tok[i]) * 1099511628211ULL;
    return h;
}

static void compute(tier_t *t, int id, uint64_t c)
{
    for (int w = 0; w < WORDS; w++)
        t->pool[id][w] = c ^ ((uint64_t)w << 56);
}

static bool holds(const tier_t *t, int id, uint64_t c)
{
    for (int w = 0; w < WORDS; w++)
        if (t->pool[id][w] != (c ^ ((uint64_t)w << 56)))
            return false;
    return true;
}

/* A request as a worker runs it (match, alloc the rest, compute the new
 * blocks, insert); ids must hold the whole table.  Returns the hit, or
 * -1 when the pool cannot hold it (nothing held then). */
static int request(tier_t *t, bt_blockhash_t root, int salt, const int *tok,
                   int n, int bs, int *ids, int *n_ids)
{
    int hit = kv_prefix_match(t->prefix, root, tok, n, (n - 1) / bs, ids);
    int need = BT_DIV_UP(n, bs);

    for (int k = 0; k < hit; k++)
        if (!holds(t, ids[k], content_of(salt, tok, (k + 1) * bs)))
            BT_TEST_FAIL("hit block %d (id %d) holds other bytes", k,
                         ids[k]);
    if (kv_prefix_alloc(t->prefix, need - hit, ids + hit) != BT_OK) {
        kv_prefix_release(t->prefix, hit, ids);
        return -1;
    }
    for (int k = hit; k < need; k++) /* the last one may be partial */
        compute(t, ids[k], content_of(salt, tok, BT_MIN((k + 1) * bs, n)));
    kv_prefix_insert(t->prefix, root, tok, n, ids);
    *n_ids = need;
    return hit;
}

static void fill(int *tok, int n, int seed)
{
    for (int i = 0; i < n; i++)
        tok[i] = seed * 1000 + i;
}

// ----------------------------------------------------------------------------
// a set-based event reader, as router_kvindex.c applies events

typedef struct {
    uint64_t h[512];
    int n;
} hset_t;

static int hset_find(const hset_t *s, uint64_t h)
{
    for (int i = 0; i < s->n; i++)
        if (s->h[i] == h)
            return i;
    return -1;
}

static void hset_apply(hset_t *s, const kv_prefix_batch_t *b, int *tier1)
{
    if (b->resync)
        s->n = 0;
    for (int i = 0; i < b->n_events; i++) {
        const kv_prefix_event_t *e = &b->events[i];

        if (e->type == KV_PREFIX_EV_CLEARED) {
            s->n = 0;
            continue;
        }
        if (tier1 != NULL && e->tier == 1)
            (*tier1)++;
        for (int k = 0; k < e->n_hashes; k++) {
            int at = hset_find(s, e->hashes[k]);

            if (e->type == KV_PREFIX_EV_EVICTED && at >= 0)
                s->h[at] = s->h[--s->n];
            else if (e->type == KV_PREFIX_EV_STORED && at < 0) {
                BT_CHECK(s->n < (int)BT_ARRAY_SIZE(s->h));
                s->h[s->n++] = e->hashes[k];
            }
        }
    }
}

static void hset_drain(hset_t *s, kv_prefix_t *prefix, int *tier1)
{
    kv_prefix_batch_t b;

    BT_ASSERT_OK(kv_prefix_events_take(prefix, &b));
    hset_apply(s, &b, tier1);
    kv_prefix_batch_cleanup(&b);
}

// ----------------------------------------------------------------------------

/* Pool of 4 blocks, host tier of 8: A's three cached blocks are pushed to
 * the host by B, an other salt does not reach them, A comes back with
 * its bytes, and the reader's set counts A cached all along. */
static void test_spill_and_back(void)
{
    enum { BS = 4 };
    tier_t t;
    int a[13], b[13], ids[4], n_ids, hit, tier1 = 0;
    bt_blockhash_t root, other;
    kv_prefix_stats_t st;
    hset_t set = { .n = 0 };

    tier_open(&t, 4, 8, BS);
    root = kv_prefix_root(t.prefix, "", 0);
    other = kv_prefix_root(t.prefix, "tenant-b", 8);
    fill(a, 13, 1);
    fill(b, 13, 2);
    BT_ASSERT_EQ(request(&t, root, 0, a, 13, BS, ids, &n_ids), 0);
    kv_prefix_release(t.prefix, n_ids, ids);
    hset_drain(&set, t.prefix, NULL);
    BT_ASSERT_EQ(set.n, 3);
    /* B needs the whole pool: A's three blocks spill */
    BT_ASSERT_EQ(request(&t, root, 0, b, 13, BS, ids, &n_ids), 0);
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_saves, 3);
    BT_ASSERT_EQ(st.host_cached, 3);
    BT_ASSERT_EQ(st.evictions, 3);
    BT_ASSERT_EQ(st.cached_blocks, 3);
    BT_ASSERT_EQ(t.saves, 3);
    BT_CHECK(kv_prefix_check(t.prefix));
    hset_drain(&set, t.prefix, &tier1);
    BT_ASSERT_EQ(set.n, 6); /* A (host) + B (pool) */
    BT_CHECK(tier1 > 0);
    kv_prefix_release(t.prefix, n_ids, ids);
    /* the same tokens under another salt: no hit in either tier */
    hit = kv_prefix_match(t.prefix, other, a, 13, 3, ids);
    BT_ASSERT_EQ(hit, 0);
    BT_ASSERT_EQ(t.loads, 0);
    /* A again: its blocks come back from the host, B's spill */
    for (int w = 0; w < 4; w++)
        compute(&t, w, 0xdeadULL); /* the pool forgets A's bytes */
    BT_ASSERT_EQ(request(&t, root, 0, a, 13, BS, ids, &n_ids), 3);
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_loads, 3);
    BT_ASSERT_EQ(t.loads, 3);
    BT_ASSERT_EQ(st.hit_blocks, 3);
    BT_ASSERT_EQ(st.cached_blocks, 3);
    BT_ASSERT_EQ(st.host_cached, 3); /* B's three, spilled */
    BT_CHECK(kv_prefix_check(t.prefix));
    hset_drain(&set, t.prefix, NULL);
    BT_ASSERT_EQ(set.n, 6);
    kv_prefix_release(t.prefix, n_ids, ids);
    /* a snapshot names both tiers */
    {
        kv_prefix_batch_t snap;
        int stored[2] = { 0, 0 };

        BT_ASSERT_OK(kv_prefix_snapshot(t.prefix, &snap));
        for (int i = 0; i < snap.n_events; i++)
            if (snap.events[i].type == KV_PREFIX_EV_STORED)
                stored[snap.events[i].tier] += snap.events[i].n_hashes;
        BT_ASSERT_EQ(stored[0], 3);
        BT_ASSERT_EQ(stored[1], 3);
        hset_apply(&set, &snap, NULL);
        BT_ASSERT_EQ(set.n, 6);
        kv_prefix_batch_cleanup(&snap);
    }
    kv_prefix_clear(t.prefix);
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_cached + st.cached_blocks, 0);
    tier_close(&t);
    BT_TEST_PASS("pool evictions spill to the host and come back with "
                 "their bytes; other salts miss; events keep the set");
}

/* Host tier of 2: the host LRU drops its oldest for good. */
static void test_host_lru(void)
{
    enum { BS = 4 };
    tier_t t;
    int tok[4][9], ids[3], n_ids;
    bt_blockhash_t root;
    kv_prefix_stats_t st;

    tier_open(&t, 3, 2, BS);
    root = kv_prefix_root(t.prefix, "", 0);
    for (int r = 0; r < 4; r++) {
        fill(tok[r], 9, 10 + r); /* two full blocks + one token */
        BT_ASSERT_EQ(request(&t, root, 0, tok[r], 9, BS, ids, &n_ids), 0);
        kv_prefix_release(t.prefix, n_ids, ids);
        BT_CHECK(kv_prefix_check(t.prefix));
    }
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_cached, 2);
    BT_CHECK(st.host_evictions > 0);
    BT_ASSERT_EQ(st.host_saves, st.host_evictions + 2);
    /* the first request's blocks are gone from both tiers */
    BT_ASSERT_EQ(kv_prefix_match(t.prefix, root, tok[0], 9, 2, ids), 0);
    /* the last is in the pool */
    BT_ASSERT_EQ(request(&t, root, 0, tok[3], 9, BS, ids, &n_ids), 2);
    kv_prefix_release(t.prefix, n_ids, ids);
    tier_close(&t);
    BT_TEST_PASS("the host tier evicts its least recently used for good");
}

/* A failing save drops the block; a failing load drops the host copy and
 * the request computes it: no wrong bytes, nothing leaked. */
static void test_failing_hooks(void)
{
    enum { BS = 4 };
    tier_t t;
    int a[9], b[9], ids[3], n_ids;
    bt_blockhash_t root;
    kv_prefix_stats_t st;

    tier_open(&t, 3, 4, BS);
    root = kv_prefix_root(t.prefix, "", 0);
    fill(a, 9, 1);
    fill(b, 9, 2);
    BT_ASSERT_EQ(request(&t, root, 0, a, 9, BS, ids, &n_ids), 0);
    kv_prefix_release(t.prefix, n_ids, ids);
    t.fail_save = true;
    BT_ASSERT_EQ(request(&t, root, 0, b, 9, BS, ids, &n_ids), 0);
    kv_prefix_release(t.prefix, n_ids, ids);
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_cached, 0);
    BT_CHECK(kv_prefix_check(t.prefix));
    t.fail_save = false;
    BT_ASSERT_EQ(request(&t, root, 0, a, 9, BS, ids, &n_ids), 0);
    kv_prefix_release(t.prefix, n_ids, ids); /* b spilled now */
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(st.host_cached, 2);
    t.fail_load = true;
    BT_ASSERT_EQ(request(&t, root, 0, b, 9, BS, ids, &n_ids), 0);
    kv_prefix_release(t.prefix, n_ids, ids);
    BT_CHECK(kv_prefix_check(t.prefix));
    t.fail_load = false;
    tier_close(&t);
    BT_TEST_PASS("failing save / load hooks fail closed");
}

// ----------------------------------------------------------------------------
// randomized: 10,000 requests over two tiers, every block accounted for

static uint32_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

typedef struct {
    int ids[32];
    int n_ids;
} live_t;

static void test_random_leak(void)
{
    enum { BS = 4, POOL = 40, HOST = 64, MAX_LIVE = 4, REQS = 10000,
           BASES = 6 };
    tier_t t;
    bt_blockhash_t roots[3];
    live_t live[MAX_LIVE];
    int n_live = 0, done = 0, refused = 0;
    uint64_t rng = 99;
    int bases[BASES][64];
    kv_prefix_stats_t st;
    hset_t set = { .n = 0 };

    tier_open(&t, POOL, HOST, BS);
    for (int s = 0; s < 3; s++) {
        char salt[16];

        snprintf(salt, sizeof(salt), "t%d", s);
        roots[s] = kv_prefix_root(t.prefix, salt, strlen(salt));
    }
    for (int b = 0; b < BASES; b++)
        for (int i = 0; i < 64; i++)
            bases[b][i] = (int)(rng_next(&rng) % 50);
    while (done < REQS) {
        int tok[96];
        int salt = (int)(rng_next(&rng) % 3);
        int base = (int)(rng_next(&rng) % BASES);
        int keep = (int)(rng_next(&rng) % 64);
        int n = 1 + keep + (int)(rng_next(&rng) % 16);
        live_t *l;

        while (n_live > 0 &&
               (n_live == MAX_LIVE || rng_next(&rng) % 3 == 0)) {
            int k = (int)(rng_next(&rng) % (unsigned)n_live);

            kv_prefix_release(t.prefix, live[k].n_ids, live[k].ids);
            live[k] = live[--n_live];
            done++;
        }
        memcpy(tok, bases[base], 64 * sizeof(int));
        for (int i = keep; i < n; i++)
            tok[i] = (int)(rng_next(&rng) % 50);
        l = &live[n_live];
        if (request(&t, roots[salt], salt, tok, n, BS, l->ids, &l->n_ids) <
            0) {
            refused++;
            done++;
            continue;
        }
        n_live++;
        if (done % 97 == 0)
            BT_CHECK(kv_prefix_check(t.prefix));
        if (done % 13 == 0)
            hset_drain(&set, t.prefix, NULL);
    }
    while (n_live > 0) {
        n_live--;
        kv_prefix_release(t.prefix, live[n_live].n_ids, live[n_live].ids);
    }
    BT_CHECK(kv_prefix_check(t.prefix));
    kv_prefix_stats(t.prefix, &st);
    BT_ASSERT_EQ(kv_allocator_free_list_count(t.alloc) + st.cached_unused,
                 POOL);
    BT_ASSERT_EQ(st.cached_unused, st.cached_blocks);
    BT_CHECK(st.host_saves > 0 && st.host_loads > 0 &&
             st.host_evictions > 0);
    BT_ASSERT_EQ((uint64_t)t.saves, st.host_saves);
    BT_ASSERT_EQ((uint64_t)t.loads, st.host_loads);
    /* every spill is in the host, came back, or was dropped */
    BT_ASSERT_EQ(st.host_saves,
                 st.host_loads + st.host_evictions + (uint64_t)st.host_cached);
    /* the reader's set is exactly what both tiers hold */
    hset_drain(&set, t.prefix, NULL);
    BT_ASSERT_EQ(set.n, st.cached_blocks + st.host_cached);
    fprintf(stderr, "host_random_leak: requests:%d refused:%d hit_blocks:%llu "
            "lookup_blocks:%llu host_saves:%llu host_loads:%llu "
            "host_evictions:%llu pool_cached:%d host_cached:%d\n", REQS,
            refused, (unsigned long long)st.hit_blocks,
            (unsigned long long)st.lookup_blocks,
            (unsigned long long)st.host_saves,
            (unsigned long long)st.host_loads,
            (unsigned long long)st.host_evictions, st.cached_blocks,
            st.host_cached);
    tier_close(&t);
    BT_TEST_PASS("10,000 random requests over two tiers: every block and "
                 "host slot accounted for, every hit's bytes right");
}

static void test_bad_config(void)
{
    kv_prefix_config_t cfg;
    kv_allocator_t *alloc;
    kv_prefix_t *p = NULL;

    BT_ASSERT_OK(kv_allocator_create(4, &alloc));
    kv_prefix_config_init(&cfg);
    cfg.host_blocks = 4; /* no memory, no hooks */
    BT_ASSERT_EQ(kv_prefix_create(&cfg, alloc, &p), BT_ERR_INVALID_ARG);
    BT_CHECK(p == NULL);
    cfg.host_blocks = -1;
    BT_ASSERT_EQ(kv_prefix_create(&cfg, alloc, &p), BT_ERR_INVALID_ARG);
    kv_allocator_destroy(&alloc);
    BT_TEST_PASS("a host tier without memory or hooks is refused");
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    bt_log_init("test");
    test_bad_config();
    test_spill_and_back();
    test_host_lru();
    test_failing_hooks();
    test_random_leak();
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
