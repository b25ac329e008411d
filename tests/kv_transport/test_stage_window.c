/*
 * test_stage_window.c - per-reservation receive windows of the staged UCX
 * link (kv_transport_stage.h "Receive windows", issue 42 item 3) over real
 * UCX on loopback, one process with two UCX contexts: "decode" runs a
 * receiver with windows into a host-memory stand-in for its device pool
 * (kv_stage_ops_host, threaded copies), "prefill" a staged sender.
 *
 *   1. The receiver registers no receive area: its descriptor says
 *      "windowed", and a hand-off into area ids is refused; windows and
 *      direct receive together are refused at create.
 *   2. A hand-off through a window: chunks larger and smaller than a
 *      staging buffer, scattered device blocks; every byte of the pool is
 *      checked (the reserved blocks hold the source, the rest is
 *      untouched); the window is unmapped once the last copy is done, and
 *      the whole budget of receive blocks is free again.
 *   3. Window descriptors are untrusted: every single-byte change, a
 *      truncation, none at all, and a window smaller than the hand-off
 *      are refused before anything is put.
 *   4. A stale key: reservation A's writer attaches A's window, A is
 *      cancelled (the window is unmapped: revoked, no quarantine), B is
 *      granted on the same slot and the same device blocks; B's KV is put
 *      and committed, then the stale writer writes garbage with A's key
 *      before the decode side copies B in: B's blocks are exact.  A
 *      window unmapped before any writer attached it is refused.
 *   5. Forged and stale commits (the staged link's per-layer commits are
 *      messages the decode worker checks): a commit of a live window's
 *      layer with a wrong token, epoch or slot, and A's commit after A
 *      ended, are refused, answered (the writer's commit fails at once)
 *      and counted; no arrival word moves.
 *
 * The decode context runs without RMA, as the decode worker does: the
 * whole test runs twice, in a child process each, on shared memory
 * ("tcp,sm,self", where window puts need no target code) and on
 * UCX_TLS=tcp (window data and commits by checked messages; a window
 * gone before its writer started fails the hand-off at its first
 * commit).  Every wait is bounded.
 * Run: ctest -R kv_transport/test_stage_window (about a second).
 * `test_stage_window bench` prints what the checked commits cost instead
 * (docs/SECURITY.md section 5).
 */
#include <sys/resource.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport_stage.h"
#include "ucx_window_util.h"

#define SENTINEL 0xEEu
#define RECV_BLOCKS 16

/* decode "device" pool and prefill pool: same block shape */
static const kv_layout_t dev_layout = {
    .n_layers = 4, .n_blocks = 32, .block_size = 4, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4,
};
static const kv_layout_t src_layout = {
    .n_layers = 4, .n_blocks = 24, .block_size = 4, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4,
};

static uint8_t *dev_k[4], *dev_v[4]; /* (n_blocks * bb) per layer */
static uint8_t *src_k[4], *src_v[4];
static size_t bb;

/* The source byte of (layer, K|V, block, j) for hand-off `tag`. */
static uint8_t pattern(int tag, int layer, int kv, int block, size_t j)
{
    return (uint8_t)(tag * 31 + layer * 7 + kv * 3 + block * 5 + (int)j);
}

static void fill_source(int tag)
{
    for (int l = 0; l < src_layout.n_layers; l++)
        for (int b = 0; b < src_layout.n_blocks; b++)
            for (size_t j = 0; j < bb; j++) {
                src_k[l][(size_t)b * bb + j] = pattern(tag, l, 0, b, j);
                src_v[l][(size_t)b * bb + j] = pattern(tag, l, 1, b, j);
            }
}

static void reset_pool(void)
{
    for (int l = 0; l < dev_layout.n_layers; l++) {
        memset(dev_k[l], SENTINEL, (size_t)dev_layout.n_blocks * bb);
        memset(dev_v[l], SENTINEL, (size_t)dev_layout.n_blocks * bb);
    }
}

/* Device block dev[i] holds source block src[i] of hand-off `tag`; every
 * other block still holds the sentinel. */
static void check_pool(const int *src, const int *dev, int n, int tag)
{
    for (int l = 0; l < dev_layout.n_layers; l++)
        for (int b = 0; b < dev_layout.n_blocks; b++) {
            int from = -1;
            for (int i = 0; i < n; i++)
                if (dev[i] == b)
                    from = src[i];
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *p = (kv ? dev_v : dev_k)[l] + (size_t)b * bb;
                for (size_t j = 0; j < bb; j++) {
                    uint8_t want = from < 0 ? SENTINEL
                                            : pattern(tag, l, kv, from, j);
                    if (p[j] != want)
                        BT_TEST_FAIL("layer %d %c block %d byte %zu: %u, "
                                     "want %u (from %d)", l, kv ? 'V' : 'K',
                                     b, j, p[j], want, from);
                }
            }
        }
}

/* Queues every layer of x and progresses the sender (and the decode
 * context, for software RMA) until x is done; the receiver is NOT
 * progressed, so nothing is copied in yet. */
static void send_all(kv_stage_send_t *send, kv_stage_xfer_t *x)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    for (int l = 0; l < src_layout.n_layers; l++)
        BT_ASSERT_OK(kv_stage_xfer_layer(x, l, src_k[l], src_v[l]));
    while (kv_stage_xfer_status(x) == BT_IN_PROGRESS) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("the staged transfer did not finish");
        kv_stage_send_progress(send);
        kv_ucx_progress(dctx);
    }
    BT_ASSERT_OK(kv_stage_xfer_status(x));
}

/* Progresses the receiver until slot's KV is in the pool. */
static void receive(kv_stage_recv_t *recv, int slot)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;
    bt_status_t st;

    while ((st = kv_stage_recv_poll(recv, slot)) == BT_IN_PROGRESS) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("slot %d: %d layers after %d ms", slot,
                         kv_stage_recv_layers_arrived(recv, slot), WAIT_MS);
        uw_progress_both();
    }
    BT_ASSERT_OK(st);
}

/* What check_refused begins a hand-off with. */
typedef struct {
    kv_stage_send_t *send;
    kv_stage_peer_t *peer;
    const int *src;
    int n;
} begin_args_t;

static bt_status_t begin_window(void *arg, const uint8_t *desc, size_t len)
{
    const begin_args_t *a = arg;
    kv_stage_xfer_t *x = NULL;
    bt_status_t status = kv_stage_xfer_begin_window(a->send, a->peer, 3, 77,
                                                    a->src, a->n, desc, len,
                                                    &x);

    kv_stage_xfer_destroy(&x);
    return status;
}

/* Every corrupted form of a window descriptor is refused. */
static void check_refused(kv_stage_send_t *send, kv_stage_peer_t *peer,
                          const uint8_t *desc, size_t len, int n,
                          const int *src)
{
    begin_args_t a = { send, peer, src, n };
    kv_stage_xfer_t *x = NULL;

    uw_check_each_byte(desc, len, begin_window, &a);
    BT_CHECK(kv_stage_xfer_begin_window(send, peer, 3, 77, src, n, desc,
                                        len - 1, &x) != BT_OK);
    BT_CHECK(kv_stage_xfer_begin_window(send, peer, 3, 77, src, n, NULL, 0,
                                        &x) != BT_OK);
    /* a window of n blocks does not carry n + 1 (src has n + 1 ids) */
    BT_ASSERT_EQ(kv_stage_xfer_begin_window(send, peer, 3, 77, src, n + 1,
                                            desc, len, &x),
                 BT_ERR_FORMAT);
    BT_CHECK(x == NULL);
    bt_error_clear();
}

/* Commits layer `layer` through `rw` and progresses both sides until
 * the decode worker answered; returns its answer. */
static bt_status_t commit_layer(kv_ucx_peer_t *up, kv_ucx_rwindow_t *rw,
                                int layer)
{
    bt_status_t st = BT_IN_PROGRESS;
    char what[32];

    snprintf(what, sizeof(what), "a commit of layer %d", layer);
    BT_ASSERT_OK(kv_ucx_commit_window_layer(up, rw, layer, uw_commit_cb,
                                            &st));
    return uw_wait_answer(&st, what);
}

/* Progresses both sides for 50 ms: messages of a hand-off that already
 * failed still arrive (and are refused) a little later. */
static void drain(void)
{
    uint64_t until = bt_time_ns() + 50000000ull;

    while (bt_time_ns() < until)
        uw_progress_both();
}

/* A forged commit of every layer of `slot`'s live window (descriptor
 * `wd`, byte `at` of it changed to `value`): each refused and counted,
 * no layer of the slot arrived. */
static void forged_commit(kv_stage_recv_t *recv, kv_ucx_peer_t *up, int slot,
                          const uint8_t *wd, size_t len, size_t at,
                          uint64_t value, int bytes, const char *what)
{
    uint8_t d[512];
    kv_ucx_rwindow_t *rw = NULL;
    uint64_t before;

    drain();
    before = kv_ucx_writes_refused(dctx);
    BT_CHECK(len <= sizeof(d));
    memcpy(d, wd, len);
    if (bytes == 4)
        uw_set_u32(d + at, (uint32_t)value);
    else if (bytes == 8)
        uw_set_u64(d + at, value);
    else
        d[at] ^= (uint8_t)value;
    bt_fnv1a64_seal(d, len);
    BT_ASSERT_OK(kv_ucx_window_open(up, d, len, &rw));
    for (int l = 0; l < dev_layout.n_layers; l++)
        BT_ASSERT_EQ(commit_layer(up, rw, l), BT_ERR_REMOTE);
    kv_ucx_window_close(&rw);
    kv_stage_recv_progress(recv);
    BT_ASSERT_EQ(kv_stage_recv_layers_arrived(recv, slot), 0);
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before,
                 (uint64_t)dev_layout.n_layers);
    fprintf(stderr, "forged commit (%s): refused, answered, counted\n",
            what);
}

static int scenario(bool tcp)
{
    kv_ucx_config_t ucfg;
    kv_stage_recv_config_t rc;
    kv_stage_send_config_t sc;
    kv_stage_recv_t *recv = NULL, *bad_recv = NULL;
    kv_stage_send_t *send = NULL;
    kv_stage_peer_t *peer = NULL;
    kv_stage_xfer_t *x = NULL;
    kv_ucx_peer_t *up = NULL;
    kv_ucx_rwindow_t *stale = NULL, *late = NULL;
    void *k_layers[4], *v_layers[4];
    uint8_t a_desc[512], *junk;
    size_t a_len, len;
    const uint8_t *desc, *wd;
    int dst[RECV_BLOCKS], ids[RECV_BLOCKS];
    /* scattered device blocks with runs; 7 > 3 staging blocks: chunks */
    const int src1[7] = { 2, 3, 4, 9, 1, 0, 23 };
    const int dev1[7] = { 30, 31, 5, 6, 7, 12, 0 };
    const int srcA[6] = { 10, 11, 12, 13, 14, 15 };
    const int devA[5] = { 20, 21, 22, 8, 9 };

    bb = kv_layout_block_bytes(&dev_layout);
    for (int l = 0; l < 4; l++) {
        dev_k[l] = bt_malloc((size_t)dev_layout.n_blocks * bb, "test");
        dev_v[l] = bt_malloc((size_t)dev_layout.n_blocks * bb, "test");
        src_k[l] = bt_malloc((size_t)src_layout.n_blocks * bb, "test");
        src_v[l] = bt_malloc((size_t)src_layout.n_blocks * bb, "test");
        BT_CHECK(dev_k[l] != NULL && dev_v[l] != NULL && src_k[l] != NULL &&
                 src_v[l] != NULL);
        k_layers[l] = dev_k[l];
        v_layers[l] = dev_v[l];
    }
    junk = bt_malloc((size_t)src_layout.n_blocks * bb, "test");
    BT_CHECK(junk != NULL);
    memset(junk, 0x5a, (size_t)src_layout.n_blocks * bb);
    kv_ucx_config_init(&ucfg);
    ucfg.peer_errors = false; /* shared memory: the single-host default */
    BT_ASSERT_OK(kv_ucx_create(&ucfg, &pctx));
    ucfg.rma = false; /* the decode worker's, windows need none */
    BT_ASSERT_OK(kv_ucx_create(&ucfg, &dctx));

    /* 1. a receiver with windows registers no area */
    kv_stage_recv_config_init(&rc);
    rc.layout = dev_layout;
    rc.k_layers = k_layers;
    rc.v_layers = v_layers;
    rc.recv_blocks = RECV_BLOCKS;
    rc.n_slots = 4;
    rc.ops = kv_stage_ops_host(true);
    rc.windows = true;
    rc.direct = true;
    BT_ASSERT_EQ(kv_stage_recv_create(dctx, &rc, &bad_recv),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(bad_recv == NULL);
    bt_error_clear();
    rc.direct = false;
    BT_ASSERT_OK(kv_stage_recv_create(dctx, &rc, &recv));
    kv_stage_send_config_init(&sc);
    sc.layout = src_layout;
    sc.stage_blocks = 3;
    sc.ops = kv_stage_ops_host(true);
    BT_ASSERT_OK(kv_stage_send_create(pctx, &sc, &send));
    desc = kv_stage_recv_desc(recv, &len);
    BT_ASSERT_OK(kv_stage_connect(send, desc, len, &peer));
    BT_CHECK(kv_stage_peer_info(peer)->windowed);
    BT_CHECK(!kv_stage_peer_info(peer)->direct);
    for (int i = 0; i < RECV_BLOCKS; i++)
        ids[i] = i;
    BT_ASSERT_EQ(kv_stage_xfer_begin(send, peer, 0, 5, src1, ids, 7, &x),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(x == NULL);
    bt_error_clear();
    fprintf(stderr, "a receiver with windows exposes no receive area\n");

    /* 2. a hand-off through a window */
    reset_pool();
    fill_source(1);
    BT_ASSERT_OK(kv_stage_recv_begin(recv, 1, 101, dev1, 7, dst));
    for (int i = 0; i < 7; i++)
        BT_ASSERT_EQ(dst[i], i);
    BT_ASSERT_EQ(kv_stage_recv_free_blocks(recv), RECV_BLOCKS - 7);
    wd = kv_stage_recv_window(recv, 1, &len);
    BT_CHECK(wd != NULL && len > 0);
    BT_ASSERT_OK(kv_stage_xfer_begin_window(send, peer, 1, 101, src1, 7, wd,
                                            len, &x));
    send_all(send, x);
    kv_stage_xfer_destroy(&x);
    receive(recv, 1);
    check_pool(src1, dev1, 7, 1);
    BT_CHECK(kv_stage_recv_window(recv, 1, &len) == NULL); /* unmapped */
    BT_ASSERT_EQ(kv_stage_recv_free_blocks(recv), RECV_BLOCKS);
    BT_CHECK(!kv_stage_recv_cancel(recv, 1)); /* done: nothing revoked */
    fprintf(stderr, "hand-off through a window: exact, window unmapped\n");

    /* 3. untrusted window descriptors */
    BT_ASSERT_OK(kv_stage_recv_begin(recv, 3, 301, devA, 5, dst));
    wd = kv_stage_recv_window(recv, 3, &len);
    BT_CHECK(wd != NULL);
    check_refused(send, peer, wd, len, 5, srcA);
    BT_CHECK(wd != NULL && len <= sizeof(a_desc));
    memcpy(a_desc, wd, len);
    a_len = len;
    BT_CHECK(kv_stage_recv_cancel(recv, 3)); /* mapped, never written */
    if (!tcp) {
        /* a window gone before its writer opened it: refused cleanly */
        BT_ASSERT_EQ(kv_stage_xfer_begin_window(send, peer, 3, 301, srcA, 5,
                                                a_desc, a_len, &x),
                     BT_ERR_NET);
        BT_CHECK(x == NULL);
    } else {
        /* by message nothing is attached: its first layer's commit is
         * refused and fails the hand-off at once */
        uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;
        BT_ASSERT_OK(kv_stage_xfer_begin_window(send, peer, 3, 301, srcA, 5,
                                                a_desc, a_len, &x));
        for (int l = 0; l < src_layout.n_layers; l++)
            BT_ASSERT_OK(kv_stage_xfer_layer(x, l, src_k[l], src_v[l]));
        while (kv_stage_xfer_status(x) == BT_IN_PROGRESS) {
            if (bt_time_ns() > until)
                BT_TEST_FAIL("a hand-off into a gone window did not fail");
            kv_stage_send_progress(send);
            kv_ucx_progress(dctx);
        }
        BT_ASSERT_EQ(kv_stage_xfer_status(x), BT_ERR_REMOTE);
        kv_stage_xfer_destroy(&x);
        BT_CHECK(kv_ucx_writes_refused(dctx) > 0);
    }
    bt_error_clear();
    fprintf(stderr, "bad or gone window descriptors: refused\n");

    /* 4. A's writer keeps its key past A's end */
    reset_pool();
    BT_ASSERT_OK(kv_stage_recv_begin(recv, 2, 201, devA, 5, dst));
    wd = kv_stage_recv_window(recv, 2, &a_len);
    BT_CHECK(wd != NULL && a_len <= sizeof(a_desc));
    memcpy(a_desc, wd, a_len);
    BT_ASSERT_OK(kv_ucx_connect(pctx, kv_stage_peer_info(peer)->ucx,
                                kv_stage_peer_info(peer)->ucx_len, &up));
    BT_ASSERT_OK(kv_ucx_window_open(up, a_desc, a_len, &stale));
    /* shared memory: puts into the window, which need no RMA (no code)
     * on the decode side; tcp: checked messages */
    BT_CHECK(kv_ucx_rwindow_by_message(stale) == tcp);
    BT_ASSERT_OK(kv_ucx_put_layer_window(up, stale, 0, junk, junk,
                                         &src_layout, KV_UCX_MEM_HOST, ids,
                                         5)); /* attached now */
    BT_ASSERT_OK(kv_ucx_peer_wait(up, WAIT_MS));
    /* A ends: its window is unmapped, its blocks free at once */
    BT_CHECK(kv_stage_recv_cancel(recv, 2));
    BT_ASSERT_EQ(kv_stage_recv_free_blocks(recv), RECV_BLOCKS);
    kv_stage_recv_release_quarantine(recv, 2); /* nothing quarantined */
    BT_ASSERT_EQ(kv_stage_recv_free_blocks(recv), RECV_BLOCKS);
    /* B: the same slot and device blocks, a new window */
    fill_source(2);
    BT_ASSERT_OK(kv_stage_recv_begin(recv, 2, 202, devA, 5, dst));
    wd = kv_stage_recv_window(recv, 2, &len);
    BT_CHECK(wd != NULL && (len != a_len || memcmp(wd, a_desc, len) != 0));
    /* 5. forged commits of B's layers, and A's stale one: no layer of B
     * arrives (a stale epoch put once could not make it look complete;
     * now no commit reaches an arrival word unchecked) */
    forged_commit(recv, up, 2, wd, len, 72 + 5, 0x40, 1, "wrong token");
    forged_commit(recv, up, 2, wd, len, 64, 203, 8, "wrong epoch");
    forged_commit(recv, up, 2, wd, len, 56, 1 * dev_layout.n_layers, 4,
                  "another slot");
    {
        uint64_t before;
        drain();
        before = kv_ucx_writes_refused(dctx);
        BT_ASSERT_EQ(commit_layer(up, stale, 0), BT_ERR_REMOTE);
        BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before, 1);
        kv_stage_recv_progress(recv);
        BT_ASSERT_EQ(kv_stage_recv_layers_arrived(recv, 2), 0);
        /* the API keeps whole-window and per-layer commits apart */
        BT_ASSERT_EQ(kv_ucx_commit_window(up, stale, NULL, NULL),
                     BT_ERR_INVALID_ARG);
        BT_ASSERT_EQ(kv_ucx_commit_window_layer(up, stale,
                                                dev_layout.n_layers, NULL,
                                                NULL),
                     BT_ERR_INVALID_ARG);
        bt_error_clear();
        fprintf(stderr, "stale commit after A ended: refused, counted\n");
    }
    BT_ASSERT_OK(kv_stage_xfer_begin_window(send, peer, 2, 202, srcA, 5, wd,
                                            len, &x));
    send_all(send, x); /* B's KV and epochs are in B's window */
    kv_stage_xfer_destroy(&x);
    /* the stale writer's garbage, before the decode side copies B in,
     * with the key it unpacked while A lived and with one unpacked only
     * now (refused once nobody holds A's segment; here the stale writer
     * itself still does, so it may open: it reaches the same orphan) */
    if (kv_ucx_window_open(up, a_desc, a_len, &late) != BT_OK)
        bt_error_clear();
    for (int round = 0; round < 3; round++) {
        for (int l = 0; l < src_layout.n_layers; l++) {
            if (kv_ucx_put_layer_window(up, stale, l, junk, junk,
                                        &src_layout, KV_UCX_MEM_HOST, ids,
                                        5) != BT_OK)
                bt_error_clear(); /* refused outright: also fine */
            if (late != NULL &&
                kv_ucx_put_layer_window(up, late, l, junk, junk,
                                        &src_layout, KV_UCX_MEM_HOST, ids,
                                        5) != BT_OK)
                bt_error_clear();
        }
        if (kv_ucx_peer_wait(up, 1000) != BT_OK)
            bt_error_clear();
    }
    receive(recv, 2);
    check_pool(srcA, devA, 5, 2);
    BT_CHECK(!kv_stage_recv_cancel(recv, 2));
    fprintf(stderr, "stale key after the unmap: B's blocks exact\n");

    kv_ucx_window_close(&late);
    kv_ucx_window_close(&stale);
    kv_ucx_disconnect(&up);
    kv_stage_disconnect(&peer);
    kv_stage_send_destroy(&send);
    kv_stage_recv_destroy(&recv);
    kv_ucx_destroy(&pctx);
    kv_ucx_destroy(&dctx);
    for (int l = 0; l < 4; l++) {
        bt_free(dev_k[l]);
        bt_free(dev_v[l]);
        bt_free(src_k[l]);
        bt_free(src_v[l]);
    }
    bt_free(junk);
    return 0;
}

// ---------------------------------------------------------------------------
// `test_stage_window bench`: what the checked commits cost (by hand)

/* The test model, aidreams260K (4 layers, 4 KV heads of 16, f32 on the
 * CPU backend), 2048 tokens in blocks of 16: 4 MiB of K and V. */
static const kv_layout_t model = {
    .n_layers = 4, .n_blocks = 128, .block_size = 16, .n_kv_heads = 4,
    .head_dim = 16, .elem_size = 4,
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of t[0..n). */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), cmp_double);
    return t[n / 2];
}

static void bench_commit_cb(void *arg, int slot, uint64_t epoch,
                            bt_status_t st)
{
    (void)slot;
    (void)epoch;
    BT_ASSERT_OK(st);
    (*(int *)arg)--;
}

/* The model's 4 per-layer commits of a 2048-token hand-off whose data
 * already landed, issued together, until all were answered (median ms
 * of `reps`): checked messages into a layered window on a decode
 * context without RMA, or epoch puts into a registered pool's arrival
 * words on one with RMA (the staged receive area's way). */
static double bench_commits(bool by_message, int reps)
{
    kv_ucx_config_t cfg;
    kv_ucx_t *d = NULL, *p = NULL;
    kv_ucx_pool_t *pool = NULL;
    kv_ucx_peer_t *peer = NULL;
    size_t lb = kv_layout_block_bytes(&model) * (size_t)model.n_blocks, len;
    uint8_t *mem = bt_calloc(2 * (size_t)model.n_layers, lb, "test");
    uint8_t *src = bt_malloc(lb, "test");
    void *k[4], *v[4];
    int ids[128];
    double t[64];
    const uint8_t *desc;

    BT_CHECK(mem != NULL && src != NULL && reps <= 64);
    memset(src, 7, lb);
    for (int i = 0; i < model.n_blocks; i++)
        ids[i] = i;
    for (int l = 0; l < model.n_layers; l++) {
        k[l] = mem + 2 * (size_t)l * lb;
        v[l] = mem + (2 * (size_t)l + 1) * lb;
    }
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = false;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &p));
    cfg.rma = !by_message;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &d));
    if (by_message)
        BT_ASSERT_OK(kv_ucx_pool_register_windowed(d, &model, model.n_layers,
                                                   &pool));
    else
        BT_ASSERT_OK(kv_ucx_pool_register(d, &model, k, v, KV_UCX_MEM_HOST,
                                          model.n_layers, &pool));
    desc = kv_ucx_pool_desc(pool, &len);
    BT_ASSERT_OK(kv_ucx_connect(p, desc, len, &peer));
    for (int r = 0; r < reps; r++) {
        uint64_t epoch = 1000 + (uint64_t)r, t0, until;
        kv_ucx_window_t *w = NULL;
        kv_ucx_rwindow_t *rw = NULL;
        int left = model.n_layers;

        if (by_message) {
            const uint8_t *wd;
            BT_ASSERT_OK(kv_ucx_window_create_layers(pool, 0, epoch,
                                                     model.n_blocks, &w));
            wd = kv_ucx_window_desc(w, &len);
            BT_ASSERT_OK(kv_ucx_window_open(peer, wd, len, &rw));
        }
        for (int l = 0; l < model.n_layers; l++) {
            kv_ucx_pool_slot_reset(pool, l);
            if (by_message)
                BT_ASSERT_OK(kv_ucx_put_layer_window(
                    peer, rw, l, src, src, &model, KV_UCX_MEM_HOST, ids,
                    model.n_blocks));
            else
                BT_ASSERT_OK(kv_ucx_put_layer(peer, l, src, src, &model,
                                              KV_UCX_MEM_HOST, ids, ids,
                                              model.n_blocks));
        }
        /* the data is there (over tcp: its messages handled) */
        until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;
        while (kv_ucx_peer_pending(peer) > 0 && bt_time_ns() < until) {
            kv_ucx_progress(p);
            kv_ucx_progress(d);
        }
        for (int i = 0; i < 1000; i++)
            kv_ucx_progress(d);
        t0 = bt_time_ns();
        for (int l = 0; l < model.n_layers; l++)
            BT_ASSERT_OK(by_message
                             ? kv_ucx_commit_window_layer(peer, rw, l,
                                                          bench_commit_cb,
                                                          &left)
                             : kv_ucx_commit(peer, l, epoch,
                                             bench_commit_cb, &left));
        for (;;) {
            bool all = left == 0;
            for (int l = 0; l < model.n_layers && all; l++)
                all = kv_ucx_pool_has_arrived(pool, l, epoch);
            if (all)
                break;
            if (bt_time_ns() > until)
                BT_TEST_FAIL("bench: the commits did not complete");
            kv_ucx_progress(p);
            kv_ucx_progress(d);
        }
        t[r] = (double)(bt_time_ns() - t0) * 1e-6;
        kv_ucx_window_close(&rw);
        kv_ucx_window_destroy(&w);
    }
    kv_ucx_disconnect(&peer);
    kv_ucx_pool_deregister(&pool);
    kv_ucx_destroy(&p);
    kv_ucx_destroy(&d);
    bt_free(mem);
    bt_free(src);
    return median(t, reps);
}

/* A whole 2048-token staged hand-off of the model (median ms of
 * `reps`, the grant's begin not counted): through a window per grant
 * with checked commits (decode without RMA), or through the one
 * receive area with epoch puts (--kv-direct-writes, decode with RMA). */
static double bench_handoff(bool windows, int reps, long *faults_p)
{
    kv_ucx_config_t cfg;
    kv_stage_recv_config_t rc;
    kv_stage_send_config_t sc;
    kv_stage_recv_t *recv = NULL;
    kv_stage_send_t *send = NULL;
    kv_stage_peer_t *peer = NULL;
    size_t lb = kv_layout_block_bytes(&model) * (size_t)model.n_blocks, len;
    uint8_t *dev = bt_calloc(2 * (size_t)model.n_layers, lb, "test");
    uint8_t *src = bt_calloc(2 * (size_t)model.n_layers, lb, "test");
    void *k[4], *v[4];
    int ids[128], dst[128];
    double t[64];
    const uint8_t *desc;
    struct rusage ru0, ru1;
    long faults = 0;

    BT_CHECK(dev != NULL && src != NULL && reps <= 64);
    for (int i = 0; i < model.n_blocks; i++)
        ids[i] = i;
    for (int l = 0; l < model.n_layers; l++) {
        k[l] = dev + 2 * (size_t)l * lb;
        v[l] = dev + (2 * (size_t)l + 1) * lb;
    }
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = false;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &pctx));
    cfg.rma = !windows;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &dctx));
    kv_stage_recv_config_init(&rc);
    rc.layout = model;
    rc.k_layers = k;
    rc.v_layers = v;
    rc.recv_blocks = model.n_blocks;
    rc.n_slots = 2;
    rc.ops = kv_stage_ops_host(true);
    rc.windows = windows;
    BT_ASSERT_OK(kv_stage_recv_create(dctx, &rc, &recv));
    kv_stage_send_config_init(&sc);
    sc.layout = model;
    sc.stage_blocks = model.n_blocks; /* the link's default: 2048 tokens */
    sc.ops = kv_stage_ops_host(true);
    BT_ASSERT_OK(kv_stage_send_create(pctx, &sc, &send));
    desc = kv_stage_recv_desc(recv, &len);
    BT_ASSERT_OK(kv_stage_connect(send, desc, len, &peer));
    for (int r = 0; r < reps; r++) {
        int slot = r % 2;
        uint64_t epoch = 1 + (uint64_t)r, t0,
                 until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;
        kv_stage_xfer_t *x = NULL;

        BT_ASSERT_OK(kv_stage_recv_begin(recv, slot, epoch, ids,
                                         model.n_blocks, dst));
        if (windows) {
            const uint8_t *wd = kv_stage_recv_window(recv, slot, &len);
            BT_ASSERT_OK(kv_stage_xfer_begin_window(send, peer, slot, epoch,
                                                    ids, model.n_blocks, wd,
                                                    len, &x));
        } else {
            BT_ASSERT_OK(kv_stage_xfer_begin(send, peer, slot, epoch, ids,
                                             dst, model.n_blocks, &x));
        }
        t0 = bt_time_ns();
        getrusage(RUSAGE_SELF, &ru0);
        for (int l = 0; l < model.n_layers; l++)
            BT_ASSERT_OK(kv_stage_xfer_layer(
                x, l, src + 2 * (size_t)l * lb,
                src + (2 * (size_t)l + 1) * lb));
        while (kv_stage_xfer_status(x) == BT_IN_PROGRESS ||
               kv_stage_recv_poll(recv, slot) == BT_IN_PROGRESS) {
            if (bt_time_ns() > until)
                BT_TEST_FAIL("bench: the hand-off did not complete");
            kv_stage_send_progress(send);
            kv_ucx_progress(dctx);
        }
        t[r] = (double)(bt_time_ns() - t0) * 1e-6;
        getrusage(RUSAGE_SELF, &ru1);
        faults += ru1.ru_minflt - ru0.ru_minflt;
        BT_ASSERT_OK(kv_stage_xfer_status(x));
        BT_ASSERT_OK(kv_stage_recv_poll(recv, slot));
        kv_stage_xfer_destroy(&x);
        kv_stage_recv_finish(recv, slot);
    }
    kv_stage_disconnect(&peer);
    kv_stage_send_destroy(&send);
    kv_stage_recv_destroy(&recv);
    kv_ucx_destroy(&pctx);
    kv_ucx_destroy(&dctx);
    bt_free(dev);
    bt_free(src);
    *faults_p = faults / reps;
    return median(t, reps);
}

static int bench(bool tcp)
{
    const int reps = 31;
    double c_msg, c_put, h;
    long faults;

    fprintf(stderr, "%s, 2048-token staged hand-off of aidreams260K (4 "
            "layers, 4 MiB), medians of %d:\n",
            tcp ? "tcp" : "shared memory", reps);
    c_msg = bench_commits(true, reps);
    c_put = bench_commits(false, reps);
    fprintf(stderr, "  4 per-layer commits: checked messages %.3f ms, epoch "
            "puts %.3f ms\n", c_msg, c_put);
    h = bench_handoff(true, reps, &faults);
    fprintf(stderr, "  whole hand-off, windows + checked commits: %.2f ms "
            "(%ld page faults)\n", h, faults);
    /* last: over tcp UCX 1.13's software RMA has crashed here (SEGV in
     * its tcp progress, the old mode, not this change's code) */
    h = bench_handoff(false, reps, &faults);
    fprintf(stderr, "  whole hand-off, receive area + epoch puts: %.2f ms "
            "(%ld page faults)\n", h, faults);
    return 0;
}

/* Runs the scenario in a child process on `tls` (UCX reads it when a
 * context is created; a fresh process keeps the two runs apart). */
static void run_on(const char *tls, bool do_bench)
{
    int status;
    pid_t pid = fork();

    BT_CHECK(pid >= 0);
    if (pid == 0) {
        setenv("UCX_TLS", tls, 1);
        if (!do_bench)
            fprintf(stderr, "-- UCX_TLS=%s, decode context without RMA\n",
                    tls);
        _exit(do_bench ? bench(strcmp(tls, "tcp") == 0)
                       : scenario(strcmp(tls, "tcp") == 0));
    }
    BT_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        BT_TEST_FAIL("UCX_TLS=%s: the scenario failed (%s %d)", tls,
                     WIFEXITED(status) ? "exit" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status)
                                       : WTERMSIG(status));
}

int main(int argc, char **argv)
{
    bool do_bench = argc > 1 && strcmp(argv[1], "bench") == 0;

    alarm(120);
    run_on("tcp,sm,self", do_bench);
    run_on("tcp", do_bench);
    if (do_bench)
        return 0;
    BT_TEST_PASS("kv_transport/stage_window: no receive area exposed, a "
                 "window carries a staged hand-off exactly and is unmapped "
                 "after it, bad descriptors are refused, a stale key "
                 "reaches nothing after the unmap, forged and stale "
                 "commits are refused and counted (shared memory and tcp, "
                 "decode without RMA)");
    return 0;
}
