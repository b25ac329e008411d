/*
 * test_cipc_window.c - the plain-C parts of the CUDA IPC link's
 * per-reservation windows (worker/kv/kv_transport_cuda_ipc.h "Windows"),
 * checked without a GPU (the device path: tests/gpu/test_cuda_ipc_window):
 *
 *   1. the windowed descriptor (version 3): round trip; every single-byte
 *      corruption refused; a bad FD channel name (empty, unterminated,
 *      unprintable) refused even with a valid checksum; a windowed
 *      encode of a TP pool refused;
 *   2. KvGrant.cipc_window (token + u32 block count): round trip; a
 *      wrong length or a block count of 0 or > 2^24 refused, outputs
 *      untouched;
 *   3. backend_kv_copy_in on the cpu backend (the interface's host
 *      implementation): a window laid out (layers, K|V, n) lands in the
 *      reservation's scattered blocks byte for byte, no other block
 *      changes, its done callback said once; bad arguments (a missing
 *      callback too) are refused, change nothing and say no done;
 *   4. a binary without CUDA fails closed: no windows supported, the
 *      windowed export says BT_ERR_UNSUPPORTED.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport_cuda_ipc.h"
#include "model/model.h"

static void test_desc(void)
{
    kv_cipc_desc_t d, out;
    uint8_t buf[512], bad[512];
    size_t len, name_off;

    memset(&d, 0, sizeof(d));
    d.windowed = true;
    d.pid = 4242;
    d.pool_id = 0x1234567890abcdefull;
    d.device = 3;
    snprintf(d.bus_id, sizeof(d.bus_id), "0000:19:00.0");
    d.layout = (kv_layout_t){ .n_layers = 4, .n_blocks = 100,
                              .block_size = 16, .n_kv_heads = 2,
                              .head_dim = 64, .elem_size = 2 };
    d.n_slots = 1;
    snprintf(d.fd_socket, sizeof(d.fd_socket), "baton-kvfd-99-0123abcd");
    len = kv_cipc_desc_encoded_size(&d);
    BT_ASSERT_EQ(len, 144);
    BT_ASSERT_OK(kv_cipc_desc_encode(&d, buf, sizeof(buf)));
    BT_ASSERT_OK(kv_cipc_desc_parse(buf, len, &out));
    BT_CHECK(out.windowed);
    BT_ASSERT_STREQ(out.fd_socket, d.fd_socket);
    BT_ASSERT_STREQ(out.bus_id, d.bus_id);
    BT_ASSERT_EQ(out.pool_id, d.pool_id);
    BT_ASSERT_EQ(out.layout.n_blocks, 100);
    BT_ASSERT_EQ(kv_cipc_desc_n_ranks(&out), 1);
    /* every single-byte corruption and every truncation is refused */
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, buf, len);
        bad[i] ^= 0x5a;
        BT_CHECK(kv_cipc_desc_parse(bad, len, &out) != BT_OK);
        BT_CHECK(kv_cipc_desc_parse(buf, i, &out) != BT_OK);
    }
    /* forged with a valid checksum: the name is checked itself */
    name_off = len - 8 - KV_CIPC_SOCKET_LEN;
    memcpy(bad, buf, len);
    memset(bad + name_off, 0, KV_CIPC_SOCKET_LEN);
    bt_fnv1a64_seal(bad, len);
    BT_ASSERT_EQ(kv_cipc_desc_parse(bad, len, &out), BT_ERR_FORMAT);
    memcpy(bad, buf, len);
    memset(bad + name_off, 'a', KV_CIPC_SOCKET_LEN);
    bt_fnv1a64_seal(bad, len);
    BT_ASSERT_EQ(kv_cipc_desc_parse(bad, len, &out), BT_ERR_FORMAT);
    memcpy(bad, buf, len);
    bad[name_off + 2] = '/' - 0x10; /* unprintable */
    bt_fnv1a64_seal(bad, len);
    BT_ASSERT_EQ(kv_cipc_desc_parse(bad, len, &out), BT_ERR_FORMAT);
    memcpy(bad, buf, len);
    bt_fnv1a64_seal(bad, len);
    BT_ASSERT_OK(kv_cipc_desc_parse(bad, len, &out)); /* reseal is sound */
    /* a TP pool has no windowed form */
    d.n_ranks = 2;
    d.n_heads_total = 4;
    BT_ASSERT_EQ(kv_cipc_desc_encode(&d, buf, sizeof(buf)),
                 BT_ERR_INVALID_ARG);
    bt_error_clear();
    BT_TEST_PASS("cipc window descriptor v3");
}

static void test_grant(void)
{
    uint8_t token[KV_CIPC_TOKEN_BYTES], got[KV_CIPC_TOKEN_BYTES];
    uint8_t g[KV_CIPC_GRANT_BYTES + 1], keep[KV_CIPC_TOKEN_BYTES];
    int n = -1;

    for (int i = 0; i < KV_CIPC_TOKEN_BYTES; i++)
        token[i] = (uint8_t)(0xa0 + i);
    kv_cipc_window_grant_encode(token, 128, g);
    BT_ASSERT_OK(kv_cipc_window_grant_parse(g, KV_CIPC_GRANT_BYTES, got, &n));
    BT_ASSERT_EQ(n, 128);
    BT_CHECK(memcmp(got, token, sizeof(token)) == 0);
    /* refusals leave the outputs alone */
    memset(got, 0x11, sizeof(got));
    memcpy(keep, got, sizeof(got));
    n = -7;
    BT_ASSERT_EQ(kv_cipc_window_grant_parse(g, KV_CIPC_GRANT_BYTES - 1, got,
                                            &n), BT_ERR_FORMAT);
    BT_ASSERT_EQ(kv_cipc_window_grant_parse(g, KV_CIPC_GRANT_BYTES + 1, got,
                                            &n), BT_ERR_FORMAT);
    BT_ASSERT_EQ(kv_cipc_window_grant_parse(NULL, KV_CIPC_GRANT_BYTES, got,
                                            &n), BT_ERR_FORMAT);
    kv_cipc_window_grant_encode(token, 0, g);
    BT_ASSERT_EQ(kv_cipc_window_grant_parse(g, KV_CIPC_GRANT_BYTES, got, &n),
                 BT_ERR_FORMAT);
    kv_cipc_window_grant_encode(token, (1 << 24) + 1, g);
    BT_ASSERT_EQ(kv_cipc_window_grant_parse(g, KV_CIPC_GRANT_BYTES, got, &n),
                 BT_ERR_FORMAT);
    BT_ASSERT_EQ(n, -7);
    BT_CHECK(memcmp(got, keep, sizeof(got)) == 0);
    bt_error_clear();
    BT_TEST_PASS("cipc window grant codec");
}

/* Byte b of window block i of layer l, K (kv 0) or V. */
static uint8_t pattern(int l, int kv, int i, size_t b)
{
    return (uint8_t)(l * 37 + kv * 101 + i * 13 + (int)(b * 7 % 251) + 1);
}

static void count_done(void *arg)
{
    (*(int *)arg)++;
}

static void test_copy_in(void)
{
    int dones = 0;
    model_t *model = NULL;
    backend_config_t cfg;
    backend_t *be = NULL;
    const kv_layout_t *lay;
    const int blocks[4] = { 9, 10, 3, 20 }; /* a run and two singles */
    const int n = 4;
    size_t bb, wbytes, pool_bytes;
    uint8_t *win, *before_k, *before_v;
    int n_layers;

    BT_ASSERT_OK(model_load(BT_SHARED_DIR "/models/stories260K.bin", &model));
    backend_config_init(&cfg);
    cfg.n_kv_blocks = 32;
    cfg.block_size = 8;
    cfg.n_threads = 1;
    BT_ASSERT_OK(backend_create("cpu", model, &cfg, &be));
    lay = backend_kv_layout(be);
    n_layers = (int)lay->n_layers;
    bb = kv_layout_block_bytes(lay);
    wbytes = kv_cipc_window_data_bytes(lay, n);
    BT_ASSERT_EQ(wbytes, 2 * (size_t)n_layers * (size_t)n * bb);
    win = bt_malloc(wbytes, "test");
    for (int l = 0; l < n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n; i++)
                for (size_t b = 0; b < bb; b++)
                    win[((2 * (size_t)l + kv) * n + i) * bb + b] =
                        pattern(l, kv, i, b);
    /* the cpu pool's layers are one array each: snapshot all of it */
    pool_bytes = (size_t)n_layers * kv_layout_layer_bytes(lay);
    before_k = bt_malloc(pool_bytes, "test");
    before_v = bt_malloc(pool_bytes, "test");
    memcpy(before_k, backend_kv_data(be, 0, 0), pool_bytes);
    memcpy(before_v, backend_kv_data(be, 0, 1), pool_bytes);

    /* bad arguments: refused, nothing copied */
    {
        const int out_of_pool[4] = { 9, 10, 3, 32 };
        const int negative[1] = { -1 };
        BT_ASSERT_EQ(backend_kv_copy_in(be, win, n, out_of_pool, count_done,
                                        &dones),
                     BT_ERR_INVALID_ARG);
        BT_ASSERT_EQ(backend_kv_copy_in(be, win, 1, negative, count_done,
                                        &dones),
                     BT_ERR_INVALID_ARG);
        BT_ASSERT_EQ(backend_kv_copy_in(be, win, 0, blocks, count_done,
                                        &dones),
                     BT_ERR_INVALID_ARG);
        BT_ASSERT_EQ(backend_kv_copy_in(be, NULL, n, blocks, count_done,
                                        &dones),
                     BT_ERR_INVALID_ARG);
        BT_ASSERT_EQ(backend_kv_copy_in(be, win, n, blocks, NULL, NULL),
                     BT_ERR_INVALID_ARG);
        bt_error_clear();
        BT_ASSERT_EQ(dones, 0);
        BT_CHECK(memcmp(before_k, backend_kv_data(be, 0, 0), pool_bytes) ==
                 0);
        BT_CHECK(memcmp(before_v, backend_kv_data(be, 0, 1), pool_bytes) ==
                 0);
    }

    BT_ASSERT_OK(backend_kv_copy_in(be, win, n, blocks, count_done, &dones));
    BT_ASSERT_EQ(dones, 1);
    for (int l = 0; l < n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *pool = backend_kv_data(be, l, kv);
            const uint8_t *before =
                (kv ? before_v : before_k) + (size_t)l *
                                                 kv_layout_layer_bytes(lay);
            for (int blk = 0; blk < cfg.n_kv_blocks; blk++) {
                int i = -1;
                for (int k = 0; k < n; k++)
                    if (blocks[k] == blk)
                        i = k;
                for (size_t b = 0; b < bb; b++) {
                    uint8_t want = i >= 0 ? pattern(l, kv, i, b)
                                          : before[(size_t)blk * bb + b];
                    if (pool[(size_t)blk * bb + b] != want)
                        BT_TEST_FAIL("layer %d kv %d block %d byte %zu: %u "
                                     "!= %u", l, kv, blk, b,
                                     pool[(size_t)blk * bb + b], want);
                }
            }
        }
    }
    bt_free(before_v);
    bt_free(before_k);
    bt_free(win);
    backend_destroy(&be);
    model_destroy(&model);
    BT_TEST_PASS("cipc window copy-in (cpu backend)");
}

static void test_no_cuda(void)
{
#ifndef BATON_HAVE_CUDA
    kv_layout_t lay = { .n_layers = 2, .n_blocks = 8, .block_size = 4,
                        .n_kv_heads = 1, .head_dim = 8, .elem_size = 2 };
    kv_cipc_pool_t *pool = NULL;

    BT_CHECK(!kv_cipc_windows_supported(0));
    BT_ASSERT_EQ(kv_cipc_pool_export_windowed(&lay, 0, 1 << 20, &pool),
                 BT_ERR_UNSUPPORTED);
    BT_CHECK(pool == NULL);
    bt_error_clear();
    BT_TEST_PASS("cipc windows fail closed without CUDA");
#endif
}

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    test_desc();
    test_grant();
    test_copy_in();
    test_no_cuda();
    return 0;
}
