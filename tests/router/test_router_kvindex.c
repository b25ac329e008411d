/* test_router_kvindex.c - the router's KV index and kv-aware policy
 * against real worker prefix caches (worker/kv/kv_prefix) whose event
 * batches go through protobuf (proto/kv_events.proto) as on the wire:
 * SipHash-2-4-128 reference vectors; the router's hash chain equals the
 * worker's for random tokens and block sizes; sequence numbers, gaps,
 * resync snapshots, worker restarts, malformed batches, the block cap;
 * salts never overlapping; overlap scoring and its weights; a benchmark
 * of overlap lookups. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_blockhash.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_prefix.h"
#include "router_kvindex.h"

// ----------------------------------------------------------------------------
// a worker: its pool and prefix cache

typedef struct {
    kv_allocator_t *alloc;
    kv_prefix_t *prefix;
    int bs;
} worker_t;

static void worker_start(worker_t *w, int n_blocks, int bs, uint64_t inst)
{
    kv_prefix_config_t cfg;

    kv_prefix_config_init(&cfg);
    cfg.block_size = bs;
    cfg.model_id = "llama-test";
    cfg.kv_dtype = "bf16";
    cfg.instance = inst;
    w->bs = bs;
    BT_ASSERT_OK(kv_allocator_create(n_blocks, &w->alloc));
    BT_ASSERT_OK(kv_prefix_create(&cfg, w->alloc, &w->prefix));
}

static void worker_stop(worker_t *w)
{
    kv_prefix_destroy(&w->prefix);
    kv_allocator_destroy(&w->alloc);
}

/* Runs one request to completion: its full blocks end up cached. */
static void worker_serve(worker_t *w, const char *salt, const int *t, int n)
{
    bt_blockhash_t root = kv_prefix_root(w->prefix, salt, strlen(salt));
    int *ids = malloc(sizeof(int) * (size_t)(n / w->bs + 1));
    int need = BT_DIV_UP(n, w->bs);
    int hit;

    BT_CHECK(ids != NULL);
    hit = kv_prefix_match(w->prefix, root, t, n, n / w->bs, ids);
    BT_ASSERT_OK(kv_prefix_alloc(w->prefix, need - hit, ids + hit));
    kv_prefix_insert(w->prefix, root, t, n, ids);
    kv_prefix_release(w->prefix, need, ids);
    free(ids);
}

/* Packs a batch as a worker would publish it (KvEvents with identity and
 * block size), unpacks it as the router would, applies it. */
static bt_status_t deliver(router_kvindex_t *idx, int slot,
                           const worker_t *w, const kv_prefix_batch_t *b,
                           router_kvindex_result_t *res)
{
    Baton__KvEvents msg = BATON__KV_EVENTS__INIT;
    Baton__KvEvent *evs = calloc((size_t)b->n_events + 1, sizeof(*evs));
    Baton__KvEvent **ptrs = calloc((size_t)b->n_events + 1, sizeof(*ptrs));
    bt_blockhash_t id = kv_prefix_identity(w->prefix);
    uint8_t id_bytes[16];
    uint8_t *buf;
    size_t len;
    Baton__KvEvents *back;
    bt_status_t status;

    BT_CHECK(evs != NULL && ptrs != NULL);
    for (int k = 0; k < 8; k++) {
        id_bytes[k] = (uint8_t)(id.lo >> (8 * k));
        id_bytes[8 + k] = (uint8_t)(id.hi >> (8 * k));
    }
    for (int i = 0; i < b->n_events; i++) {
        Baton__KvEvent init = BATON__KV_EVENT__INIT;

        evs[i] = init;
        evs[i].type = (Baton__KvEventType)b->events[i].type;
        evs[i].n_block_hashes = (size_t)b->events[i].n_hashes;
        evs[i].block_hashes = b->events[i].hashes;
        evs[i].has_parent_hash = b->events[i].type == KV_PREFIX_EV_STORED;
        evs[i].parent_hash = b->events[i].parent;
        evs[i].has_tier = 1;
        evs[i].tier = 0;
        ptrs[i] = &evs[i];
    }
    msg.instance = b->instance;
    msg.seq_first = b->seq_first;
    msg.n_events = (size_t)b->n_events;
    msg.events = ptrs;
    msg.has_resync = b->resync;
    msg.resync = b->resync;
    msg.has_identity = 1;
    msg.identity.len = 16;
    msg.identity.data = id_bytes;
    msg.has_block_size = 1;
    msg.block_size = (uint32_t)w->bs;
    len = baton__kv_events__get_packed_size(&msg);
    buf = malloc(len + 1);
    BT_CHECK(buf != NULL);
    BT_ASSERT_EQ(baton__kv_events__pack(&msg, buf), len);
    back = baton__kv_events__unpack(NULL, len, buf);
    BT_CHECK(back != NULL);
    status = router_kvindex_apply_msg(idx, slot, back, res);
    baton__kv_events__free_unpacked(back, NULL);
    free(buf);
    free(ptrs);
    free(evs);
    return status;
}

/* Takes the worker's pending events and delivers them. */
static router_kvindex_result_t publish(router_kvindex_t *idx, int slot,
                                       worker_t *w)
{
    kv_prefix_batch_t b;
    router_kvindex_result_t res;

    BT_ASSERT_OK(kv_prefix_events_take(w->prefix, &b));
    BT_ASSERT_OK(deliver(idx, slot, w, &b, &res));
    kv_prefix_batch_cleanup(&b);
    return res;
}

static router_kvindex_result_t resync(router_kvindex_t *idx, int slot,
                                      worker_t *w)
{
    kv_prefix_batch_t b;
    router_kvindex_result_t res;

    BT_ASSERT_OK(kv_prefix_snapshot(w->prefix, &b));
    BT_ASSERT_OK(deliver(idx, slot, w, &b, &res));
    kv_prefix_batch_cleanup(&b);
    return res;
}

/* The router's view: leading blocks of t under salt that slot holds,
 * computed from what the worker published (identity, block size). */
static int router_overlap(const router_kvindex_t *idx, int slot,
                          const char *salt, const int *t, int n)
{
    bt_blockhash_t id;
    int bs, k, got;
    uint64_t *chain;

    if (!router_kvindex_identity(idx, slot, &id, &bs))
        return 0;
    chain = malloc(sizeof(*chain) * (size_t)(n / bs + 1));
    BT_CHECK(chain != NULL);
    k = bt_blockhash_chain64(bt_blockhash_root(id, salt, strlen(salt)), t, n,
                             bs, chain, n / bs);
    got = router_kvindex_overlap(idx, slot, chain, k);
    free(chain);
    return got;
}

static uint32_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static void fill(int *t, int n, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = seed * 1000 + i;
}

// ----------------------------------------------------------------------------

static void test_siphash_vectors(void)
{
    /* github.com/veorq/SipHash vectors.h, vectors_sip128: key 00..0f,
     * message 00..(len-1). */
    static const struct {
        int len;
        const char *hex;
    } v[] = {
        { 0, "a3817f04ba25a8e66df67214c7550293" },
        { 1, "da87c1d86b99af44347659119b22fc45" },
        { 7, "a1f1ebbed8dbc153c0b84aa61ff08239" },
        { 8, "3b62a9ba6258f5610f83e264f31497b4" },
        { 9, "264499060ad9baabc47f8b02bb6d71ed" },
    };
    uint8_t key[16], msg[16];

    for (int i = 0; i < 16; i++)
        key[i] = msg[i] = (uint8_t)i;
    for (size_t i = 0; i < BT_ARRAY_SIZE(v); i++) {
        bt_blockhash_t h = bt_siphash128(key, msg, (size_t)v[i].len);
        char hex[33];

        for (int k = 0; k < 16; k++) {
            uint64_t half = k < 8 ? h.lo : h.hi;

            snprintf(hex + 2 * k, 3, "%02x",
                     (unsigned)(half >> (8 * (k % 8))) & 0xff);
        }
        BT_ASSERT_STREQ(hex, v[i].hex);
    }
    BT_TEST_PASS("SipHash-2-4-128 reference vectors");
}

static void test_chain_properties(void)
{
    bt_blockhash_t id = bt_blockhash_identity(4, "m", "f32");
    bt_blockhash_t r0 = bt_blockhash_root(id, "", 0);
    bt_blockhash_t full[3], other[3];
    uint64_t wire[3];
    int t[12];

    fill(t, 12, 5);
    /* identity: every part matters */
    BT_CHECK(!bt_blockhash_eq(id, bt_blockhash_identity(8, "m", "f32")));
    BT_CHECK(!bt_blockhash_eq(id, bt_blockhash_identity(4, "n", "f32")));
    BT_CHECK(!bt_blockhash_eq(id, bt_blockhash_identity(4, "m", "bf16")));
    /* framing: ("ab","c") and ("a","bc") differ */
    BT_CHECK(!bt_blockhash_eq(bt_blockhash_identity(4, "ab", "c"),
                              bt_blockhash_identity(4, "a", "bc")));
    /* partial last block: no hash */
    BT_ASSERT_EQ(bt_blockhash_chain(r0, t, 11, 4, full, 3), 2);
    BT_ASSERT_EQ(bt_blockhash_chain(r0, t, 12, 4, full, 3), 3);
    BT_ASSERT_EQ(bt_blockhash_chain(r0, t, 12, 4, full, 1), 1);
    BT_ASSERT_EQ(bt_blockhash_chain(r0, t, 3, 4, full, 3), 0);
    BT_ASSERT_EQ(bt_blockhash_chain64(r0, t, 12, 4, wire, 3), 3);
    for (int i = 0; i < 3; i++)
        BT_CHECK(wire[i] == full[i].lo && wire[i] != 0);
    /* chained: changing block 0 changes every later hash */
    t[0]++;
    BT_ASSERT_EQ(bt_blockhash_chain(r0, t, 12, 4, other, 3), 3);
    for (int i = 0; i < 3; i++)
        BT_CHECK(!bt_blockhash_eq(full[i], other[i]));
    /* salt: a different root, every hash differs */
    t[0]--;
    BT_ASSERT_EQ(bt_blockhash_chain(bt_blockhash_root(id, "x", 1), t, 12, 4,
                                    other, 3), 3);
    for (int i = 0; i < 3; i++)
        BT_CHECK(!bt_blockhash_eq(full[i], other[i]));
    /* the known answers docs/KV_EVENTS.md gives, so the byte format
     * cannot drift from the document */
    {
        int k[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        bt_blockhash_t kid = bt_blockhash_identity(4, "llama-test", "bf16");
        bt_blockhash_t kr = bt_blockhash_root(kid, "", 0);
        bt_blockhash_t ka = bt_blockhash_root(kid, "tenant-a", 8);
        bt_blockhash_t kc[2];

        BT_ASSERT_EQ(bt_blockhash_chain(kr, k, 8, 4, kc, 2), 2);
        BT_CHECK(kid.lo == 0xb05f0add4f3b1be0ULL &&
                 kid.hi == 0x2ea223bc0558ff30ULL);
        BT_CHECK(kr.lo == 0x9b48a0de49240657ULL &&
                 kr.hi == 0xa0850da608c7fc08ULL);
        BT_CHECK(ka.lo == 0x8e4caa940beb19a2ULL &&
                 ka.hi == 0x85d8128f2ce3a0c5ULL);
        BT_CHECK(kc[0].lo == 0x759d8bf94bf04f4bULL &&
                 kc[0].hi == 0x7f8351236a8cbf00ULL);
        BT_CHECK(kc[1].lo == 0x3c0cf1c2007e1c47ULL &&
                 kc[1].hi == 0x4c6a8eb7a35f3487ULL);
    }
    BT_TEST_PASS("hash chain: identity, salt, chaining, partial blocks");
}

/* The router's chain, computed from what the worker published, equals
 * the worker's, for random tokens, block sizes and salts. */
static void test_chain_property(void)
{
    uint64_t rng = 777;
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 4;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    for (int iter = 0; iter < 200; iter++) {
        int bs = 1 + (int)(rng_next(&rng) % 32);
        int n = (int)(rng_next(&rng) % 300);
        char salt[16];
        int *t = malloc(sizeof(int) * (size_t)(n + 1));
        uint64_t *chain = malloc(sizeof(uint64_t) * (size_t)(n / bs + 1));
        worker_t w;
        kv_prefix_batch_t b;
        router_kvindex_result_t res;
        bt_blockhash_t id;
        int got_bs, k, at = 0;

        BT_CHECK(t != NULL && chain != NULL);
        snprintf(salt, sizeof(salt), "s%u", rng_next(&rng) % 1000);
        for (int i = 0; i < n; i++)
            t[i] = (int)(rng_next(&rng) % 128000);
        worker_start(&w, n / bs + 2, bs, 1000 + (uint64_t)iter);
        router_kvindex_reset(idx, 1);
        worker_serve(&w, salt, t, n);
        BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b));
        BT_ASSERT_OK(deliver(idx, 1, &w, &b, &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
        BT_CHECK(router_kvindex_identity(idx, 1, &id, &got_bs));
        BT_ASSERT_EQ(got_bs, bs);
        k = bt_blockhash_chain64(bt_blockhash_root(id, salt, strlen(salt)),
                                 t, n, bs, chain, n / bs);
        BT_ASSERT_EQ(k, n / bs);
        /* the worker's STORED hashes are the router's chain, in order */
        for (int e = 0; e < b.n_events; e++) {
            BT_ASSERT_EQ(b.events[e].type, KV_PREFIX_EV_STORED);
            for (int j = 0; j < b.events[e].n_hashes; j++, at++)
                if (b.events[e].hashes[j] != chain[at])
                    BT_TEST_FAIL("bs %d n %d: block %d: worker %016llx, "
                                 "router %016llx", bs, n, at,
                                 (unsigned long long)b.events[e].hashes[j],
                                 (unsigned long long)chain[at]);
        }
        BT_ASSERT_EQ(at, k);
        BT_ASSERT_EQ(router_kvindex_overlap(idx, 1, chain, k), k);
        kv_prefix_batch_cleanup(&b);
        worker_stop(&w);
        free(chain);
        free(t);
    }
    router_kvindex_destroy(&idx);
    BT_CHECK(idx == NULL);
    BT_TEST_PASS("router hash chain == worker hash chain (200 random)");
}

static void test_sequence_gap_resync(void)
{
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    worker_t w;
    kv_prefix_batch_t b1, b2, b3;
    router_kvindex_result_t res;
    int ta[32], tb[32], tc[32];

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 4;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    worker_start(&w, 64, 4, 7);
    fill(ta, 32, 1);
    fill(tb, 32, 2);
    fill(tc, 32, 3);

    /* in order */
    worker_serve(&w, "", ta, 32);
    BT_ASSERT_EQ(publish(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_kvindex_blocks(idx, 2), 8);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), 8);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 30), 7);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", tb, 32), 0);
    BT_ASSERT_EQ(router_overlap(idx, 3, "", ta, 32), 0); /* other slot */
    BT_ASSERT_EQ(router_kvindex_seq_next(idx, 2), 2);
    BT_ASSERT_EQ(router_kvindex_instance(idx, 2), 7);

    /* b1 applied, b1 again (duplicate) is stale, b2 applied */
    worker_serve(&w, "", tb, 32);
    BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b1));
    worker_serve(&w, "", tc, 32);
    BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b2));
    BT_ASSERT_OK(deliver(idx, 2, &w, &b1, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_OK(deliver(idx, 2, &w, &b1, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_STALE);
    BT_ASSERT_OK(deliver(idx, 2, &w, &b2, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", tc, 32), 8);
    kv_prefix_batch_cleanup(&b1);
    kv_prefix_batch_cleanup(&b2);

    /* a lost batch: the next one shows a gap */
    worker_serve(&w, "", ta, 32); /* all hits: nothing new */
    {
        int t2[32];
        fill(t2, 32, 4);
        worker_serve(&w, "", t2, 32);
        BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b1)); /* lost */
        fill(t2, 32, 5);
        worker_serve(&w, "", t2, 32);
        BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b2));
        BT_ASSERT_OK(deliver(idx, 2, &w, &b2, &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_RESYNC);
        BT_CHECK(router_kvindex_needs_resync(idx, 2));
        BT_ASSERT_EQ(router_kvindex_blocks(idx, 2), 0);
        BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), 0);
        /* late or later batches do not count until the snapshot */
        BT_ASSERT_OK(deliver(idx, 2, &w, &b1, &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_RESYNC);
        kv_prefix_batch_cleanup(&b1);
        kv_prefix_batch_cleanup(&b2);
        /* the snapshot restores the worker's whole set */
        BT_ASSERT_EQ(resync(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
        BT_CHECK(!router_kvindex_needs_resync(idx, 2));
        {
            kv_prefix_stats_t st;
            kv_prefix_stats(w.prefix, &st);
            BT_ASSERT_EQ(router_kvindex_blocks(idx, 2), st.cached_blocks);
        }
        BT_ASSERT_EQ(router_overlap(idx, 2, "", t2, 32), 8);
        /* and the stream continues after it */
        fill(t2, 32, 6);
        worker_serve(&w, "", t2, 32);
        BT_ASSERT_EQ(publish(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
        BT_ASSERT_EQ(router_overlap(idx, 2, "", t2, 32), 8);
    }

    /* evictions reach the router: a small pool evicts ta's blocks */
    worker_stop(&w);
    worker_start(&w, 9, 4, 8); /* restart: new instance, empty cache */
    worker_serve(&w, "", ta, 32);
    BT_ASSERT_EQ(publish(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
    /* the old instance's blocks are gone from the index */
    BT_ASSERT_EQ(router_kvindex_instance(idx, 2), 8);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", tc, 32), 0);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), 8);
    worker_serve(&w, "", tb, 32);
    BT_ASSERT_EQ(publish(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", tb, 32), 8);
    /* the 9-block pool evicted ta's tail for tb: the router sees what
     * the worker still has, block 0 */
    {
        int ids[8];
        int held = kv_prefix_match(w.prefix, kv_prefix_root(w.prefix, "", 0),
                                   ta, 32, 8, ids);

        kv_prefix_release(w.prefix, held, ids);
        BT_ASSERT_EQ(held, 1);
        BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), held);
    }

    /* a restarted worker whose first batches the router missed */
    worker_stop(&w);
    worker_start(&w, 64, 4, 9);
    worker_serve(&w, "", ta, 32);
    BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b1)); /* lost */
    kv_prefix_batch_cleanup(&b1);
    worker_serve(&w, "", tb, 32);
    BT_ASSERT_EQ(publish(idx, 2, &w), ROUTER_KVINDEX_RESYNC);
    BT_CHECK(router_kvindex_needs_resync(idx, 2));
    BT_ASSERT_EQ(router_kvindex_blocks(idx, 2), 0);
    BT_ASSERT_EQ(resync(idx, 2, &w), ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), 8);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", tb, 32), 8);
    /* a stale snapshot (a duplicate) is ignored */
    BT_ASSERT_OK(kv_prefix_snapshot(w.prefix, &b3));
    BT_ASSERT_OK(deliver(idx, 2, &w, &b3, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_OK(deliver(idx, 2, &w, &b3, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_STALE);
    kv_prefix_batch_cleanup(&b3);

    /* the slot re-registered: empty */
    router_kvindex_reset(idx, 2);
    BT_ASSERT_EQ(router_kvindex_blocks(idx, 2), 0);
    BT_ASSERT_EQ(router_overlap(idx, 2, "", ta, 32), 0);
    worker_stop(&w);
    router_kvindex_destroy(&idx);
    BT_TEST_PASS("events: order, duplicates, gap -> resync, restart");
}

/* The stream under loss and duplication: batches are dropped or
 * delivered twice at random; whenever the router asks for a resync it
 * gets a snapshot.  Whenever it is in sync, its view equals the worker's
 * cache exactly (block count, and the overlap of every recent prompt
 * equals what the worker would match). */
static void test_random_stream(void)
{
    enum { BS = 4, POOL = 48, STEPS = 3000, RECENT = 8 };
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    worker_t w;
    uint64_t rng = 4242;
    int recent[RECENT][40];
    int recent_n[RECENT] = { 0 };
    int resyncs = 0, checks = 0;
    bt_blockhash_t root;

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 1;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    worker_start(&w, POOL, BS, 31);
    root = kv_prefix_root(w.prefix, "", 0);
    for (int step = 0; step < STEPS; step++) {
        int slot = step % RECENT;
        int n = 1 + (int)(rng_next(&rng) % 40);
        kv_prefix_batch_t b;
        router_kvindex_result_t res = ROUTER_KVINDEX_APPLIED;
        uint32_t fate = rng_next(&rng) % 10;

        for (int i = 0; i < n; i++)
            recent[slot][i] = (int)(rng_next(&rng) % 6); /* many shared */
        recent_n[slot] = n;
        worker_serve(&w, "", recent[slot], n);
        BT_ASSERT_OK(kv_prefix_events_take(w.prefix, &b));
        if (fate >= 1) /* 10 % lost */
            BT_ASSERT_OK(deliver(idx, 0, &w, &b, &res));
        if (fate == 9 && res != ROUTER_KVINDEX_RESYNC) {
            BT_ASSERT_OK(deliver(idx, 0, &w, &b, &res)); /* duplicate */
            BT_ASSERT_EQ(res, b.n_events > 0 ? ROUTER_KVINDEX_STALE
                                             : ROUTER_KVINDEX_APPLIED);
        }
        kv_prefix_batch_cleanup(&b);
        if (router_kvindex_needs_resync(idx, 0)) {
            BT_ASSERT_EQ(resync(idx, 0, &w), ROUTER_KVINDEX_APPLIED);
            resyncs++;
        }
        if (fate == 0)
            continue; /* a batch may be lost unseen until the next one */
        {
            kv_prefix_stats_t st;

            kv_prefix_stats(w.prefix, &st);
            BT_ASSERT_EQ(router_kvindex_blocks(idx, 0), st.cached_blocks);
        }
        for (int r = 0; r < RECENT; r++) {
            int ids[10];
            int held = kv_prefix_match(w.prefix, root, recent[r],
                                       recent_n[r], recent_n[r] / BS, ids);

            kv_prefix_release(w.prefix, held, ids);
            BT_ASSERT_EQ(router_overlap(idx, 0, "", recent[r], recent_n[r]),
                         held);
            checks++;
        }
    }
    BT_CHECK(resyncs > 0);
    fprintf(stderr, "random_stream: steps:%d resyncs:%d overlap_checks:%d\n",
            STEPS, resyncs, checks);
    worker_stop(&w);
    router_kvindex_destroy(&idx);
    BT_TEST_PASS("random loss/duplication: in sync = equal to the worker");
}

static void test_salt_isolation(void)
{
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    worker_t w;
    int t[64];

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 1;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    worker_start(&w, 64, 8, 11);
    fill(t, 64, 8);
    worker_serve(&w, "alice", t, 64);
    BT_ASSERT_EQ(publish(idx, 0, &w), ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_overlap(idx, 0, "alice", t, 64), 8);
    BT_ASSERT_EQ(router_overlap(idx, 0, "bob", t, 64), 0);
    BT_ASSERT_EQ(router_overlap(idx, 0, "", t, 64), 0);
    worker_serve(&w, "bob", t, 64);
    BT_ASSERT_EQ(publish(idx, 0, &w), ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_kvindex_blocks(idx, 0), 16); /* two copies */
    BT_ASSERT_EQ(router_overlap(idx, 0, "bob", t, 64), 8);
    worker_stop(&w);
    router_kvindex_destroy(&idx);
    BT_TEST_PASS("salts: no overlap across tenants in the events");
}

static void test_malformed(void)
{
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    router_kvindex_result_t res;
    uint64_t good[2] = { 5, 6 }, zero[2] = { 5, 0 };
    router_kvindex_event_t ev = { BATON__KV_EVENT_TYPE__KV_EVENT_STORED, 1,
                                  2, good };
    router_kvindex_event_t bad_type = ev, bad_hash = ev;
    Baton__KvEvents msg = BATON__KV_EVENTS__INIT;
    uint8_t short_id[5] = { 0 };

    bad_type.type = 99;
    bad_hash.hashes = zero;
    router_kvindex_config_init(&cfg);
    cfg.max_workers = 2;
    cfg.max_blocks_per_worker = 4;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    BT_ASSERT_OK(router_kvindex_apply(idx, 0, 3, 1, false, 1, &ev, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
    BT_ASSERT_EQ(router_kvindex_overlap(idx, 0, good, 2), 2);
    /* each of these is refused, and the slot waits for a resync */
    BT_ASSERT_EQ(router_kvindex_apply(idx, 0, 3, 2, false, 1, &bad_type,
                                      &res), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "unknown type 99") != NULL);
    BT_CHECK(router_kvindex_needs_resync(idx, 0));
    BT_ASSERT_EQ(router_kvindex_blocks(idx, 0), 0);
    BT_ASSERT_EQ(router_kvindex_apply(idx, 1, 3, 1, false, 1, &bad_hash,
                                      &res), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "hash 0") != NULL);
    BT_ASSERT_EQ(router_kvindex_apply(idx, 1, 3, 0, false, 1, &ev, &res),
                 BT_ERR_FORMAT);
    BT_ASSERT_EQ(router_kvindex_apply(idx, 1, 3, UINT64_MAX, false, 1, &ev,
                                      &res), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "overflows") != NULL);
    BT_ASSERT_EQ(router_kvindex_apply(idx, 1, 0, 1, false, 1, &ev, &res),
                 BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "instance 0") != NULL);
    msg.instance = 3;
    msg.seq_first = 1;
    msg.has_identity = 1;
    msg.identity.len = sizeof(short_id);
    msg.identity.data = short_id;
    BT_ASSERT_EQ(router_kvindex_apply_msg(idx, 1, &msg, &res),
                 BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "5 bytes, not 16") != NULL);
    /* a resync recovers */
    BT_ASSERT_OK(router_kvindex_apply(idx, 0, 3, 9, true, 1, &ev, &res));
    BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
    BT_CHECK(!router_kvindex_needs_resync(idx, 0));
    BT_ASSERT_EQ(router_kvindex_overlap(idx, 0, good, 2), 2);
    /* over the block cap (4): dropped, resync asked */
    {
        uint64_t many[5] = { 11, 12, 13, 14, 15 };
        router_kvindex_event_t big = { BATON__KV_EVENT_TYPE__KV_EVENT_STORED,
                                       1, 5, many };
        router_kvindex_event_t evict = {
            BATON__KV_EVENT_TYPE__KV_EVENT_EVICTED, 0, 1, good };
        router_kvindex_event_t clear = {
            BATON__KV_EVENT_TYPE__KV_EVENT_CLEARED, 0, 0, NULL };

        BT_ASSERT_OK(router_kvindex_apply(idx, 0, 3, 10, false, 1, &evict,
                                          &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
        BT_ASSERT_EQ(router_kvindex_overlap(idx, 0, good, 2), 0);
        BT_ASSERT_EQ(router_kvindex_overlap(idx, 0, good + 1, 1), 1);
        BT_ASSERT_OK(router_kvindex_apply(idx, 0, 3, 11, false, 1, &clear,
                                          &res));
        BT_ASSERT_EQ(router_kvindex_blocks(idx, 0), 0);
        BT_ASSERT_OK(router_kvindex_apply(idx, 0, 3, 12, false, 1, &big,
                                          &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_RESYNC);
        BT_CHECK(router_kvindex_needs_resync(idx, 0));
    }
    router_kvindex_destroy(&idx);
    BT_TEST_PASS("malformed batches refused; block cap; EVICTED/CLEARED");
}

static void test_weights(void)
{
    router_kv_weights_t w;

    router_kv_weights_init(&w);
    BT_ASSERT_NEAR(w.w_overlap, 1.0, 0);
    BT_ASSERT_NEAR(w.w_load, 1.0, 0);
    BT_ASSERT_OK(router_kv_weights_parse("overlap=2.5,load=0.25", &w));
    BT_ASSERT_NEAR(w.w_overlap, 2.5, 0);
    BT_ASSERT_NEAR(w.w_load, 0.25, 0);
    BT_ASSERT_OK(router_kv_weights_parse("load=3", &w));
    BT_ASSERT_NEAR(w.w_overlap, 2.5, 0);
    BT_ASSERT_NEAR(w.w_load, 3, 0);
    BT_ASSERT_OK(router_kv_weights_parse("", &w));
    BT_ASSERT_EQ(router_kv_weights_parse("overlap=-1", &w),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(router_kv_weights_parse("overlap=x", &w),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(router_kv_weights_parse("overlap=1;load=2", &w),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(router_kv_weights_parse("speed=1", &w), BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(bt_error_last(), "expected overlap=") != NULL);
    BT_ASSERT_EQ(router_kv_weights_parse("load=inf", &w),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(router_kv_weights_parse(NULL, &w), BT_ERR_INVALID_ARG);
    BT_ASSERT_NEAR(w.w_overlap, 2.5, 0); /* untouched by failures */
    BT_ASSERT_NEAR(w.w_load, 3, 0);
    BT_TEST_PASS("kv-aware weights: parse and refuse");
}

static void test_scoring(void)
{
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    worker_t w[3];
    router_kv_weights_t wt;
    router_kv_candidate_t c[3];
    int t[64], pick, ov;
    uint64_t chain[4];
    bt_blockhash_t root;

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 8;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    fill(t, 64, 21);
    /* worker 0 holds 4 blocks (64 tokens) of the prompt, worker 1 holds 2
     * (32 tokens), worker 2 none */
    for (int i = 0; i < 3; i++)
        worker_start(&w[i], 32, 16, 100 + (uint64_t)i);
    worker_serve(&w[0], "", t, 64);
    worker_serve(&w[1], "", t, 32);
    for (int i = 0; i < 3; i++) {
        publish(idx, 5 + i, &w[i]);
        c[i].worker = 5 + i;
    }
    root = kv_prefix_root(w[0].prefix, "", 0);
    BT_ASSERT_EQ(bt_blockhash_chain64(root, t, 64, 16, chain, 4), 4);

    router_kv_weights_init(&wt);
    c[0].load = 10;
    c[1].load = 10;
    c[2].load = 0;
    BT_ASSERT_EQ(router_kv_pick(idx, c, 3, chain, 4, 16, &wt, &ov), 0);
    BT_ASSERT_EQ(ov, 4);
    /* worker 0 busy: 64 - 100 < 32 - 10 */
    c[0].load = 100;
    BT_ASSERT_EQ(router_kv_pick(idx, c, 3, chain, 4, 16, &wt, &ov), 1);
    BT_ASSERT_EQ(ov, 2);
    /* overlap weight 0: least loaded */
    wt.w_overlap = 0;
    BT_ASSERT_EQ(router_kv_pick(idx, c, 3, chain, 4, 16, &wt, &ov), 2);
    BT_ASSERT_EQ(ov, 0);
    /* load weight 0: most overlap whatever the load */
    wt.w_overlap = 1;
    wt.w_load = 0;
    BT_ASSERT_EQ(router_kv_pick(idx, c, 3, chain, 4, 16, &wt, &ov), 0);
    /* ties: the lower load, then the earlier candidate */
    router_kv_weights_init(&wt);
    c[0].load = 32 + 5; /* 64 - 37 = 27 */
    c[1].load = 5;      /* 32 - 5 = 27 */
    BT_ASSERT_EQ(router_kv_pick(idx, c, 2, chain, 4, 16, &wt, NULL), 1);
    BT_ASSERT_EQ(router_kv_pick(idx, c, 0, chain, 4, 16, &wt, &ov), -1);
    /* from tokens: the same choices, chain computed per identity */
    c[0].load = 10;
    c[1].load = 10;
    BT_ASSERT_OK(router_kv_pick_tokens(idx, c, 3, "", 0, t, 64, NULL, &wt,
                                       &pick, &ov));
    BT_ASSERT_EQ(pick, 0);
    BT_ASSERT_EQ(ov, 4);
    /* another tenant's prompt overlaps nowhere: least loaded wins */
    BT_ASSERT_OK(router_kv_pick_tokens(idx, c, 3, "z", 1, t, 64, NULL, &wt,
                                       &pick, &ov));
    BT_ASSERT_EQ(pick, 2);
    BT_ASSERT_EQ(ov, 0);
    for (int i = 0; i < 3; i++)
        worker_stop(&w[i]);
    router_kvindex_destroy(&idx);
    BT_TEST_PASS("kv-aware scoring: overlap against load, ties");
}

/* Cost of one overlap lookup per block, and of a whole pick from tokens
 * (hash chain + lookups) across 8 workers. */
static void bench(void)
{
    enum { BS = 16, N = 4096, WORKERS = 8, ROUNDS = 50 };
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    int *t = malloc(sizeof(int) * N * BS);
    uint64_t *chain = malloc(sizeof(uint64_t) * N);
    router_kvindex_event_t ev = { BATON__KV_EVENT_TYPE__KV_EVENT_STORED, 1,
                                  N, NULL };
    router_kv_candidate_t c[WORKERS];
    router_kv_weights_t wt;
    router_kvindex_result_t res;
    bt_blockhash_t id = bt_blockhash_identity(BS, "bench", "bf16");
    uint64_t t0, best_overlap = UINT64_MAX, best_pick = UINT64_MAX;
    int pick, ov;
    Baton__KvEvents msg = BATON__KV_EVENTS__INIT;
    uint8_t id_bytes[16];

    BT_CHECK(t != NULL && chain != NULL);
    for (int i = 0; i < N * BS; i++)
        t[i] = i % 30000;
    BT_ASSERT_EQ(bt_blockhash_chain64(bt_blockhash_root(id, "", 0), t,
                                      N * BS, BS, chain, N), N);
    ev.hashes = chain;
    router_kvindex_config_init(&cfg);
    cfg.max_workers = WORKERS;
    BT_ASSERT_OK(router_kvindex_create(&cfg, &idx));
    for (int k = 0; k < 8; k++) {
        id_bytes[k] = (uint8_t)(id.lo >> (8 * k));
        id_bytes[8 + k] = (uint8_t)(id.hi >> (8 * k));
    }
    msg.instance = 1;
    msg.seq_first = 1;
    msg.has_identity = 1;
    msg.identity.len = 16;
    msg.identity.data = id_bytes;
    msg.has_block_size = 1;
    msg.block_size = BS;
    for (int w = 0; w < WORKERS; w++) {
        /* worker w holds the first (w + 1) / WORKERS of the chain */
        ev.n_hashes = N * (w + 1) / WORKERS;
        BT_ASSERT_OK(router_kvindex_apply_msg(idx, w, &msg, &res));
        BT_ASSERT_OK(router_kvindex_apply(idx, w, 1, 1, false, 1, &ev,
                                          &res));
        BT_ASSERT_EQ(res, ROUTER_KVINDEX_APPLIED);
        c[w].worker = w;
        c[w].load = 0;
    }
    router_kv_weights_init(&wt);
    for (int r = 0; r < ROUNDS; r++) {
        t0 = bt_time_ns();
        BT_ASSERT_EQ(router_kvindex_overlap(idx, WORKERS - 1, chain, N), N);
        best_overlap = BT_MIN(best_overlap, bt_time_ns() - t0);
        t0 = bt_time_ns();
        BT_ASSERT_OK(router_kv_pick_tokens(idx, c, WORKERS, "", 0, t,
                                           N * BS, NULL, &wt, &pick, &ov));
        best_pick = BT_MIN(best_pick, bt_time_ns() - t0);
        BT_ASSERT_EQ(pick, WORKERS - 1);
        BT_ASSERT_EQ(ov, N);
    }
    printf("router_kvindex_bench: overlap_ns_per_block:%.1f "
           "pick_us_%d_tokens_%d_workers:%.1f\n",
           (double)best_overlap / N, N * BS, WORKERS,
           (double)best_pick / 1000.0);
    router_kvindex_destroy(&idx);
    free(chain);
    free(t);
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    bt_log_init("test");
    test_siphash_vectors();
    test_chain_properties();
    test_chain_property();
    test_sequence_gap_resync();
    test_salt_isolation();
    test_random_stream();
    test_malformed();
    test_weights();
    test_scoring();
    bench();
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
