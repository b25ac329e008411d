/*
 * test_ucx_window.c - per-reservation UCX receive windows (kv_transport.h
 * "Receive windows", issue 42) over real UCX on loopback, one process
 * with two UCX contexts: "decode" registers a windowed pool and maps
 * windows, "prefill" connects, opens a window and puts.
 *
 *   1. A windowed pool's descriptor exposes no KV: kv_ucx_put_layer into
 *      it is refused.
 *   2. A window carries a hand-off: puts into it, the commit's epoch in
 *      the arrival slot, the bytes read back in the window's layout.
 *   3. Window descriptors are untrusted: every single-byte change, a
 *      truncation, another pool's window and too many blocks are refused.
 *   4. A stale key: after the window is unmapped, puts with its key land
 *      nowhere a new window (mapped next, maybe at the same address)
 *      holds.
 *   5. Cost: mapping a window and copying it out, for a 2048-token
 *      hand-off of the test layout (printed; `test_ucx_window MIB` adds a
 *      32-layer hand-off of MIB MiB, for a measurement by hand).
 *
 * Shared memory and no peer error handling (the default single-host
 * configuration): UCX_TLS defaults to "tcp,sm,self" here.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport.h"
#include "ucx_window_util.h"

static const kv_layout_t layout = {
    .n_layers = 3, .n_blocks = 64, .block_size = 16, .n_kv_heads = 2,
    .head_dim = 8, .elem_size = 4,
};

/* Puts `n` blocks of every layer (block i filled with `seed` + layer + i)
 * into window rw and commits it (its grant's slot and epoch). */
static void put_all(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw, uint8_t *src,
                    int n, int seed)
{
    bt_status_t done = BT_IN_PROGRESS;

    uw_put_layers(peer, rw, &layout, src, n, seed, 0);
    BT_ASSERT_OK(kv_ucx_commit_window(peer, rw, uw_commit_cb, &done));
    uw_settle(peer, 0);
    BT_ASSERT_OK(done);
}

/* Progresses the decode side until its handler took the commit of
 * (slot, epoch): the writer's commit completes when the message left. */
static void wait_arrived(const kv_ucx_pool_t *pool, int slot, uint64_t epoch)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    while (!kv_ucx_pool_has_arrived(pool, slot, epoch)) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("slot %d: epoch %llu did not arrive (slot holds "
                         "%llu, %llu messages refused)", slot,
                         (unsigned long long)epoch,
                         (unsigned long long)kv_ucx_pool_slot_value(pool,
                                                                    slot),
                         (unsigned long long)kv_ucx_writes_refused(dctx));
        uw_progress_both();
    }
}

static bt_status_t open_window(void *peer, const uint8_t *desc, size_t len)
{
    kv_ucx_rwindow_t *rw = NULL;
    bt_status_t status = kv_ucx_window_open(peer, desc, len, &rw);

    kv_ucx_window_close(&rw);
    return status;
}

/* Every corrupted form of window descriptor `desc` is refused. */
static void check_refused(kv_ucx_peer_t *peer, const uint8_t *desc,
                          size_t len)
{
    kv_ucx_rwindow_t *rw = NULL;

    uw_check_each_byte(desc, len, open_window, peer);
    BT_CHECK(kv_ucx_window_open(peer, desc, len - 1, &rw) != BT_OK);
    BT_CHECK(kv_ucx_window_open(peer, desc, 12, &rw) != BT_OK);
    BT_CHECK(kv_ucx_window_open(peer, NULL, 0, &rw) != BT_OK);
    BT_CHECK(rw == NULL);
    bt_error_clear();
}

/* Maps a window of `tokens` tokens of `lay`, fills it as a writer's puts
 * would (the first touch of its fresh pages) and copies it out block by
 * block into warm memory as the link's copy-in does: prints the three
 * times. */
static void bench(kv_ucx_pool_t *pool, const kv_layout_t *lay, int tokens)
{
    size_t bb = kv_layout_block_bytes(lay);
    int n = tokens / lay->block_size;
    size_t bytes = 2 * (size_t)lay->n_layers * (size_t)n * bb;
    uint8_t *dst = bt_malloc(bytes, "test");
    kv_ucx_window_t *w = NULL;
    uint64_t t0, t1, t2, t3;

    BT_CHECK(dst != NULL);
    memset(dst, 1, bytes); /* the pool's pages exist */
    t0 = bt_time_ns();
    BT_ASSERT_OK(kv_ucx_window_create(pool, 0, 1, n, &w));
    t1 = bt_time_ns();
    for (int l = 0; l < lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            memset((void *)kv_ucx_window_data(w, l, kv), 7, (size_t)n * bb);
    t2 = bt_time_ns();
    for (int l = 0; l < lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n; i++)
                memcpy(dst + ((2 * (size_t)l + (size_t)kv) * (size_t)n +
                              (size_t)i) * bb,
                       (const uint8_t *)kv_ucx_window_data(w, l, kv) +
                           (size_t)i * bb,
                       bb);
    t3 = bt_time_ns();
    fprintf(stderr, "  window of %d tokens, %.1f MiB: map %.3f ms, first "
            "touch (writer) %.3f ms, copy-in %.3f ms (%.2f GB/s)\n",
            tokens, (double)bytes / (1 << 20), (double)(t1 - t0) * 1e-6,
            (double)(t2 - t1) * 1e-6, (double)(t3 - t2) * 1e-6,
            (double)bytes / (double)(t3 - t2 > 0 ? t3 - t2 : 1));
    kv_ucx_window_destroy(&w);
    bt_free(dst);
}

int main(int argc, char **argv)
{
    kv_ucx_config_t cfg;
    kv_ucx_pool_t *pool = NULL, *pool2 = NULL;
    kv_ucx_peer_t *peer = NULL, *peer2 = NULL;
    kv_ucx_desc_t *d = NULL;
    kv_ucx_window_t *w = NULL, *w2 = NULL, *other = NULL;
    kv_ucx_rwindow_t *rw = NULL;
    const uint8_t *desc, *wdesc;
    size_t len, wlen;
    uint8_t *src;
    int ids[4] = { 0, 1, 2, 3 };
    const int big_mib = argc > 1 ? atoi(argv[1]) : 0;

    alarm(120);
    setenv("UCX_TLS", "tcp,sm,self", 0);
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = false; /* shared memory: the single-host default */
    BT_ASSERT_OK(kv_ucx_create(&cfg, &dctx));
    BT_ASSERT_OK(kv_ucx_create(&cfg, &pctx));
    src = bt_calloc((size_t)layout.n_blocks, kv_layout_block_bytes(&layout),
                    "test");
    BT_CHECK(src != NULL);

    /* 1. the windowed pool exposes no KV */
    BT_ASSERT_OK(kv_ucx_pool_register_windowed(dctx, &layout, 4, &pool));
    desc = kv_ucx_pool_desc(pool, &len);
    BT_ASSERT_OK(kv_ucx_desc_parse(desc, len, &d));
    BT_CHECK(kv_ucx_desc_windowed(d));
    kv_ucx_desc_destroy(&d);
    BT_ASSERT_OK(kv_ucx_connect(pctx, desc, len, &peer));
    BT_ASSERT_EQ(kv_ucx_put_layer(peer, 0, src, src, &layout, KV_UCX_MEM_HOST,
                                  ids, ids, 4), BT_ERR_INVALID_ARG);
    bt_error_clear();

    /* 2. a hand-off through a window */
    BT_ASSERT_OK(kv_ucx_window_create(pool, 1, 901, 5, &w));
    BT_ASSERT_EQ(kv_ucx_window_blocks(w), 5);
    BT_CHECK(uw_window_zero(w, &layout));
    wdesc = kv_ucx_window_desc(w, &wlen);
    BT_ASSERT_OK(kv_ucx_window_open(peer, wdesc, wlen, &rw));
    BT_ASSERT_EQ(kv_ucx_rwindow_blocks(rw), 5);
    kv_ucx_pool_slot_reset(pool, 1);
    put_all(peer, rw, src, 5, 40);
    wait_arrived(pool, 1, 901);
    uw_check_window(w, &layout, 5, 40);
    /* more blocks than the window holds: refused, nothing put */
    BT_ASSERT_EQ(kv_ucx_put_layer_window(peer, rw, 0, src, src, &layout,
                                         KV_UCX_MEM_HOST, ids, 6),
                 BT_ERR_INVALID_ARG);
    bt_error_clear();
    fprintf(stderr, "hand-off through a window: exact\n");

    /* 3. untrusted descriptors */
    check_refused(peer, wdesc, wlen);
    BT_ASSERT_OK(kv_ucx_pool_register_windowed(dctx, &layout, 4, &pool2));
    BT_ASSERT_OK(kv_ucx_window_create(pool2, 0, 7, 2, &other));
    {
        size_t olen;
        const uint8_t *od = kv_ucx_window_desc(other, &olen);
        kv_ucx_rwindow_t *x = NULL;
        BT_CHECK(kv_ucx_window_open(peer, od, olen, &x) != BT_OK);
        BT_CHECK(x == NULL);
        bt_error_clear();
    }
    BT_CHECK(kv_ucx_window_create(pool, 2, 5, 0, &w2) != BT_OK);
    BT_CHECK(kv_ucx_window_create(pool, 2, 5, layout.n_blocks + 1,
                                  &w2) != BT_OK);
    BT_CHECK(w2 == NULL);
    bt_error_clear();
    fprintf(stderr, "bad window descriptors: refused\n");

    /* 4. the reservation ends: its window is unmapped; the stale key's
     * puts reach nothing the next window holds, whether the key was
     * unpacked before the unmap (rw) or only after it (late) */
    uint8_t old_desc[256];
    size_t old_len = wlen;
    kv_ucx_rwindow_t *late = NULL;
    BT_CHECK(wlen <= sizeof(old_desc));
    memcpy(old_desc, wdesc, wlen);
    kv_ucx_window_destroy(&w);
    BT_ASSERT_OK(kv_ucx_window_create(pool, 1, 902, 5, &w2));
    if (kv_ucx_window_open(peer, old_desc, old_len, &late) != BT_OK) {
        bt_error_clear(); /* the segment is gone: refused outright */
        fprintf(stderr, "a key unpacked after the unmap: refused\n");
    }
    for (int round = 0; round < 3; round++) {
        for (int l = 0; l < layout.n_layers; l++) {
            memset(src, 0x5a, 4 * kv_layout_block_bytes(&layout));
            if (kv_ucx_put_layer_window(peer, rw, l, src, src, &layout,
                                        KV_UCX_MEM_HOST, ids, 4) != BT_OK)
                bt_error_clear(); /* refused outright: also fine */
            if (late != NULL &&
                kv_ucx_put_layer_window(peer, late, l, src, src, &layout,
                                        KV_UCX_MEM_HOST, ids, 4) != BT_OK)
                bt_error_clear();
        }
        if (kv_ucx_peer_wait(peer, 1000) != BT_OK)
            bt_error_clear();
        kv_ucx_progress(dctx);
    }
    BT_CHECK(uw_window_zero(w2, &layout));
    fprintf(stderr, "stale key after the unmap: the next window is "
            "untouched\n");
    kv_ucx_window_close(&rw);
    kv_ucx_window_close(&late);
    BT_CHECK(rw == NULL);

    /* a window that ended before its writer started: opening its key is
     * refused cleanly (UCX 1.13 crashed attaching the gone segment) */
    {
        kv_ucx_window_t *w3 = NULL;
        uint8_t gone[256];
        size_t glen;
        const uint8_t *gd;
        kv_ucx_rwindow_t *x = NULL;

        BT_ASSERT_OK(kv_ucx_window_create(pool, 2, 903, 3, &w3));
        gd = kv_ucx_window_desc(w3, &glen);
        BT_CHECK(glen <= sizeof(gone));
        memcpy(gone, gd, glen);
        kv_ucx_window_destroy(&w3);
        BT_ASSERT_EQ(kv_ucx_window_open(peer, gone, glen, &x), BT_ERR_NET);
        BT_CHECK(x == NULL);
        bt_error_clear();
        fprintf(stderr, "a window gone before its writer opened it: "
                "refused\n");
    }

    /* 5. cost */
    {
        kv_layout_t lay = layout;
        lay.n_blocks = 2048 / lay.block_size;
        kv_ucx_pool_t *bp = NULL;
        BT_ASSERT_OK(kv_ucx_pool_register_windowed(dctx, &lay, 1, &bp));
        bench(bp, &lay, 2048);
        kv_ucx_pool_deregister(&bp);
        if (big_mib > 0) {
            lay = uw_big_layout(lay, big_mib);
            BT_ASSERT_OK(kv_ucx_pool_register_windowed(dctx, &lay, 1, &bp));
            bench(bp, &lay, 2048);
            kv_ucx_pool_deregister(&bp);
        }
    }

    kv_ucx_window_destroy(&w2);
    kv_ucx_window_destroy(&other);
    kv_ucx_disconnect(&peer);
    kv_ucx_disconnect(&peer2);
    kv_ucx_pool_deregister(&pool);
    kv_ucx_pool_deregister(&pool2);
    kv_ucx_destroy(&pctx);
    kv_ucx_destroy(&dctx);
    bt_free(src);
    BT_TEST_PASS("kv_transport/ucx_window: windowed pools expose no KV, "
                 "windows carry a hand-off exactly, bad descriptors are "
                 "refused, a stale key reaches nothing after the unmap");
    return 0;
}
