/* test_kv_prefix.c - worker/kv/kv_prefix: match / insert / release /
 * reuse, LRU eviction order, eviction in a pool a few blocks larger than
 * one request, partial blocks never shared, salts never sharing, shared
 * prefixes' refcounts, the event log, a 10,000-request randomized leak
 * check that also checks every hit's content, and a micro-benchmark of
 * match + insert per block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_prefix.h"

typedef struct {
    kv_allocator_t *alloc;
    kv_prefix_t *prefix;
} pool_t;

static void pool_open(pool_t *p, int n_blocks, int block_size)
{
    kv_prefix_config_t cfg;

    kv_prefix_config_init(&cfg);
    cfg.block_size = block_size;
    cfg.model_id = "test-model";
    cfg.kv_dtype = "f32";
    cfg.instance = 42;
    BT_ASSERT_OK(kv_allocator_create(n_blocks, &p->alloc));
    BT_ASSERT_OK(kv_prefix_create(&cfg, p->alloc, &p->prefix));
}

static void pool_close(pool_t *p)
{
    BT_CHECK(kv_prefix_check(p->prefix));
    kv_prefix_destroy(&p->prefix);
    BT_CHECK(p->prefix == NULL);
    /* The cache's references are gone with it: every block is free. */
    BT_ASSERT_EQ(kv_allocator_free_count(p->alloc),
                 kv_allocator_total(p->alloc));
    kv_allocator_destroy(&p->alloc);
}

/* One request as a worker runs it: reuse the cached prefix (leaving at
 * least one prompt token to compute), allocate the rest, compute, insert.
 * Returns the number of blocks in ids (the caller releases them), or -1
 * when the pool cannot hold it. */
static int run_prompt(pool_t *p, bt_blockhash_t root, const int *tokens,
                      int n, int bs, int *ids, int *hit_p)
{
    int hit = kv_prefix_match(p->prefix, root, tokens, n, (n - 1) / bs, ids);
    int need = BT_DIV_UP(n, bs);

    if (kv_prefix_alloc(p->prefix, need - hit, ids + hit) != BT_OK) {
        kv_prefix_release(p->prefix, hit, ids);
        return -1;
    }
    kv_prefix_insert(p->prefix, root, tokens, n, ids);
    if (hit_p != NULL)
        *hit_p = hit;
    return need;
}

static void fill(int *t, int n, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = seed * 1000 + i;
}

// ----------------------------------------------------------------------------

static void test_basic(void)
{
    pool_t p;
    kv_prefix_config_t bad;
    kv_prefix_t *none = NULL;
    kv_prefix_stats_t st;
    bt_blockhash_t root;
    int t[10], a[3], b[3], big[16];
    int hit;

    pool_open(&p, 16, 4);
    kv_prefix_config_init(&bad);
    bad.block_size = 0;
    BT_ASSERT_EQ(kv_prefix_create(&bad, p.alloc, &none), BT_ERR_INVALID_ARG);
    BT_CHECK(none == NULL);
    root = kv_prefix_root(p.prefix, "", 0);
    fill(t, 10, 1);

    /* First request: nothing cached; 2 full blocks + 1 partial. */
    BT_ASSERT_EQ(run_prompt(&p, root, t, 10, 4, a, &hit), 3);
    BT_ASSERT_EQ(hit, 0);
    BT_CHECK(kv_prefix_is_cached(p.prefix, a[0]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, a[1]));
    BT_CHECK(!kv_prefix_is_cached(p.prefix, a[2])); /* partial */
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, a[0]), 2); /* seq + cache */
    kv_prefix_release(p.prefix, 3, a);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, a[0]), 1); /* cache only */
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc), 14);
    /* the pool offers the evictable blocks as free to its other users */
    BT_ASSERT_EQ(kv_allocator_free_count(p.alloc), 16);
    BT_ASSERT_EQ(kv_prefix_available(p.prefix), 16);
    BT_CHECK(kv_prefix_check(p.prefix));

    /* Same prompt again: both full blocks reused, same ids. */
    BT_ASSERT_EQ(run_prompt(&p, root, t, 10, 4, b, &hit), 3);
    BT_ASSERT_EQ(hit, 2);
    BT_ASSERT_EQ(b[0], a[0]);
    BT_ASSERT_EQ(b[1], a[1]);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, b[0]), 2);
    BT_CHECK(kv_prefix_check(p.prefix));
    kv_prefix_release(p.prefix, 3, b);

    /* The cap: a prompt of exactly 8 tokens reuses only block 0 when one
     * token must be computed ((8 - 1) / 4 = 1). */
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 8, 1, b), 1);
    kv_prefix_release(p.prefix, 1, b);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 8, 2, b), 2);
    kv_prefix_release(p.prefix, 2, b);

    kv_prefix_stats(p.prefix, &st);
    BT_ASSERT_EQ(st.lookups, 4);
    BT_ASSERT_EQ(st.hit_blocks, 2 + 1 + 2);
    BT_ASSERT_EQ(st.hit_tokens, 4 * (2 + 1 + 2));
    BT_ASSERT_EQ(st.lookup_tokens, 10 + 10 + 8 + 8);
    BT_ASSERT_EQ(st.inserted, 2);
    BT_ASSERT_EQ(st.cached_blocks, 2);
    BT_ASSERT_EQ(st.cached_unused, 2);
    BT_ASSERT_EQ(st.evictions, 0);

    /* One cache per pool. */
    {
        kv_prefix_config_t again;

        kv_prefix_config_init(&again);
        BT_ASSERT_EQ(kv_prefix_create(&again, p.alloc, &none),
                     BT_ERR_INVALID_ARG);
        BT_CHECK(none == NULL);
    }
    /* The pool's own calls go through the cache too (what the engine and
     * the workers use): alloc evicts, release queues. */
    BT_ASSERT_OK(kv_allocator_alloc(p.alloc, 15, big));
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 10, 2, b), 1);
    kv_allocator_release(p.alloc, 1, b);
    BT_CHECK(kv_prefix_check(p.prefix));
    kv_allocator_release(p.alloc, 15, big);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 10, 2, b), 1);
    kv_allocator_release(p.alloc, 1, b);
    BT_ASSERT_EQ(kv_allocator_free_count(p.alloc), 16);
    BT_CHECK(kv_prefix_check(p.prefix));

    /* Clear: the blocks return to the free list. */
    kv_prefix_clear(p.prefix);
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc), 16);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 10, 2, b), 0);
    pool_close(&p);
    BT_TEST_PASS("basic: match, insert, release, reuse, clear");
}

static void test_partial_never_shared(void)
{
    pool_t p;
    bt_blockhash_t root;
    int t[8], u[8], ids[2];

    pool_open(&p, 8, 4);
    root = kv_prefix_root(p.prefix, "", 0);
    fill(t, 8, 2);
    /* A 7-token sequence: block 1 holds 3 tokens, never inserted, even
     * after it finishes. */
    BT_ASSERT_EQ(run_prompt(&p, root, t, 7, 4, ids, NULL), 2);
    BT_CHECK(!kv_prefix_is_cached(p.prefix, ids[1]));
    kv_prefix_release(p.prefix, 2, ids);
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc), 7);
    /* An 8-token prompt sharing those 7 tokens finds block 0 only. */
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, t, 8, 2, ids), 1);
    kv_prefix_release(p.prefix, 1, ids);
    /* Differing in the first block: nothing. */
    memcpy(u, t, sizeof(u));
    u[3]++;
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, u, 8, 2, ids), 0);
    pool_close(&p);
    BT_TEST_PASS("partial last blocks are never shared");
}

static void test_salts(void)
{
    pool_t p;
    bt_blockhash_t r1, r2;
    int t[16], a[4], b[4];
    int hit;
    kv_prefix_stats_t st;

    pool_open(&p, 16, 4);
    r1 = kv_prefix_root(p.prefix, "tenant-a", 8);
    r2 = kv_prefix_root(p.prefix, "tenant-b", 8);
    BT_CHECK(!bt_blockhash_eq(r1, r2));
    BT_CHECK(!bt_blockhash_eq(r1, kv_prefix_root(p.prefix, "", 0)));
    fill(t, 16, 3);
    /* Same prompt, two salts: two computations, two sets of blocks. */
    BT_ASSERT_EQ(run_prompt(&p, r1, t, 16, 4, a, &hit), 4);
    BT_ASSERT_EQ(hit, 0);
    BT_ASSERT_EQ(run_prompt(&p, r2, t, 16, 4, b, &hit), 4);
    BT_ASSERT_EQ(hit, 0);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            BT_ASSERT_NE(a[i], b[j]);
    kv_prefix_release(p.prefix, 4, a);
    kv_prefix_release(p.prefix, 4, b);
    kv_prefix_stats(p.prefix, &st);
    BT_ASSERT_EQ(st.cached_blocks, 8);
    /* Each salt finds only its own blocks. */
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, r1, t, 16, 4, a), 4);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, r2, t, 16, 4, b), 4);
    for (int i = 0; i < 4; i++)
        BT_ASSERT_NE(a[i], b[i]);
    kv_prefix_release(p.prefix, 4, a);
    kv_prefix_release(p.prefix, 4, b);
    pool_close(&p);
    BT_TEST_PASS("two salts: two computations, never a shared block");
}

static void test_lru_order(void)
{
    pool_t p;
    bt_blockhash_t root;
    int ta[4], tb[4], tc[4];
    int a[2], b[2], c[2], x[4], y[8];
    kv_prefix_stats_t st;

    pool_open(&p, 8, 2);
    root = kv_prefix_root(p.prefix, "", 0);
    fill(ta, 4, 10);
    fill(tb, 4, 11);
    fill(tc, 4, 12);
    /* 4 tokens = 2 full blocks each, all inserted. */
    BT_ASSERT_EQ(run_prompt(&p, root, ta, 4, 2, a, NULL), 2);
    BT_ASSERT_EQ(run_prompt(&p, root, tb, 4, 2, b, NULL), 2);
    BT_ASSERT_EQ(run_prompt(&p, root, tc, 4, 2, c, NULL), 2);
    kv_prefix_release(p.prefix, 2, a);
    kv_prefix_release(p.prefix, 2, b);
    kv_prefix_release(p.prefix, 2, c);
    /* Use A again: it becomes the most recent. LRU: B, C, A. */
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, ta, 4, 2, x), 2);
    kv_prefix_release(p.prefix, 2, x);
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc), 2);

    /* 3 blocks: 2 free + 1 evicted, B's last block (a sequence's tail
     * goes first). */
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 3, x));
    BT_CHECK(!kv_prefix_is_cached(p.prefix, b[1]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, b[0]));
    BT_CHECK(kv_prefix_check(p.prefix));
    kv_prefix_release(p.prefix, 3, x);
    /* 4 blocks: 3 free + B's first block; C and A stay. */
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 4, x));
    BT_CHECK(!kv_prefix_is_cached(p.prefix, b[0]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, c[1]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, c[0]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, a[0]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, a[1]));
    /* All or nothing: 5 more with 4 evictable is refused, nothing
     * evicted. */
    BT_ASSERT_EQ(kv_prefix_alloc(p.prefix, 5, y), BT_ERR_NO_RESOURCE);
    BT_CHECK(kv_prefix_is_cached(p.prefix, c[0]));
    kv_prefix_stats(p.prefix, &st);
    BT_ASSERT_EQ(st.evictions, 2);
    kv_prefix_release(p.prefix, 4, x);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, ta, 4, 2, x), 2);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, tc, 4, 2, x + 2), 2);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, tb, 4, 2, x + 4), 0);
    kv_prefix_release(p.prefix, 4, x);
    pool_close(&p);
    BT_TEST_PASS("LRU eviction order (least recent first, tail first)");
}

static void test_tight_pool(void)
{
    enum { BS = 4, REQ = 8, POOL = REQ + 3, N = 50 };
    pool_t p;
    bt_blockhash_t root;
    int t[REQ * BS], ids[REQ];
    int hit;
    kv_prefix_stats_t st;

    pool_open(&p, POOL, BS);
    root = kv_prefix_root(p.prefix, "", 0);
    for (int r = 0; r < N; r++) {
        /* distinct prompts of 8 full blocks in a pool of 11: every one
         * evicts most of the one before */
        fill(t, REQ * BS, 100 + r);
        BT_ASSERT_EQ(run_prompt(&p, root, t, REQ * BS, BS, ids, &hit), REQ);
        BT_ASSERT_EQ(hit, 0);
        kv_prefix_release(p.prefix, REQ, ids);
        BT_CHECK(kv_prefix_check(p.prefix));
        /* the same prompt right after: all but the last block reused */
        BT_ASSERT_EQ(run_prompt(&p, root, t, REQ * BS, BS, ids, &hit), REQ);
        BT_ASSERT_EQ(hit, REQ - 1);
        kv_prefix_release(p.prefix, REQ, ids);
    }
    kv_prefix_stats(p.prefix, &st);
    BT_CHECK(st.evictions >= (uint64_t)(N - 1) * (REQ - 3));
    /* the last prompt, and what is left of the one before */
    BT_CHECK(st.cached_blocks >= REQ && st.cached_blocks <= POOL);
    BT_ASSERT_EQ(kv_prefix_available(p.prefix), POOL);
    pool_close(&p);
    fprintf(stderr, "tight_pool: requests:%d pool:%d evictions:%llu\n",
            2 * N, POOL, (unsigned long long)st.evictions);
    BT_TEST_PASS("eviction in a pool 3 blocks larger than one request");
}

static void test_shared_refcounts(void)
{
    pool_t p;
    bt_blockhash_t root;
    int ta[12], tb[12], a[3], b[3], x[16];
    int hit;

    pool_open(&p, 8, 4);
    root = kv_prefix_root(p.prefix, "", 0);
    fill(ta, 12, 7);
    memcpy(tb, ta, sizeof(tb));
    tb[10] = -5; /* B shares A's first two blocks */
    BT_ASSERT_EQ(run_prompt(&p, root, ta, 12, 4, a, &hit), 3);
    BT_ASSERT_EQ(run_prompt(&p, root, tb, 12, 4, b, &hit), 3);
    BT_ASSERT_EQ(hit, 2);
    BT_ASSERT_EQ(b[0], a[0]);
    BT_ASSERT_EQ(b[1], a[1]);
    BT_ASSERT_NE(b[2], a[2]);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, a[0]), 3);
    /* A finishes: the shared blocks stay with B (and the cache). */
    kv_prefix_release(p.prefix, 3, a);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, b[0]), 2);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, b[1]), 2);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, a[2]), 1); /* unused */
    BT_CHECK(kv_prefix_check(p.prefix));
    /* Pressure cannot evict what B uses: 8 - 3 held = 5 obtainable. */
    BT_ASSERT_EQ(kv_prefix_available(p.prefix), 5);
    BT_ASSERT_EQ(kv_prefix_alloc(p.prefix, 6, x), BT_ERR_NO_RESOURCE);
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 5, x));
    BT_CHECK(kv_prefix_is_cached(p.prefix, b[0]));
    BT_CHECK(kv_prefix_is_cached(p.prefix, b[1]));
    BT_CHECK(!kv_prefix_is_cached(p.prefix, a[2]));
    kv_prefix_release(p.prefix, 5, x);
    kv_prefix_release(p.prefix, 3, b);
    BT_ASSERT_EQ(kv_allocator_refcount(p.alloc, b[0]), 1);
    BT_CHECK(kv_prefix_check(p.prefix));

    /* Two sequences computing one prefix at once: the first insert wins,
     * the copy is plain and freed on release. */
    kv_prefix_clear(p.prefix);
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 3, a));
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 3, b));
    BT_ASSERT_EQ(kv_prefix_insert(p.prefix, root, ta, 12, a), 3);
    BT_ASSERT_EQ(kv_prefix_insert(p.prefix, root, ta, 12, b), 0);
    BT_CHECK(!kv_prefix_is_cached(p.prefix, b[0]));
    kv_prefix_release(p.prefix, 3, b);
    kv_prefix_release(p.prefix, 3, a);
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc), 5);
    pool_close(&p);
    BT_TEST_PASS("refcounts when two sequences share a prefix");
}

/* Inserting as blocks fill (a cursor, one token at a time) caches the
 * same blocks under the same hashes, in the same events, as one insert
 * at the end. */
static void test_cursor(void)
{
    enum { BS = 3, N = 20 };
    pool_t p, q;
    bt_blockhash_t rp, rq;
    kv_prefix_cursor_t cur;
    kv_prefix_batch_t bp, bq;
    int t[N], ip[7], iq[7], added = 0;

    pool_open(&p, 8, BS);
    pool_open(&q, 8, BS);
    rp = kv_prefix_root(p.prefix, "c", 1);
    rq = kv_prefix_root(q.prefix, "c", 1);
    fill(t, N, 13);
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 7, ip));
    BT_ASSERT_OK(kv_prefix_alloc(q.prefix, 7, iq));
    kv_prefix_cursor_init(&cur, rp);
    for (int n = 1; n <= N; n++) {
        added += kv_prefix_insert_more(p.prefix, &cur, t, n, ip);
        BT_ASSERT_EQ(cur.n_hashed, n / BS);
    }
    BT_ASSERT_EQ(added, N / BS);
    BT_ASSERT_EQ(kv_prefix_insert(q.prefix, rq, t, N, iq), N / BS);
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &bp));
    BT_ASSERT_OK(kv_prefix_events_take(q.prefix, &bq));
    BT_ASSERT_EQ(bp.n_events, 1);
    BT_ASSERT_EQ(bq.n_events, 1);
    BT_ASSERT_EQ(bp.events[0].n_hashes, bq.events[0].n_hashes);
    BT_CHECK(memcmp(bp.events[0].hashes, bq.events[0].hashes,
                    sizeof(uint64_t) * (size_t)bq.events[0].n_hashes) == 0);
    kv_prefix_batch_cleanup(&bp);
    kv_prefix_batch_cleanup(&bq);
    kv_prefix_release(p.prefix, 7, ip);
    kv_prefix_release(q.prefix, 7, iq);
    BT_ASSERT_EQ(kv_prefix_match(p.prefix, rp, t, N, N / BS, ip), N / BS);
    kv_prefix_release(p.prefix, N / BS, ip);
    pool_close(&p);
    pool_close(&q);
    BT_TEST_PASS("cursor: inserting as blocks fill = one insert");
}

// ----------------------------------------------------------------------------
// events

static void test_events(void)
{
    pool_t p;
    kv_prefix_config_t cfg;
    bt_blockhash_t root, chain[3];
    kv_prefix_batch_t batch;
    int t[12], a[3], x[16];

    pool_open(&p, 4, 4);
    root = kv_prefix_root(p.prefix, "s", 1);
    fill(t, 12, 9);
    BT_ASSERT_EQ(bt_blockhash_chain(root, t, 12, 4, chain, 3), 3);
    BT_ASSERT_EQ(run_prompt(&p, root, t, 12, 4, a, NULL), 3);
    kv_prefix_release(p.prefix, 3, a);

    /* One STORED chain: parent = the root, hashes = the chain. */
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_ASSERT_EQ(batch.instance, 42);
    BT_ASSERT_EQ(batch.seq_first, 1);
    BT_CHECK(!batch.resync);
    BT_ASSERT_EQ(batch.n_events, 1);
    BT_ASSERT_EQ(batch.events[0].type, KV_PREFIX_EV_STORED);
    BT_CHECK(batch.events[0].parent == root.lo);
    BT_ASSERT_EQ(batch.events[0].n_hashes, 3);
    for (int i = 0; i < 3; i++)
        BT_CHECK(batch.events[0].hashes[i] == chain[i].lo);
    kv_prefix_batch_cleanup(&batch);
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_ASSERT_EQ(batch.n_events, 0);
    BT_ASSERT_EQ(batch.seq_first, 2);
    kv_prefix_batch_cleanup(&batch);

    /* Pressure evicts the tail then the middle: one EVICTED run. */
    BT_ASSERT_OK(kv_prefix_alloc(p.prefix, 3, x));
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_ASSERT_EQ(batch.seq_first, 2);
    BT_ASSERT_EQ(batch.n_events, 1);
    BT_ASSERT_EQ(batch.events[0].type, KV_PREFIX_EV_EVICTED);
    BT_ASSERT_EQ(batch.events[0].n_hashes, 2);
    BT_CHECK(batch.events[0].hashes[0] == chain[2].lo);
    BT_CHECK(batch.events[0].hashes[1] == chain[1].lo);
    kv_prefix_batch_cleanup(&batch);
    kv_prefix_release(p.prefix, 3, x);

    /* Snapshot: CLEARED then what is cached (block 0), numbered next. */
    BT_ASSERT_OK(kv_prefix_snapshot(p.prefix, &batch));
    BT_CHECK(batch.resync);
    BT_ASSERT_EQ(batch.seq_first, 3);
    BT_ASSERT_EQ(batch.n_events, 2);
    BT_ASSERT_EQ(batch.events[0].type, KV_PREFIX_EV_CLEARED);
    BT_ASSERT_EQ(batch.events[1].type, KV_PREFIX_EV_STORED);
    BT_ASSERT_EQ(batch.events[1].n_hashes, 1);
    BT_CHECK(batch.events[1].hashes[0] == chain[0].lo);
    BT_CHECK(batch.events[1].parent == root.lo);
    kv_prefix_batch_cleanup(&batch);

    /* CLEARED is logged in order after what was pending. */
    kv_prefix_clear(p.prefix);
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_ASSERT_EQ(batch.seq_first, 5);
    BT_ASSERT_EQ(batch.n_events, 1);
    BT_ASSERT_EQ(batch.events[0].type, KV_PREFIX_EV_CLEARED);
    kv_prefix_batch_cleanup(&batch);
    pool_close(&p);

    /* A log over max_pending gives up: the next take is a snapshot. */
    kv_prefix_config_init(&cfg);
    cfg.block_size = 1;
    cfg.max_pending = 4;
    BT_ASSERT_OK(kv_allocator_create(16, &p.alloc));
    BT_ASSERT_OK(kv_prefix_create(&cfg, p.alloc, &p.prefix));
    root = kv_prefix_root(p.prefix, "", 0);
    fill(t, 12, 4);
    BT_ASSERT_EQ(run_prompt(&p, root, t, 10, 1, x, NULL), 10);
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_CHECK(batch.resync);
    BT_ASSERT_EQ(batch.n_events, 2); /* CLEARED + one STORED chain */
    BT_ASSERT_EQ(batch.events[1].n_hashes, 10);
    kv_prefix_batch_cleanup(&batch);
    BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
    BT_CHECK(!batch.resync);
    BT_ASSERT_EQ(batch.n_events, 0);
    kv_prefix_batch_cleanup(&batch);
    kv_prefix_release(p.prefix, 10, x);
    pool_close(&p);
    BT_TEST_PASS("events: STORED chain, EVICTED run, snapshot, overflow");
}

// ----------------------------------------------------------------------------
// randomized: 10,000 requests, every block accounted for

/* What a block's KV "is": a naive hash of the salt and every token up to
 * the block's end, computed without the chain.  A hit is correct when the
 * reused block holds exactly what this request would have computed. */
static uint64_t content_of(int salt, const int *t, int end)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)salt;

    for (int i = 0; i < end; i++)
        h = (h ^ (uint64_t)(uint32_t)t[i]) * 1099511628211ULL;
    return h;
}

typedef struct {
    int ids[64];
    int n_ids;
} live_t;

static uint32_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static void test_random_leak(void)
{
    enum { BS = 4, POOL = 96, MAX_LIVE = 6, REQS = 10000, BASES = 5 };
    pool_t p;
    bt_blockhash_t roots[3];
    uint64_t content[POOL];
    live_t live[MAX_LIVE];
    int n_live = 0;
    uint64_t rng = 12345;
    int bases[BASES][64];
    int done = 0, refused = 0;
    uint64_t hits = 0;
    kv_prefix_stats_t st;
    kv_prefix_batch_t batch;

    pool_open(&p, POOL, BS);
    for (int s = 0; s < 3; s++) {
        char salt[16];
        snprintf(salt, sizeof(salt), "t%d", s);
        roots[s] = kv_prefix_root(p.prefix, salt, strlen(salt));
    }
    for (int b = 0; b < BASES; b++)
        for (int i = 0; i < 64; i++)
            bases[b][i] = (int)(rng_next(&rng) % 50);
    while (done < REQS) {
        int t[96];
        int salt = (int)(rng_next(&rng) % 3);
        int base = (int)(rng_next(&rng) % BASES);
        int keep = (int)(rng_next(&rng) % 64);
        int n = 1 + keep + (int)(rng_next(&rng) % 16);
        int gen = (int)(rng_next(&rng) % 9);
        live_t *l;
        int hit, need;

        /* finish a random live request now and then, or when full */
        while (n_live > 0 && (n_live == MAX_LIVE || rng_next(&rng) % 3 == 0)) {
            int k = (int)(rng_next(&rng) % (unsigned)n_live);
            kv_prefix_release(p.prefix, live[k].n_ids, live[k].ids);
            live[k] = live[--n_live];
            done++;
        }
        memcpy(t, bases[base], 64 * sizeof(int));
        for (int i = keep; i < n + gen; i++)
            t[i] = (int)(rng_next(&rng) % 50);
        l = &live[n_live];
        hit = kv_prefix_match(p.prefix, roots[salt], t, n, (n - 1) / BS,
                              l->ids);
        hits += (uint64_t)hit;
        for (int k = 0; k < hit; k++)
            if (content[l->ids[k]] != content_of(salt, t, (k + 1) * BS))
                BT_TEST_FAIL("request %d: block %d (id %d) reused with "
                             "other content", done, k, l->ids[k]);
        need = BT_DIV_UP(n + gen, BS);
        if (kv_prefix_alloc(p.prefix, need - hit, l->ids + hit) != BT_OK) {
            kv_prefix_release(p.prefix, hit, l->ids);
            refused++;
            done++;
            continue;
        }
        /* "compute" prompt + generated tokens into the new blocks */
        for (int k = hit; k < need; k++)
            content[l->ids[k]] = content_of(salt, t, (k + 1) * BS);
        l->n_ids = need;
        kv_prefix_insert(p.prefix, roots[salt], t, n + gen, l->ids);
        n_live++;
        if (done % 97 == 0)
            BT_CHECK(kv_prefix_check(p.prefix));
        /* drain the log as a worker would */
        if (done % 13 == 0) {
            BT_ASSERT_OK(kv_prefix_events_take(p.prefix, &batch));
            kv_prefix_batch_cleanup(&batch);
        }
    }
    while (n_live > 0) {
        n_live--;
        kv_prefix_release(p.prefix, live[n_live].n_ids, live[n_live].ids);
    }
    BT_CHECK(kv_prefix_check(p.prefix));
    kv_prefix_stats(p.prefix, &st);
    /* all released: every block free or cached unused */
    BT_ASSERT_EQ(kv_allocator_free_list_count(p.alloc) + st.cached_unused,
                 POOL);
    BT_ASSERT_EQ(st.cached_unused, st.cached_blocks);
    BT_CHECK(st.hit_blocks == hits && hits > 0 && st.evictions > 0);
    fprintf(stderr, "random_leak: requests:%d refused:%d hit_blocks:%llu "
            "lookup_blocks:%llu hit_tokens:%llu evictions:%llu cached:%d\n",
            REQS, refused, (unsigned long long)st.hit_blocks,
            (unsigned long long)st.lookup_blocks,
            (unsigned long long)st.hit_tokens,
            (unsigned long long)st.evictions, st.cached_blocks);
    pool_close(&p);
    BT_TEST_PASS("10,000 random requests: every block accounted for");
}

// ----------------------------------------------------------------------------
// micro-benchmark

/* Per-block cost of insert, match (a full hit) and the bare hash chain,
 * block_size 16.  The machine is shared, so each figure is the best of
 * ROUNDS rounds of 64 blocks (the mean is noise from neighbours). */
static void bench(void)
{
    enum { BS = 16, BLOCKS = 4096, REQ = 64, ROUNDS = 200 };
    pool_t p;
    bt_blockhash_t root;
    int *t = malloc(sizeof(int) * REQ * BS * ROUNDS);
    int ids[REQ];
    uint64_t t0, best_insert = UINT64_MAX, best_match = UINT64_MAX;
    uint64_t best_hash = UINT64_MAX;
    bt_blockhash_t chain[REQ];

    BT_CHECK(t != NULL);
    pool_open(&p, BLOCKS, BS);
    root = kv_prefix_root(p.prefix, "", 0);
    for (int i = 0; i < REQ * BS * ROUNDS; i++)
        t[i] = (int)((i * 2654435761u) % 32000);
    for (int r = 0; r < ROUNDS; r++) {
        int *tr = t + (size_t)r * REQ * BS;

        BT_ASSERT_OK(kv_prefix_alloc(p.prefix, REQ, ids));
        t0 = bt_time_ns();
        BT_ASSERT_EQ(kv_prefix_insert(p.prefix, root, tr, REQ * BS, ids),
                     REQ);
        best_insert = BT_MIN(best_insert, bt_time_ns() - t0);
        kv_prefix_release(p.prefix, REQ, ids);
        t0 = bt_time_ns();
        BT_ASSERT_EQ(kv_prefix_match(p.prefix, root, tr, REQ * BS, REQ, ids),
                     REQ);
        best_match = BT_MIN(best_match, bt_time_ns() - t0);
        kv_prefix_release(p.prefix, REQ, ids);
        t0 = bt_time_ns();
        BT_ASSERT_EQ(bt_blockhash_chain(root, tr, REQ * BS, BS, chain, REQ),
                     REQ);
        best_hash = BT_MIN(best_hash, bt_time_ns() - t0);
    }
    printf("kv_prefix_bench: block_size:%d insert_ns_per_block:%.1f "
           "match_ns_per_block:%.1f hash_ns_per_block:%.1f\n", BS,
           (double)best_insert / REQ, (double)best_match / REQ,
           (double)best_hash / REQ);
    pool_close(&p);
    free(t);
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    bt_log_init("test");
    test_basic();
    test_partial_never_shared();
    test_salts();
    test_lru_order();
    test_tight_pool();
    test_shared_refcounts();
    test_cursor();
    test_events();
    test_random_leak();
    bench();
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
