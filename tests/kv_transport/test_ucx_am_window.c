/*
 * test_ucx_am_window.c - receive windows over UCX's software RMA (tcp),
 * where UCX checks no key: the data goes as active messages the decode
 * side checks against the live grant (kv_transport.h "Receive windows",
 * docs/SECURITY.md 5).  One process, two UCX contexts, UCX_TLS=tcp:
 * "decode" (created without RMA, as baton-decode's is) maps windows,
 * "prefill" writes them.
 *
 *   1. An honest hand-off goes by message and lands exactly; the commit
 *      sets the slot and the writer hears it was accepted.
 *   2. Forged writes into a live window change nothing and are each
 *      counted (kv_ucx_writes_refused): a wrong token, a wrong epoch, a
 *      slot with no window, a window already committed, an offset past
 *      the window's end; a forged commit is refused and its writer told.
 *      The honest writer then fills the window exactly.
 *   3. A stale writer (its window unmapped, the slot granted again) is
 *      refused: the new window stays untouched.
 *   4. A writer that skips the protocol and puts over tcp straight into a
 *      window's address: the decode side (no RMA) drops it.  Control: the
 *      same put against a context with RMA lands - the attack is real.
 *   5. Cost (printed): a 2048-token hand-off of the test layout by message
 *      into a window, and by software-RMA puts into a registered pool (the
 *      --kv-direct-writes path over tcp); `test_ucx_am_window MIB` adds a
 *      32-layer hand-off of MIB MiB, for a measurement by hand.
 *
 * Window descriptors are forged here as an attacker would: the layout is
 * in kv_transport_ucx.c (slot at 56, epoch at 64, token at 72, n_blocks
 * at 20, base at 32, rkey length at 88 and the rkey at 92, FNV-1a 64 of
 * everything before the last 8 bytes).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport.h"
#include "ucx_window_util.h"

/* over tcp the decode side handles what the writer's sends delivered in
 * this many more progress rounds after they completed */
#define DRAIN 200

static const kv_layout_t layout = {
    .n_layers = 3, .n_blocks = 64, .block_size = 16, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4,
};

/* Commits rw and waits for the decode side's answer. */
static bt_status_t commit(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw)
{
    bt_status_t done = BT_IN_PROGRESS;

    BT_ASSERT_OK(kv_ucx_commit_window(peer, rw, uw_commit_cb, &done));
    return uw_wait_answer(&done, "the commit");
}

// ---------------------------------------------------------------------------
// Forging descriptors

typedef enum { FORGE_TOKEN, FORGE_EPOCH, FORGE_SLOT, FORGE_BLOCKS } forge_t;

/* Opens a forged copy of window w's descriptor (the writer cannot tell:
 * it is well formed). */
static kv_ucx_rwindow_t *forge_open(kv_ucx_peer_t *peer,
                                    const kv_ucx_window_t *w, forge_t how,
                                    uint32_t value)
{
    uint8_t d[512];
    size_t len;
    const uint8_t *src = kv_ucx_window_desc(w, &len);
    kv_ucx_rwindow_t *rw = NULL;

    BT_CHECK(len <= sizeof(d));
    memcpy(d, src, len);
    switch (how) {
    case FORGE_TOKEN:
        d[72 + value % 16] ^= 0x40;
        break;
    case FORGE_EPOCH:
        uw_set_u64(d + 64, value);
        break;
    case FORGE_SLOT:
        uw_set_u32(d + 56, value);
        break;
    case FORGE_BLOCKS:
        uw_set_u32(d + 20, value);
        uw_set_u64(d + 40, 2 * (uint64_t)layout.n_layers * value *
                               kv_layout_block_bytes(&layout));
        break;
    }
    bt_fnv1a64_seal(d, len);
    BT_ASSERT_OK(kv_ucx_window_open(peer, d, len, &rw));
    BT_CHECK(kv_ucx_rwindow_by_message(rw));
    return rw;
}

/* One forged write of layer 0's first `n` blocks (one run: a K and a V
 * message): refused, both counted, w untouched. */
static void forged_write(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw,
                         const kv_ucx_window_t *w, uint8_t *src, int n,
                         const char *what)
{
    uint64_t before = kv_ucx_writes_refused(dctx);
    int ids[64];

    for (int i = 0; i < n; i++)
        ids[i] = i;
    memset(src, 0x5a, (size_t)n * kv_layout_block_bytes(&layout));
    BT_ASSERT_OK(kv_ucx_put_layer_window(peer, rw, 0, src, src, &layout,
                                         KV_UCX_MEM_HOST, ids, n));
    uw_settle(peer, DRAIN);
    if (!uw_window_zero(w, &layout))
        BT_TEST_FAIL("a forged write (%s) changed the window", what);
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before, 2);
    fprintf(stderr, "forged write (%s): refused, counted\n", what);
}

// ---------------------------------------------------------------------------
// A writer outside the protocol: a raw put over tcp

/* Puts 0x5a over the first 64 bytes of window w through UCX's RMA, from
 * a fresh raw context, with the arrival slots' key of the pool
 * descriptor every prefill worker holds (region 0: its rkey length at 88,
 * its bytes at 92) and the window's address: what a compromised prefill
 * worker could do without this library (software RMA checks no key).
 * Returns when the put and its flush completed or after 1 s (a target
 * without RMA never answers). */
static void raw_put(kv_ucx_t *target, const kv_ucx_pool_t *pool,
                    const kv_ucx_window_t *w)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_config_t *config;
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_ep_params_t ep_params;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    ucp_request_param_t prm;
    static uint8_t junk[64];
    size_t plen, wlen;
    const uint8_t *pd = kv_ucx_pool_desc(pool, &plen);
    const uint8_t *wd = kv_ucx_window_desc(w, &wlen);
    uint32_t addr_len = (uint32_t)pd[68] | (uint32_t)pd[69] << 8 |
                        (uint32_t)pd[70] << 16 | (uint32_t)pd[71] << 24;
    void *put, *flush, *close;
    uint64_t until;

    memset(junk, 0x5a, sizeof(junk));
    BT_CHECK(ucp_config_read(NULL, NULL, &config) == UCS_OK);
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    BT_CHECK(ucp_init(&params, config, &context) == UCS_OK);
    ucp_config_release(config);
    memset(&wparams, 0, sizeof(wparams));
    BT_CHECK(ucp_worker_create(context, &wparams, &worker) == UCS_OK);
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = (const ucp_address_t *)(pd + plen - 8 - addr_len);
    BT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    BT_CHECK(ucp_ep_rkey_unpack(ep, pd + 92, &rkey) == UCS_OK);
    memset(&prm, 0, sizeof(prm));
    put = ucp_put_nbx(ep, junk, sizeof(junk), uw_get_u64(wd + 32), rkey, &prm);
    flush = ucp_ep_flush_nbx(ep, &prm);
    until = bt_time_ns() + 1000000000ull;
    while (bt_time_ns() < until &&
           ((UCS_PTR_IS_PTR(put) &&
             ucp_request_check_status(put) == UCS_INPROGRESS) ||
            (UCS_PTR_IS_PTR(flush) &&
             ucp_request_check_status(flush) == UCS_INPROGRESS))) {
        ucp_worker_progress(worker);
        kv_ucx_progress(target);
    }
    if (UCS_PTR_IS_PTR(put))
        ucp_request_free(put);
    if (UCS_PTR_IS_PTR(flush))
        ucp_request_free(flush);
    ucp_rkey_destroy(rkey);
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    close = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(close)) {
        until = bt_time_ns() + 1000000000ull;
        while (ucp_request_check_status(close) == UCS_INPROGRESS &&
               bt_time_ns() < until)
            ucp_worker_progress(worker);
        ucp_request_free(close);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    for (int i = 0; i < 100; i++)
        kv_ucx_progress(target);
}

// ---------------------------------------------------------------------------
// Cost

/* Hands off every layer's n blocks of `lay` from `src` (one layer's
 * bytes, reused for K, V and every layer) and waits for the slot: by
 * message into a window (`by_message`), else by puts into a registered
 * pool.  Returns the seconds it took. */
static double bench_one(const kv_layout_t *lay, const uint8_t *src,
                        bool by_message)
{
    kv_ucx_config_t dcfg;
    kv_ucx_t *bctx = NULL;
    kv_ucx_pool_t *bp = NULL;
    kv_ucx_peer_t *peer = NULL;
    kv_ucx_window_t *w = NULL;
    kv_ucx_rwindow_t *rw = NULL;
    uint8_t *pool_mem = NULL;
    void **k = NULL, **v = NULL;
    size_t lb = kv_layout_block_bytes(lay) * (size_t)lay->n_blocks, len;
    const uint8_t *desc;
    int n = lay->n_blocks, *ids = bt_malloc((size_t)n * sizeof(int), "test");
    bt_status_t done = BT_IN_PROGRESS;
    uint64_t t0, until;

    BT_CHECK(ids != NULL);
    for (int i = 0; i < n; i++)
        ids[i] = i;
    kv_ucx_config_init(&dcfg);
    dcfg.rma = !by_message;
    BT_ASSERT_OK(kv_ucx_create(&dcfg, &bctx));
    if (by_message) {
        BT_ASSERT_OK(kv_ucx_pool_register_windowed(bctx, lay, 1, &bp));
        BT_ASSERT_OK(kv_ucx_window_create(bp, 0, 1, n, &w));
    } else {
        pool_mem = bt_calloc(2 * (size_t)lay->n_layers, lb, "test");
        k = bt_calloc((size_t)lay->n_layers, sizeof(*k), "test");
        v = bt_calloc((size_t)lay->n_layers, sizeof(*v), "test");
        BT_CHECK(pool_mem != NULL && k != NULL && v != NULL);
        for (int l = 0; l < lay->n_layers; l++) {
            k[l] = pool_mem + 2 * (size_t)l * lb;
            v[l] = pool_mem + (2 * (size_t)l + 1) * lb;
        }
        BT_ASSERT_OK(kv_ucx_pool_register(bctx, lay, k, v, KV_UCX_MEM_HOST,
                                          1, &bp));
    }
    desc = kv_ucx_pool_desc(bp, &len);
    BT_ASSERT_OK(kv_ucx_connect(pctx, desc, len, &peer));
    if (by_message) {
        const uint8_t *wd = kv_ucx_window_desc(w, &len);
        BT_ASSERT_OK(kv_ucx_window_open(peer, wd, len, &rw));
    }
    t0 = bt_time_ns();
    for (int l = 0; l < lay->n_layers; l++) {
        if (by_message)
            BT_ASSERT_OK(kv_ucx_put_layer_window(peer, rw, l, src, src, lay,
                                                 KV_UCX_MEM_HOST, ids, n));
        else
            BT_ASSERT_OK(kv_ucx_put_layer(peer, l, src, src, lay,
                                          KV_UCX_MEM_HOST, ids, ids, n));
        kv_ucx_progress(pctx);
        kv_ucx_progress(bctx);
    }
    if (by_message)
        BT_ASSERT_OK(kv_ucx_commit_window(peer, rw, uw_commit_cb, &done));
    else
        BT_ASSERT_OK(kv_ucx_commit(peer, 0, 1, uw_commit_cb, &done));
    until = bt_time_ns() + 60ull * 1000000000ull;
    while (done == BT_IN_PROGRESS || !kv_ucx_pool_has_arrived(bp, 0, 1)) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("the hand-off did not complete");
        kv_ucx_progress(pctx);
        kv_ucx_progress(bctx);
    }
    BT_ASSERT_OK(done);
    t0 = bt_time_ns() - t0;
    kv_ucx_window_close(&rw);
    kv_ucx_disconnect(&peer);
    kv_ucx_window_destroy(&w);
    kv_ucx_pool_deregister(&bp);
    kv_ucx_destroy(&bctx);
    bt_free(pool_mem);
    bt_free(k);
    bt_free(v);
    bt_free(ids);
    return (double)t0 * 1e-9;
}

static void bench(const kv_layout_t *lay)
{
    size_t lb = kv_layout_block_bytes(lay) * (size_t)lay->n_blocks;
    double bytes = 2.0 * (double)lay->n_layers * (double)lb, msg, put;
    uint8_t *src = bt_malloc(lb, "test");

    BT_CHECK(src != NULL);
    memset(src, 3, lb);
    msg = bench_one(lay, src, true);
    put = bench_one(lay, src, false);
    fprintf(stderr, "  tcp hand-off of %d tokens, %.1f MiB: by message "
            "into a window %.1f ms (%.2f GB/s), by software-RMA puts into "
            "the pool %.1f ms (%.2f GB/s)\n",
            lay->n_blocks * lay->block_size, bytes / (1 << 20), msg * 1e3,
            bytes / msg * 1e-9, put * 1e3, bytes / put * 1e-9);
    bt_free(src);
}

int main(int argc, char **argv)
{
    const int big_mib = argc > 1 ? atoi(argv[1]) : 0;
    kv_ucx_config_t dcfg, pcfg;
    kv_ucx_pool_t *pool = NULL;
    kv_ucx_peer_t *peer = NULL;
    kv_ucx_window_t *w1 = NULL, *w2 = NULL, *w3 = NULL;
    kv_ucx_rwindow_t *rw = NULL, *rw2 = NULL, *bad = NULL;
    const uint8_t *desc, *wdesc;
    size_t len, wlen;
    uint8_t *src;
    uint64_t before;

    alarm(120);
    setenv("UCX_TLS", "tcp", 1); /* UCX's software RMA: no key checked */
    kv_ucx_config_init(&dcfg);
    dcfg.rma = false; /* as baton-decode with receive windows */
    kv_ucx_config_init(&pcfg);
    BT_ASSERT_OK(kv_ucx_create(&dcfg, &dctx));
    BT_ASSERT_OK(kv_ucx_create(&pcfg, &pctx));
    src = bt_calloc((size_t)layout.n_blocks, kv_layout_block_bytes(&layout),
                    "test");
    BT_CHECK(src != NULL);
    BT_ASSERT_OK(kv_ucx_pool_register_windowed(dctx, &layout, 4, &pool));
    desc = kv_ucx_pool_desc(pool, &len);
    BT_ASSERT_OK(kv_ucx_connect(pctx, desc, len, &peer));

    /* 1. an honest hand-off by message */
    BT_ASSERT_OK(kv_ucx_window_create(pool, 1, 901, 5, &w1));
    wdesc = kv_ucx_window_desc(w1, &wlen);
    BT_ASSERT_OK(kv_ucx_window_open(peer, wdesc, wlen, &rw));
    BT_CHECK(kv_ucx_rwindow_by_message(rw)); /* tcp: no RMA lanes */
    uw_put_layers(peer, rw, &layout, src, 5, 40, DRAIN);
    BT_CHECK(!kv_ucx_pool_has_arrived(pool, 1, 901)); /* not committed */
    BT_ASSERT_OK(commit(peer, rw));
    BT_CHECK(kv_ucx_pool_has_arrived(pool, 1, 901));
    uw_check_window(w1, &layout, 5, 40);
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx), 0);
    fprintf(stderr, "hand-off by message over tcp: exact, committed\n");

    /* 2. forged writes into a live window */
    BT_ASSERT_OK(kv_ucx_window_create(pool, 2, 902, 4, &w2));
    BT_CHECK(uw_window_zero(w2, &layout));
    bad = forge_open(peer, w2, FORGE_TOKEN, 5);
    forged_write(peer, bad, w2, src, 4, "wrong token");
    before = kv_ucx_writes_refused(dctx);
    BT_ASSERT_EQ(commit(peer, bad), BT_ERR_REMOTE); /* forged commit */
    BT_CHECK(!kv_ucx_pool_has_arrived(pool, 2, 902));
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before, 1);
    kv_ucx_window_close(&bad);
    bad = forge_open(peer, w2, FORGE_EPOCH, 903);
    forged_write(peer, bad, w2, src, 4, "wrong epoch");
    kv_ucx_window_close(&bad);
    bad = forge_open(peer, w2, FORGE_SLOT, 3);
    forged_write(peer, bad, w2, src, 4, "a slot with no window");
    kv_ucx_window_close(&bad);
    bad = forge_open(peer, w2, FORGE_BLOCKS, 8);
    forged_write(peer, bad, w2, src, 8, "past the window's end");
    kv_ucx_window_close(&bad);
    /* w1 was committed: its own writer's late bytes are refused too */
    before = kv_ucx_writes_refused(dctx);
    memset(src, 0x5a, 4 * kv_layout_block_bytes(&layout));
    {
        int ids[4] = { 0, 1, 2, 3 };
        BT_ASSERT_OK(kv_ucx_put_layer_window(peer, rw, 0, src, src, &layout,
                                             KV_UCX_MEM_HOST, ids, 4));
    }
    uw_settle(peer, DRAIN);
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before, 2);
    uw_check_window(w1, &layout, 5, 40);
    fprintf(stderr, "write after the commit: refused\n");
    /* the honest writer of w2 still lands exactly */
    wdesc = kv_ucx_window_desc(w2, &wlen);
    BT_ASSERT_OK(kv_ucx_window_open(peer, wdesc, wlen, &rw2));
    uw_put_layers(peer, rw2, &layout, src, 4, 70, DRAIN);
    BT_ASSERT_OK(commit(peer, rw2));
    BT_CHECK(kv_ucx_pool_has_arrived(pool, 2, 902));
    uw_check_window(w2, &layout, 4, 70);
    fprintf(stderr, "after the forgeries the honest hand-off is exact\n");

    /* 3. a stale writer: w2 ends, slot 2 is granted again */
    kv_ucx_window_destroy(&w2);
    kv_ucx_pool_slot_reset(pool, 2);
    BT_ASSERT_OK(kv_ucx_window_create(pool, 2, 904, 4, &w3));
    before = kv_ucx_writes_refused(dctx);
    for (int l = 0; l < layout.n_layers; l++) {
        int ids[4] = { 0, 1, 2, 3 };
        memset(src, 0x5a, 4 * kv_layout_block_bytes(&layout));
        BT_ASSERT_OK(kv_ucx_put_layer_window(peer, rw2, l, src, src,
                                             &layout, KV_UCX_MEM_HOST, ids,
                                             4));
        uw_settle(peer, DRAIN);
    }
    BT_ASSERT_EQ(kv_ucx_writes_refused(dctx) - before,
                 2 * (uint64_t)layout.n_layers);
    BT_ASSERT_EQ(commit(peer, rw2), BT_ERR_REMOTE);
    BT_CHECK(uw_window_zero(w3, &layout));
    BT_CHECK(!kv_ucx_pool_has_arrived(pool, 2, 904));
    fprintf(stderr, "stale writer: refused, the next grant's window "
            "untouched\n");

    /* 4. a raw put over tcp: dropped by a decode side without RMA */
    raw_put(dctx, pool, w3);
    BT_CHECK(uw_window_zero(w3, &layout));
    fprintf(stderr, "raw put over tcp into a live window: dropped (no RMA "
            "on the decode side)\n");
    {
        kv_ucx_config_t rcfg;
        kv_ucx_t *rctx = NULL;
        kv_ucx_pool_t *rpool = NULL;
        kv_ucx_window_t *rw_ctl = NULL;

        kv_ucx_config_init(&rcfg); /* RMA on: the control */
        BT_ASSERT_OK(kv_ucx_create(&rcfg, &rctx));
        BT_ASSERT_OK(kv_ucx_pool_register_windowed(rctx, &layout, 4, &rpool));
        BT_ASSERT_OK(kv_ucx_window_create(rpool, 0, 1, 4, &rw_ctl));
        raw_put(rctx, rpool, rw_ctl);
        if (uw_window_zero(rw_ctl, &layout))
            BT_TEST_FAIL("control: a raw put over tcp into a context with "
                         "RMA did not land (the test would not see the "
                         "attack)");
        fprintf(stderr, "control: the same put lands where RMA is on\n");
        kv_ucx_window_destroy(&rw_ctl);
        kv_ucx_pool_deregister(&rpool);
        kv_ucx_destroy(&rctx);
    }

    /* 5. cost */
    {
        kv_layout_t lay = layout;
        lay.n_blocks = 2048 / lay.block_size;
        bench(&lay);
        if (big_mib > 0) {
            lay = uw_big_layout(lay, big_mib);
            bench(&lay);
        }
    }

    kv_ucx_window_close(&rw);
    kv_ucx_window_close(&rw2);
    kv_ucx_window_destroy(&w1);
    kv_ucx_window_destroy(&w3);
    kv_ucx_disconnect(&peer);
    kv_ucx_pool_deregister(&pool);
    kv_ucx_destroy(&pctx);
    kv_ucx_destroy(&dctx);
    bt_free(src);
    BT_TEST_PASS("kv_transport/ucx_am_window: over tcp a window is written "
                 "by checked messages; forged, stale and raw writes change "
                 "nothing and are refused");
    return 0;
}
