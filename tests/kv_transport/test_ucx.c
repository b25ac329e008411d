/*
 * test_ucx.c - the UCX KV transport over real UCX on loopback, two
 * processes (fork): the parent is the decode side (registers pools and
 * checks bytes), the child the prefill side (connects and puts).  They
 * talk over a socketpair: the child sends the descriptor-driven steps,
 * the parent checks every byte of both pools after each commit.
 *
 * Transports: UCX_TLS defaults to "tcp,sm,self" here (no InfiniBand in
 * CI); an UCX_TLS already in the environment wins.  Every wait is bounded
 * and alarm() guards both processes.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport.h"

#define WAIT_MS 10000
#define N_SLOTS 8
#define SENTINEL 0xEEu

/* Second pass: pool 0 allocated by kv_ucx_mem_alloc (shared memory, true
 * one-sided puts on one host) and endpoints without peer error handling,
 * the fast single-host configuration.  First pass: malloc'ed pools and
 * peer error handling (UCX software RMA over tcp). */
static bool g_fast;

static kv_ucx_config_t test_config(void)
{
    kv_ucx_config_t cfg;
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = !g_fast;
    return cfg;
}

enum {
    MSG_DESC = 1,   /* parent -> child: descriptor bytes follow */
    MSG_CHECK,      /* child -> parent: wait for slot/epoch, verify step */
    MSG_STALE,      /* child -> parent: check slot holds a stale epoch */
    MSG_RESET,      /* child -> parent: reset a slot */
    MSG_REPLY,      /* parent -> child: arg = 0 ok, else failure */
    MSG_BYE         /* child -> parent: finished */
};

typedef struct {
    int op;          /* MSG_* */
    int pool;        /* 0: one-array pool, 1: per-layer arrays pool */
    int step;        /* which put scenario to verify */
    int slot;        /* reservation slot */
    uint64_t epoch;  /* expected epoch */
    uint64_t len;    /* bytes following (MSG_DESC) */
} msg_t;

static const kv_layout_t dst_layout = {
    .n_layers = 4, .n_blocks = 64, .block_size = 4, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4
};
static const kv_layout_t src_layout = {
    .n_layers = 4, .n_blocks = 48, .block_size = 4, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4
};

static size_t block_bytes(void)
{
    return (size_t)dst_layout.block_size * dst_layout.n_kv_heads *
           dst_layout.head_dim * dst_layout.elem_size;
}

// ----------------------------------------------------------------------------
// Scenarios: (src, dst) block lists, known to both processes

typedef struct {
    int n;
    int src[512];
    int dst[512];
    int runs; /* expected coalesced runs per layer per K/V */
} scenario_t;

static void scenario_get(int step, scenario_t *s)
{
    memset(s, 0, sizeof(*s));
    if (step == 0) {
        /* runs: [3,4,5]->[7,8,9], [9,10]->[2,3], [20]->[15], [0,1]->[30,31],
         * [11]->[40], [12]->[50] (src consecutive but dst not),
         * [30]->[51], [32]->[52] (dst consecutive but src not). */
        static const int src[] = { 3, 4, 5, 9, 10, 20, 0, 1, 11, 12, 30, 32 };
        static const int dst[] = { 7, 8, 9, 2, 3, 15, 30, 31, 40, 50, 51,
                                   52 };
        s->n = (int)BT_ARRAY_SIZE(src);
        memcpy(s->src, src, sizeof(src));
        memcpy(s->dst, dst, sizeof(dst));
        s->runs = 8;
    } else if (step == 1) {
        /* One long run: the contiguous case. */
        s->n = 16;
        for (int i = 0; i < 16; i++) {
            s->src[i] = 32 + i;
            s->dst[i] = 10 + i;
        }
        s->runs = 1;
    } else {
        /* Many puts in flight: every block to a scattered destination,
         * no two adjacent (stride 5 mod 64 is a permutation). */
        s->n = 48;
        for (int i = 0; i < 48; i++) {
            s->src[i] = 47 - i;
            s->dst[i] = (i * 5) % 64;
        }
        s->runs = 48;
    }
}

/* Byte j of source block b, layer l, K (kv=0) or V (kv=1), in pool p. */
static uint8_t pattern(int step, int kv, int layer, int b, size_t j)
{
    uint64_t z = ((uint64_t)step << 48) ^ ((uint64_t)kv << 40) ^
                 ((uint64_t)layer << 32) ^ ((uint64_t)b << 16) ^ j;
    z = (z ^ (z >> 31)) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    return (uint8_t)(z == SENTINEL ? 0 : z);
}

// ----------------------------------------------------------------------------
// Socket helpers

static void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t r = write(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            BT_TEST_FAIL("write: %s", strerror(errno));
        b += r;
        n -= (size_t)r;
    }
}

/* Reads exactly n bytes, progressing UCX while waiting (bounded). */
static void recv_all(kv_ucx_t *ctx, int fd, void *p, size_t n)
{
    uint8_t *b = p;
    uint64_t deadline = bt_time_ns() + (uint64_t)WAIT_MS * 1000000 * 3;
    while (n > 0) {
        struct pollfd pfd[2] = { { fd, POLLIN, 0 },
                                 { kv_ucx_event_fd(ctx), POLLIN, 0 } };
        ssize_t r;
        kv_ucx_progress(ctx);
        if (bt_time_ns() > deadline)
            BT_TEST_FAIL("timed out waiting for the other process");
        if (kv_ucx_arm(ctx) != BT_OK)
            continue;
        if (poll(pfd, 2, 100) < 0 && errno != EINTR)
            BT_TEST_FAIL("poll: %s", strerror(errno));
        if (!(pfd[0].revents & (POLLIN | POLLHUP)))
            continue;
        r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            BT_TEST_FAIL("peer process closed the socket");
        b += r;
        n -= (size_t)r;
    }
}

// ----------------------------------------------------------------------------
// Decode side (parent)

typedef struct {
    uint8_t *k[8];      /* per-layer K base */
    uint8_t *v[8];      /* per-layer V base */
    uint8_t *owner[2];  /* one-array pool: K and V arrays */
    uint8_t *written;   /* (n_layers, n_blocks) 1 if a step wrote it */
    int expect_step[8 * 64]; /* which step last wrote (layer, block) */
    int expect_src[8 * 64];  /* from which source block */
    kv_ucx_pool_t *pool;
} dpool_t;

static void dpool_init(kv_ucx_t *ctx, dpool_t *dp, bool one_array)
{
    size_t lb = block_bytes() * (size_t)dst_layout.n_blocks;
    int L = dst_layout.n_layers;

    memset(dp, 0, sizeof(*dp));
    if (one_array && g_fast) {
        BT_ASSERT_OK(kv_ucx_mem_alloc(ctx, lb * (size_t)L, KV_UCX_MEM_HOST,
                                      (void **)&dp->owner[0]));
        BT_ASSERT_OK(kv_ucx_mem_alloc(ctx, lb * (size_t)L, KV_UCX_MEM_HOST,
                                      (void **)&dp->owner[1]));
    } else if (one_array) {
        dp->owner[0] = bt_malloc_aligned(lb * (size_t)L, "test_kv");
        dp->owner[1] = bt_malloc_aligned(lb * (size_t)L, "test_kv");
    }
    if (one_array) {
        memset(dp->owner[0], SENTINEL, lb * (size_t)L);
        memset(dp->owner[1], SENTINEL, lb * (size_t)L);
        for (int l = 0; l < L; l++) {
            dp->k[l] = dp->owner[0] + (size_t)l * lb;
            dp->v[l] = dp->owner[1] + (size_t)l * lb;
        }
    } else {
        /* Separate arrays, V before K, gaps between: many regions. */
        for (int l = 0; l < L; l++) {
            dp->v[l] = bt_malloc_aligned(lb + 4096, "test_kv");
            dp->k[l] = bt_malloc_aligned(lb + 4096, "test_kv");
            memset(dp->k[l], SENTINEL, lb);
            memset(dp->v[l], SENTINEL, lb);
        }
    }
    for (int i = 0; i < 8 * 64; i++)
        dp->expect_step[i] = -1;
    BT_ASSERT_OK(kv_ucx_pool_register(ctx, &dst_layout, (void **)dp->k,
                                      (void **)dp->v, KV_UCX_MEM_HOST,
                                      N_SLOTS, &dp->pool));
}

static void dpool_cleanup(kv_ucx_t *ctx, dpool_t *dp)
{
    kv_ucx_pool_deregister(&dp->pool);
    if (dp->owner[0] != NULL && g_fast) {
        kv_ucx_mem_free(ctx, (void **)&dp->owner[0]);
        kv_ucx_mem_free(ctx, (void **)&dp->owner[1]);
        BT_CHECK(dp->owner[0] == NULL);
    } else if (dp->owner[0] != NULL) {
        bt_free(dp->owner[0]);
        bt_free(dp->owner[1]);
    } else {
        for (int l = 0; l < dst_layout.n_layers; l++) {
            bt_free(dp->k[l]);
            bt_free(dp->v[l]);
        }
    }
}

/* Checks every byte of the pool against what the steps so far wrote and
 * the sentinel elsewhere.  Returns the number of bad blocks. */
static int dpool_verify(dpool_t *dp)
{
    size_t bb = block_bytes();
    int bad = 0;
    for (int l = 0; l < dst_layout.n_layers; l++) {
        for (int b = 0; b < dst_layout.n_blocks; b++) {
            int e = l * 64 + b;
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *p = (kv ? dp->v[l] : dp->k[l]) + b * bb;
                for (size_t j = 0; j < bb; j++) {
                    uint8_t want = dp->expect_step[e] < 0
                                       ? SENTINEL
                                       : pattern(dp->expect_step[e], kv, l,
                                                 dp->expect_src[e], j);
                    if (p[j] != want) {
                        if (bad < 5)
                            fprintf(stderr, "layer %d block %d %c byte %zu:"
                                    " %02x != %02x\n", l, b, kv ? 'V' : 'K',
                                    j, p[j], want);
                        bad++;
                        break;
                    }
                }
            }
        }
    }
    return bad;
}

static void dpool_expect(dpool_t *dp, int step)
{
    scenario_t s;
    scenario_get(step, &s);
    for (int l = 0; l < dst_layout.n_layers; l++) {
        for (int i = 0; i < s.n; i++) {
            dp->expect_step[l * 64 + s.dst[i]] = step;
            dp->expect_src[l * 64 + s.dst[i]] = s.src[i];
        }
    }
}

static int run_decode(int fd)
{
    kv_ucx_t *ctx = NULL;
    dpool_t pools[2];
    kv_ucx_config_t cfg = test_config();
    msg_t m, reply;

    BT_ASSERT_OK(kv_ucx_create(&cfg, &ctx));
    dpool_init(ctx, &pools[0], true);
    dpool_init(ctx, &pools[1], false);
    for (int p = 0; p < 2; p++) {
        size_t len;
        const uint8_t *d = kv_ucx_pool_desc(pools[p].pool, &len);
        memset(&m, 0, sizeof(m));
        m.op = MSG_DESC;
        m.pool = p;
        m.len = len;
        send_all(fd, &m, sizeof(m));
        send_all(fd, d, len);
    }
    for (;;) {
        dpool_t *dp;
        recv_all(ctx, fd, &m, sizeof(m));
        if (m.op == MSG_BYE)
            break;
        memset(&reply, 0, sizeof(reply));
        reply.op = MSG_REPLY;
        dp = &pools[m.pool];
        if (m.op == MSG_RESET) {
            kv_ucx_pool_slot_reset(dp->pool, m.slot);
        } else if (m.op == MSG_STALE) {
            /* A stale epoch has landed; the reservation must not look
             * complete for the current one. */
            kv_ucx_progress(ctx);
            if (kv_ucx_pool_slot_value(dp->pool, m.slot) != m.epoch - 1 ||
                kv_ucx_pool_has_arrived(dp->pool, m.slot, m.epoch))
                reply.slot = 1;
        } else if (m.op == MSG_CHECK) {
            uint64_t deadline = bt_time_ns() + (uint64_t)WAIT_MS * 1000000;
            while (!kv_ucx_pool_has_arrived(dp->pool, m.slot, m.epoch) &&
                   bt_time_ns() < deadline)
                BT_ASSERT_OK(kv_ucx_wait(ctx, 10));
            if (!kv_ucx_pool_has_arrived(dp->pool, m.slot, m.epoch)) {
                fprintf(stderr, "slot %d holds %llu, want %llu\n", m.slot,
                        (unsigned long long)kv_ucx_pool_slot_value(
                            dp->pool, m.slot),
                        (unsigned long long)m.epoch);
                reply.slot = 1;
            } else {
                /* A wrong epoch never matches. */
                BT_CHECK(!kv_ucx_pool_has_arrived(dp->pool, m.slot,
                                                  m.epoch + 1));
                BT_CHECK(!kv_ucx_pool_has_arrived(dp->pool, m.slot, 0));
                BT_CHECK(!kv_ucx_pool_has_arrived(dp->pool, N_SLOTS,
                                                  m.epoch));
                if (m.step >= 0)
                    dpool_expect(dp, m.step);
                reply.slot = dpool_verify(dp);
                /* Slots 5..7 are never committed. */
                for (int s = 5; s < N_SLOTS; s++)
                    if (kv_ucx_pool_slot_value(dp->pool, s) != 0)
                        reply.slot++;
            }
        }
        send_all(fd, &reply, sizeof(reply));
    }
    dpool_cleanup(ctx, &pools[0]);
    dpool_cleanup(ctx, &pools[1]);
    kv_ucx_destroy(&ctx);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    return 0;
}

// ----------------------------------------------------------------------------
// Prefill side (child)

static uint8_t *src_k[4];
static uint8_t *src_v[4];

static void fill_source(int step)
{
    size_t bb = block_bytes();
    for (int l = 0; l < src_layout.n_layers; l++)
        for (int b = 0; b < src_layout.n_blocks; b++)
            for (size_t j = 0; j < bb; j++) {
                src_k[l][b * bb + j] = pattern(step, 0, l, b, j);
                src_v[l][b * bb + j] = pattern(step, 1, l, b, j);
            }
}

/* Asks the parent to check `slot`/`epoch` and step's bytes. */
static void ask(kv_ucx_t *ctx, int fd, int op, int pool, int step, int slot,
                uint64_t epoch)
{
    msg_t m = { .op = op, .pool = pool, .step = step, .slot = slot,
                .epoch = epoch };
    send_all(fd, &m, sizeof(m));
    recv_all(ctx, fd, &m, sizeof(m));
    BT_ASSERT_EQ(m.op, MSG_REPLY);
    if (m.slot != 0)
        BT_TEST_FAIL("decode side: op %d pool %d step %d slot %d failed "
                     "(%d bad)", op, pool, step, slot, m.slot);
}

static int commits_done;

static void commit_cb(void *arg, int slot, uint64_t epoch,
                      bt_status_t status)
{
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(slot, *(int *)arg);
    commits_done++;
}

/* Puts `step` into `peer` layer by layer and commits slot/epoch. */
static void put_step(kv_ucx_peer_t *peer, int step, int slot, uint64_t epoch)
{
    scenario_t s;
    uint64_t puts0 = kv_ucx_peer_puts(peer);
    static int cb_slot;
    int done0 = commits_done;

    scenario_get(step, &s);
    fill_source(step);
    for (int l = 0; l < src_layout.n_layers; l++)
        BT_ASSERT_OK(kv_ucx_put_layer(peer, l, src_k[l], src_v[l],
                                      &src_layout, KV_UCX_MEM_HOST, s.src,
                                      s.dst, s.n));
    /* Coalescing: one put per run per K/V per layer. */
    BT_ASSERT_EQ(kv_ucx_peer_puts(peer) - puts0,
                 (uint64_t)s.runs * 2 * (uint64_t)src_layout.n_layers);
    cb_slot = slot;
    BT_ASSERT_OK(kv_ucx_commit(peer, slot, epoch, commit_cb, &cb_slot));
    BT_ASSERT_EQ(commits_done, done0); /* never inside the call */
    BT_ASSERT_OK(kv_ucx_peer_wait(peer, WAIT_MS));
    BT_ASSERT_EQ(commits_done, done0 + 1);
    BT_ASSERT_EQ(kv_ucx_peer_pending(peer), 0);
}

static void check_bad_args(kv_ucx_peer_t *peer)
{
    int ok_ids[2] = { 0, 1 }, bad_src[2] = { 0, 48 }, bad_dst[2] = { 0, 64 };
    int neg[2] = { -1, 0 };
    kv_layout_t other = src_layout;

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* expected errors below */
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 4, src_k[0], src_v[0], &src_layout,
                                  KV_UCX_MEM_HOST, ok_ids, ok_ids, 2),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 0, src_k[0], src_v[0], &src_layout,
                                  KV_UCX_MEM_HOST, bad_src, ok_ids, 2),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 0, src_k[0], src_v[0], &src_layout,
                                  KV_UCX_MEM_HOST, ok_ids, bad_dst, 2),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 0, src_k[0], src_v[0], &src_layout,
                                  KV_UCX_MEM_HOST, neg, ok_ids, 2),
                 BT_ERR_INVALID_ARG);
    other.head_dim = 16;
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 0, src_k[0], src_v[0], &other,
                                  KV_UCX_MEM_HOST, ok_ids, ok_ids, 2),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_commit(peer, N_SLOTS, 1, NULL, NULL),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_commit(peer, 0, 0, NULL, NULL), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_ucx_peer_puts(peer), 0);
    BT_ASSERT_OK(kv_ucx_put_layer(peer, 0, src_k[0], src_v[0], &src_layout,
                                  KV_UCX_MEM_HOST, NULL, NULL, 0));
    bt_log_set_level(BT_LOG_LEVEL_WARN);
}

static void check_corrupt(kv_ucx_t *ctx, const uint8_t *desc, size_t len)
{
    uint8_t *bad = bt_malloc(len + 16, "test");
    kv_ucx_desc_t *d = NULL;
    kv_ucx_peer_t *peer = NULL;

    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    BT_ASSERT_OK(kv_ucx_desc_parse(desc, len, &d));
    BT_ASSERT_EQ(kv_ucx_desc_layout(d)->n_blocks, 64);
    BT_ASSERT_EQ(kv_ucx_desc_n_slots(d), N_SLOTS);
    BT_ASSERT_NE(kv_ucx_desc_pool_id(d), 0);
    kv_ucx_desc_destroy(&d);
    BT_CHECK(d == NULL);
    /* Every single-bit flip and every truncation is rejected. */
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(bad, desc, len);
            bad[i] ^= (uint8_t)(1u << bit);
            if (kv_ucx_desc_parse(bad, len, &d) != BT_ERR_FORMAT)
                BT_TEST_FAIL("flip of byte %zu bit %d accepted", i, bit);
        }
    }
    for (size_t n = 0; n < len; n += (n < 100 ? 1 : 7))
        BT_ASSERT_EQ(kv_ucx_desc_parse(desc, n, &d), BT_ERR_FORMAT);
    memcpy(bad, desc, len);
    memset(bad + len, 0, 16);
    BT_ASSERT_EQ(kv_ucx_desc_parse(bad, len + 16, &d), BT_ERR_FORMAT);
    bad[4] = KV_UCX_DESC_VERSION + 1;
    BT_ASSERT_EQ(kv_ucx_desc_parse(bad, len, &d), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "version") != NULL);
    BT_ASSERT_EQ(kv_ucx_desc_parse(NULL, 0, &d), BT_ERR_FORMAT);
    memcpy(bad, desc, len);
    bad[len / 2] ^= 0x40;
    BT_ASSERT_EQ(kv_ucx_connect(ctx, bad, len, &peer), BT_ERR_FORMAT);
    BT_CHECK(peer == NULL);
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    bt_free(bad);
}

static int run_prefill(int fd)
{
    size_t lb = block_bytes() * (size_t)src_layout.n_blocks;
    uint8_t *desc[2];
    size_t desc_len[2];
    kv_ucx_peer_t *peer[2], *again;
    kv_ucx_t *ctx = NULL;
    kv_ucx_config_t cfg = test_config();
    msg_t m;

    BT_ASSERT_OK(kv_ucx_create(&cfg, &ctx));
    for (int p = 0; p < 2; p++) {
        recv_all(ctx, fd, &m, sizeof(m));
        BT_ASSERT_EQ(m.op, MSG_DESC);
        BT_ASSERT_EQ(m.pool, p);
        BT_CHECK(m.len > 0 && m.len <= KV_UCX_DESC_MAX_BYTES);
        desc_len[p] = m.len;
        desc[p] = bt_malloc(m.len, "test");
        recv_all(ctx, fd, desc[p], m.len);
    }
    for (int l = 0; l < src_layout.n_layers; l++) {
        src_k[l] = bt_malloc_aligned(lb, "test_src");
        src_v[l] = bt_malloc_aligned(lb, "test_src");
    }

    check_corrupt(ctx, desc[0], desc_len[0]);
    BT_ASSERT_OK(kv_ucx_connect(ctx, desc[0], desc_len[0], &peer[0]));
    BT_ASSERT_OK(kv_ucx_connect(ctx, desc[1], desc_len[1], &peer[1]));
    BT_CHECK(peer[0] != peer[1]);
    /* The cache: the same descriptor gives the same peer. */
    BT_ASSERT_OK(kv_ucx_connect(ctx, desc[0], desc_len[0], &again));
    BT_CHECK(again == peer[0]);
    kv_ucx_disconnect(&again);
    BT_CHECK(again == NULL);
    check_bad_args(peer[0]);

    /* Scattered runs, then contiguous, then many small puts in flight,
     * into both pools; every byte checked after each commit. */
    for (int p = 0; p < 2; p++) {
        put_step(peer[p], 0, 0, 100 + (uint64_t)p);
        ask(ctx, fd, MSG_CHECK, p, 0, 0, 100 + (uint64_t)p);
        put_step(peer[p], 1, 2, 200);
        ask(ctx, fd, MSG_CHECK, p, 1, 2, 200);
        put_step(peer[p], 2, 3, 300);
        ask(ctx, fd, MSG_CHECK, p, 2, 3, 300);
    }

    /* Epochs: slot 1 is granted with epoch 501; a stale writer of epoch
     * 500 commits into it; the reservation must not look complete. */
    ask(ctx, fd, MSG_RESET, 0, -1, 1, 0);
    BT_ASSERT_OK(kv_ucx_commit(peer[0], 1, 500, NULL, NULL));
    BT_ASSERT_OK(kv_ucx_peer_wait(peer[0], WAIT_MS));
    ask(ctx, fd, MSG_STALE, 0, -1, 1, 501);
    BT_ASSERT_OK(kv_ucx_commit(peer[0], 1, 501, NULL, NULL));
    BT_ASSERT_OK(kv_ucx_peer_wait(peer[0], WAIT_MS));
    ask(ctx, fd, MSG_CHECK, 0, -1, 1, 501);
    /* Freed, then reused with 502: the old value is gone. */
    ask(ctx, fd, MSG_RESET, 0, -1, 1, 0);
    ask(ctx, fd, MSG_STALE, 0, -1, 1, 1);

    /* Many operations in flight at once: every layer of every step to
     * both pools, many commits, then one wait. */
    commits_done = 0;
    for (int round = 0; round < 20; round++) {
        scenario_t s;
        static int slot_arg;
        scenario_get(2, &s);
        for (int p = 0; p < 2; p++) {
            for (int l = 0; l < src_layout.n_layers; l++)
                BT_ASSERT_OK(kv_ucx_put_layer(peer[p], l, src_k[l], src_v[l],
                                              &src_layout, KV_UCX_MEM_HOST,
                                              s.src, s.dst, s.n));
            slot_arg = 4;
            BT_ASSERT_OK(kv_ucx_commit(peer[p], 4, 1000 + (uint64_t)round,
                                       commit_cb, &slot_arg));
        }
    }
    BT_CHECK(kv_ucx_peer_pending(peer[0]) + kv_ucx_peer_pending(peer[1]) >=
             40);
    BT_ASSERT_OK(kv_ucx_peer_wait(peer[0], WAIT_MS));
    BT_ASSERT_OK(kv_ucx_peer_wait(peer[1], WAIT_MS));
    BT_ASSERT_EQ(commits_done, 40);
    ask(ctx, fd, MSG_CHECK, 0, 2, 4, 1019);
    ask(ctx, fd, MSG_CHECK, 1, 2, 4, 1019);

    BT_ASSERT_OK(kv_ucx_peer_status(peer[0]));
    kv_ucx_disconnect(&peer[0]);
    kv_ucx_disconnect(&peer[1]);
    memset(&m, 0, sizeof(m));
    m.op = MSG_BYE;
    send_all(fd, &m, sizeof(m));
    for (int l = 0; l < src_layout.n_layers; l++) {
        bt_free(src_k[l]);
        bt_free(src_v[l]);
    }
    bt_free(desc[0]);
    bt_free(desc[1]);
    kv_ucx_destroy(&ctx);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    return 0;
}

static void run_pass(void)
{
    int sv[2], wstatus = 0, rc;
    pid_t pid;

    BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(50);
        _exit(run_prefill(sv[1]));
    }
    close(sv[1]);
    alarm(55);
    rc = run_decode(sv[0]);
    alarm(0);
    close(sv[0]);
    BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        BT_TEST_FAIL("prefill process failed (status 0x%x)", wstatus);
    BT_ASSERT_EQ(rc, 0);
}

int main(int argc, char **argv)
{
#if defined(__SANITIZE_THREAD__)
    /* UCX's memory hooks (UCM, installed when the library loads) crash
     * inside ThreadSanitizer's interceptors: run again without them. */
    if (argc > 0 && getenv("UCX_MEM_EVENTS") == NULL) {
        setenv("UCX_MEM_EVENTS", "no", 1);
        execv("/proc/self/exe", argv);
    }
#endif
    (void)argc;
    (void)argv;
    bt_log_init("test_kv_ucx");
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    setenv("UCX_TLS", "tcp,sm,self", 0);
    signal(SIGPIPE, SIG_IGN);
    g_fast = false;
    run_pass();
    g_fast = true;
    run_pass();
    BT_TEST_PASS("kv_transport/ucx");
    return 0;
}
