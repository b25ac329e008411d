/*
 * test_kv_link.c - the KV link interface (worker/kv/kv_link.h) end to end
 * in one process, on two real cpu backends (stories260K): a decode-side
 * receiver (UCX pool in UCX-mapped memory) and a prefill-side sender.
 *   1. ucx: the route the router would send (the receiver's endpoint),
 *      layer by layer, commit, poll until landed; the receiver's arrival
 *      check passes and the destination blocks equal the source blocks;
 *      a second arrival check with another epoch fails.
 *   2. a route naming ucx with a corrupt endpoint falls back to inline:
 *      the payload is unpacked by the receiver into other blocks, equal.
 *   3. a route naming a link this sender does not run (cuda-ipc) goes
 *      inline too; a receiver asked about a link it does not run fails
 *      at once with a reason.
 *   4. the router's chooser (kv_link_choose) on the host cases and names.
 *   5. a block range (kv_link_route_t.first_block): only the blocks the
 *      decode pool lacks move, over ucx and inline.
 *   6. inline's bound (kv_link_config_t.inline_max_bytes, the control
 *      message's size in production): KV of exactly the bound goes
 *      inline; one byte less and a route to a link the sender lacks
 *      fails at create, one whose endpoint is corrupt fails at start
 *      (kv_link_xfer_failed), both saying why -- never a PrefillDone too
 *      big for the router, which would drop it and the request hang.
 */
#include <string.h>

#include "backend.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_link.h"
#include "model/model.h"

#define BLOCKS 16
#define BS 4

static void fill(backend_t *be, int salt)
{
    const kv_layout_t *lay = backend_kv_layout(be);
    size_t n = kv_layout_block_bytes(lay) * lay->n_blocks / sizeof(float);

    for (int l = 0; l < (int)lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            float *p = backend_kv_data(be, l, kv);
            for (size_t i = 0; i < n; i++)
                p[i] = (float)(salt + l * 1000 + kv * 100 +
                               (int)(i % 97));
        }
}

/* dst blocks d[i] of `b` hold the first n_tokens rows of src blocks s[i]
 * of `a` (whole blocks except the last). */
static void check_same(backend_t *a, const int *s, backend_t *b,
                       const int *d, int n_tokens)
{
    const kv_layout_t *lay = backend_kv_layout(a);
    size_t bb = kv_layout_block_bytes(lay);
    size_t row = bb / lay->block_size;

    for (int l = 0; l < (int)lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int t = 0; t < n_tokens; t += BS) {
                int cnt = BT_MIN(BS, n_tokens - t);
                const uint8_t *x = (const uint8_t *)backend_kv_data(a, l,
                                                                    kv) +
                                   (size_t)s[t / BS] * bb;
                const uint8_t *y = (const uint8_t *)backend_kv_data(b, l,
                                                                    kv) +
                                   (size_t)d[t / BS] * bb;
                if (memcmp(x, y, row * (size_t)cnt) != 0)
                    BT_TEST_FAIL("layer %d kv %d block %d != %d", l, kv,
                                 s[t / BS], d[t / BS]);
            }
}

/* Block s of a (layer 0, K) and block d of b differ: d was not written
 * (a hand-off from a first block past it). */
static bool block_differs(backend_t *a, int s, backend_t *b, int d)
{
    size_t bb = kv_layout_block_bytes(backend_kv_layout(a));

    return memcmp((uint8_t *)backend_kv_data(a, 0, 0) + (size_t)s * bb,
                  (uint8_t *)backend_kv_data(b, 0, 0) + (size_t)d * bb,
                  bb) != 0;
}

static backend_t *make_backend(const model_t *model, backend_config_t *cfg)
{
    backend_t *be = NULL;

    cfg->n_kv_blocks = BLOCKS;
    cfg->block_size = BS;
    cfg->n_threads = 1;
    BT_ASSERT_OK(backend_create("cpu", model, cfg, &be));
    return be;
}

/* Ships n_tokens of src blocks over `route` through the whole xfer
 * lifecycle; returns the xfer (committed and landed). */
static kv_link_xfer_t *ship(kv_link_sender_t *snd, kv_link_receiver_t *rcv,
                            backend_t *pbe, const kv_link_route_t *route,
                            const int *src, int n_src)
{
    const kv_layout_t *lay = backend_kv_layout(pbe);
    kv_link_xfer_t *x = NULL;
    bt_status_t st;
    uint64_t until = bt_time_ns() + 10000000000ull;

    BT_ASSERT_OK(kv_link_xfer_create(snd, route, &x));
    kv_link_xfer_start(x, src, n_src);
    for (int l = 0; l < (int)lay->n_layers; l++)
        kv_link_xfer_layer(x, l);
    st = kv_link_xfer_commit(x);
    while (st == BT_IN_PROGRESS && bt_time_ns() < until) {
        kv_link_sender_progress(snd);
        if (rcv != NULL)
            kv_link_receiver_progress(rcv);
        st = kv_link_xfer_poll(x, 5000000000ull);
    }
    BT_ASSERT_OK(st);
    return x;
}

int main(void)
{
    model_t *model = NULL;
    backend_config_t pcfg, dcfg;
    backend_t *pbe, *dbe;
    kv_link_recv_config_t rc = {
        .use_ucx = true, .ucx_shm_pool = true, .n_slots = 4,
        .quarantine_ms = 100,
        .kv_direct_writes = true, /* the pool itself (windows: kv_transport/
                                     test_ucx_window, cluster/
                                     test_kv_stale_writer) */
    };
    kv_link_config_t sc = { .use_ucx = true };
    kv_link_receiver_t *rcv = NULL;
    kv_link_sender_t *snd = NULL;
    kv_link_endpoint_t eps[8];
    int ids[8], n;
    int src[3] = { 1, 2, 3 }, dst[3] = { 9, 4, 5 }, dst2[3] = { 12, 13, 14 };
    const int n_tokens = 10; /* 3 blocks, the last one partial */
    kv_link_grant_t g = { .request_id = 1, .slot = 2, .epoch = 77,
                          .blocks = dst, .n = 3 };
    kv_link_route_t route = {
        .request_id = 1, .transport = KV_LINK_UCX_SHM, .slot = 2,
        .epoch = 77, .dst_blocks = dst, .n_dst = 3, .dst_block_size = BS,
        .n_tokens = n_tokens,
    };
    kv_link_xfer_t *x;
    uint8_t *const *parts;
    size_t part_len;
    const char *why = NULL;
    uint8_t bad[64];

    setenv("UCX_TLS", "tcp,sm,self", 0);
    BT_ASSERT_OK(model_load(BT_SHARED_DIR "/models/stories260K.bin", &model));
    backend_config_init(&pcfg);
    backend_config_init(&dcfg);

    /* decode side: UCX before the backend, the pool in UCX memory */
    BT_ASSERT_OK(kv_link_receiver_create(&rc, &rcv));
    kv_link_receiver_kv_alloc(rcv, &dcfg);
    BT_CHECK(dcfg.kv_alloc != NULL);
    dbe = make_backend(model, &dcfg);
    BT_ASSERT_OK(kv_link_receiver_attach(rcv, dbe, false, 64));
    n = kv_link_receiver_offers(rcv, ids, 8);
    BT_ASSERT_EQ(n, 2);
    BT_ASSERT_EQ(ids[0], KV_LINK_UCX);
    BT_ASSERT_EQ(ids[1], KV_LINK_INLINE);
    BT_CHECK(kv_link_receiver_is_remote(rcv));
    BT_ASSERT_EQ(kv_link_receiver_endpoints(rcv, eps, 8), 1);
    BT_ASSERT_EQ(eps[0].transport, KV_LINK_UCX);
    BT_CHECK(eps[0].len > 0);
    fill(dbe, 5000);

    /* prefill side */
    pbe = make_backend(model, &pcfg);
    sc.backend = pbe;
    BT_ASSERT_OK(kv_link_sender_create(&sc, &snd));
    n = kv_link_sender_offers(snd, ids, 8);
    BT_ASSERT_EQ(n, 2);
    BT_ASSERT_EQ(ids[0], KV_LINK_UCX);
    BT_ASSERT_STREQ(kv_link_sender_names(snd), "ucx");
    kv_link_sender_sync(snd, eps, 1); /* connect ahead (KvPeers) */
    fill(pbe, 0);

    /* 1. ucx */
    BT_ASSERT_OK(kv_link_receiver_arm(rcv, &g));
    route.desc = eps[0].desc;
    route.desc_len = eps[0].len;
    x = ship(snd, rcv, pbe, &route, src, 3);
    BT_CHECK(kv_link_xfer_is_remote(x));
    BT_ASSERT_EQ(kv_link_xfer_payload(x, &parts, &part_len), 0);
    BT_ASSERT_OK(kv_link_receiver_arrived(rcv, KV_LINK_UCX_SHM, 2, 77, &why));
    check_same(pbe, src, dbe, dst, n_tokens);
    kv_link_xfer_destroy(&x);
    BT_CHECK(x == NULL);
    kv_link_receiver_reset(rcv, 2, false);

    /* 2. a corrupt ucx endpoint: inline, unpacked by the receiver */
    memset(bad, 0x5a, sizeof(bad));
    route.desc = bad;
    route.desc_len = sizeof(bad);
    x = ship(snd, NULL, pbe, &route, src, 3);
    BT_CHECK(!kv_link_xfer_is_remote(x));
    n = kv_link_xfer_payload(x, &parts, &part_len);
    BT_ASSERT_EQ(n, 2 * (int)backend_kv_layout(pbe)->n_layers);
    {
        size_t lens[64];
        const uint8_t *cp[64];
        BT_CHECK(n <= 64);
        for (int i = 0; i < n; i++) {
            cp[i] = parts[i];
            lens[i] = part_len;
        }
        BT_ASSERT_OK(kv_link_receiver_unpack(rcv, cp, lens, n, dst2, 3,
                                             n_tokens));
        check_same(pbe, src, dbe, dst2, n_tokens);
        /* a part of the wrong size is refused */
        lens[1]--;
        BT_ASSERT_EQ(kv_link_receiver_unpack(rcv, cp, lens, n, dst2, 3,
                                             n_tokens), BT_ERR_FORMAT);
    }
    kv_link_xfer_destroy(&x);

    /* 3. a link this sender does not run: inline; and a receiver asked
     * about a link it does not run answers at once */
    route.transport = KV_LINK_CUDA_IPC;
    x = ship(snd, NULL, pbe, &route, src, 3);
    BT_CHECK(!kv_link_xfer_is_remote(x));
    kv_link_xfer_destroy(&x);
    BT_CHECK(kv_link_receiver_arrived(rcv, KV_LINK_CUDA_IPC, 2, 77, &why) !=
             BT_OK);
    BT_ASSERT_STREQ(why, "KV did not arrive over cuda-ipc");

    /* 5. a range (issue 38): the decode pool holds the first block (its
     * prefix cache), only blocks [1, 3) move, over ucx and inline; the
     * held block is not written; a range past the prompt is refused. */
    {
        int dst3[3] = { 6, 7, 8 }, dst4[3] = { 10, 11, 15 };
        const kv_layout_t *lay = backend_kv_layout(pbe);
        size_t bb = kv_layout_block_bytes(lay);
        kv_link_grant_t g3 = { .request_id = 3, .slot = 1, .epoch = 78,
                               .blocks = dst3 + 1, .n = 2 };
        kv_link_route_t r3 = route;
        size_t lens[64];
        const uint8_t *cp[64];

        r3.request_id = 3;
        r3.transport = KV_LINK_UCX_SHM;
        r3.slot = 1;
        r3.epoch = 78;
        r3.dst_blocks = dst3;
        r3.first_block = 1;
        r3.desc = eps[0].desc;
        r3.desc_len = eps[0].len;
        BT_ASSERT_OK(kv_link_receiver_arm(rcv, &g3));
        x = ship(snd, rcv, pbe, &r3, src, 3);
        BT_CHECK(kv_link_xfer_is_remote(x));
        BT_ASSERT_OK(kv_link_receiver_arrived(rcv, KV_LINK_UCX_SHM, 1, 78,
                                              &why));
        check_same(pbe, src + 1, dbe, dst3 + 1, n_tokens - BS);
        BT_CHECK(block_differs(pbe, src[0], dbe, dst3[0]));
        kv_link_xfer_destroy(&x);
        kv_link_receiver_reset(rcv, 1, false);

        r3.desc = bad; /* inline: the token range [BS, n_tokens) */
        r3.desc_len = sizeof(bad);
        r3.dst_blocks = dst4;
        x = ship(snd, NULL, pbe, &r3, src, 3);
        BT_CHECK(!kv_link_xfer_is_remote(x));
        n = kv_link_xfer_payload(x, &parts, &part_len);
        BT_CHECK(n > 0 && n <= 64);
        BT_ASSERT_EQ(part_len, (bb / BS) * (size_t)(n_tokens - BS));
        for (int i = 0; i < n; i++) {
            cp[i] = parts[i];
            lens[i] = part_len;
        }
        BT_ASSERT_OK(kv_link_receiver_unpack(rcv, cp, lens, n, dst4 + 1, 2,
                                             n_tokens - BS));
        check_same(pbe, src + 1, dbe, dst4 + 1, n_tokens - BS);
        BT_CHECK(block_differs(pbe, src[0], dbe, dst4[0]));
        kv_link_xfer_destroy(&x);

        r3.first_block = 3; /* the whole prompt held: not a hand-off */
        BT_ASSERT_EQ(kv_link_xfer_create(snd, &r3, &x), BT_ERR_INVALID_ARG);
        BT_CHECK(x == NULL);
        bt_error_clear();
    }

    /* 6. inline's bound */
    {
        const kv_layout_t *lay = backend_kv_layout(pbe);
        size_t bytes = 2 * lay->n_layers * (kv_layout_block_bytes(lay) / BS) *
                       (size_t)n_tokens;
        kv_link_config_t sc2 = sc;
        kv_link_sender_t *snd2 = NULL;
        kv_link_route_t r6 = route;

        sc2.inline_max_bytes = bytes;
        BT_ASSERT_OK(kv_link_sender_create(&sc2, &snd2));
        kv_link_sender_sync(snd2, eps, 1);
        r6.transport = KV_LINK_CUDA_IPC; /* not run here: inline */
        x = ship(snd2, NULL, pbe, &r6, src, 3);
        BT_CHECK(!kv_link_xfer_is_remote(x));
        BT_CHECK(!kv_link_xfer_failed(x));
        BT_ASSERT_EQ(kv_link_xfer_payload(x, &parts, &part_len),
                     2 * (int)lay->n_layers);
        kv_link_xfer_destroy(&x);
        kv_link_sender_destroy(&snd2);

        sc2.inline_max_bytes = bytes - 1;
        BT_ASSERT_OK(kv_link_sender_create(&sc2, &snd2));
        kv_link_sender_sync(snd2, eps, 1);
        BT_ASSERT_EQ(kv_link_xfer_create(snd2, &r6, &x), BT_ERR_NO_RESOURCE);
        BT_CHECK(x == NULL);
        BT_CHECK(strstr(bt_error_last(), "cannot go inline") != NULL);
        bt_error_clear();

        r6.transport = KV_LINK_UCX_SHM; /* a corrupt endpoint: at start */
        r6.desc = bad;
        r6.desc_len = sizeof(bad);
        BT_ASSERT_OK(kv_link_xfer_create(snd2, &r6, &x));
        kv_link_xfer_start(x, src, 3);
        BT_CHECK(kv_link_xfer_failed(x));
        BT_CHECK(strstr(kv_link_xfer_error(x), "cannot go inline") != NULL);
        for (int l = 0; l < (int)lay->n_layers; l++)
            kv_link_xfer_layer(x, l); /* nothing to ship: no crash */
        BT_CHECK(kv_link_xfer_commit(x) != BT_OK);
        BT_CHECK(strstr(kv_link_xfer_error(x), "cannot go inline") != NULL);
        kv_link_xfer_destroy(&x);
        kv_link_sender_destroy(&snd2);
        BT_ASSERT_STREQ(bt_error_last(), "");
    }

    kv_link_sender_destroy(&snd);
    kv_link_receiver_detach(rcv);
    backend_destroy(&dbe); /* its memory is the receiver's UCX's */
    kv_link_receiver_destroy(&rcv);
    backend_destroy(&pbe);
    model_destroy(&model);

    /* 4. the chooser */
    {
        kv_link_facts_t p = { .offers = 1u << KV_LINK_INLINE |
                                        1u << KV_LINK_UCX,
                              .host_id = "h1" };
        kv_link_facts_t d = p;
        d.endpoints = 1u << KV_LINK_UCX;
        BT_ASSERT_EQ(kv_link_choose(&p, &d, true, -1, true), KV_LINK_LOCAL);
        BT_ASSERT_EQ(kv_link_choose(&p, &d, false, -1, true),
                     KV_LINK_UCX_SHM);
        BT_ASSERT_EQ(kv_link_choose(&p, &d, false, KV_LINK_INLINE, true),
                     KV_LINK_INLINE);
        d.host_id = "h2";
        BT_ASSERT_EQ(kv_link_choose(&p, &d, false, -1, true), KV_LINK_UCX);
        d.endpoints = 0; /* no endpoint published: inline */
        BT_ASSERT_EQ(kv_link_choose(&p, &d, false, -1, true),
                     KV_LINK_INLINE);
        BT_ASSERT_EQ(kv_link_endpoint_id(KV_LINK_UCX_SHM), KV_LINK_UCX);
        BT_ASSERT_STREQ(kv_link_name(KV_LINK_UCX_STAGE), "ucx-stage");
        BT_ASSERT_STREQ(kv_link_name(99), "unknown");
    }
    BT_TEST_PASS("kv/kv_link: ucx route exact, corrupt endpoint and "
                 "foreign link go inline, block ranges, inline's bound, "
                 "chooser");
    return 0;
}
