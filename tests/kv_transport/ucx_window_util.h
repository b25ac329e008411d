/*
 * ucx_window_util.h - what the receive-window tests of the UCX links
 * share (test_ucx_window, test_ucx_am_window, test_stage_window): the two
 * UCX contexts of the one process, bounded waits that progress both,
 * a window's contents written and checked block by block, and the
 * forging of window descriptors as an attacker would (their FNV-1a 64
 * trailer, kv_transport_ucx.c).
 */
#ifndef BT_TESTS_KV_TRANSPORT_UCX_WINDOW_UTIL_H
#define BT_TESTS_KV_TRANSPORT_UCX_WINDOW_UTIL_H

#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport.h"

#define WAIT_MS 10000

/* "decode" maps windows (and, as baton-decode's, may run without RMA);
 * "prefill" writes them. */
static kv_ucx_t *dctx, *pctx;

__attribute__((unused)) static void uw_progress_both(void)
{
    kv_ucx_progress(dctx);
    kv_ucx_progress(pctx);
}

/* Progresses both sides until the peer has nothing in flight, then
 * `drain` times more: over tcp the decode side still has to handle the
 * messages the writer's completed sends delivered. */
__attribute__((unused)) static void uw_settle(kv_ucx_peer_t *peer, int drain)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    while (kv_ucx_peer_pending(peer) > 0) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("UCX operations did not complete");
        uw_progress_both();
    }
    for (int i = 0; i < drain; i++)
        uw_progress_both();
    BT_ASSERT_OK(kv_ucx_peer_status(peer));
}

/* A commit callback: stores the answer in the bt_status_t at `arg`. */
__attribute__((unused)) static void uw_commit_cb(void *arg, int slot,
                                                 uint64_t epoch,
                                                 bt_status_t st)
{
    (void)slot;
    (void)epoch;
    *(bt_status_t *)arg = st;
}

/* Progresses both sides until `*answer` (set by uw_commit_cb) is in;
 * fails the test naming `what` after WAIT_MS.  Returns the answer. */
__attribute__((unused)) static bt_status_t
uw_wait_answer(const bt_status_t *answer, const char *what)
{
    uint64_t until = bt_time_ns() + (uint64_t)WAIT_MS * 1000000ull;

    while (*answer == BT_IN_PROGRESS) {
        if (bt_time_ns() > until)
            BT_TEST_FAIL("%s got no answer", what);
        uw_progress_both();
    }
    bt_error_clear();
    return *answer;
}

// ---------------------------------------------------------------------------
// A window's contents

/* Puts `n` blocks of every layer of `lay` (block i filled with seed +
 * layer + i) into window rw, one put (or message) per block, and settles
 * after each layer (`drain` as uw_settle): src is reused. */
__attribute__((unused)) static void
uw_put_layers(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw,
              const kv_layout_t *lay, uint8_t *src, int n, int seed,
              int drain)
{
    size_t bb = kv_layout_block_bytes(lay);
    int ids[64];

    BT_CHECK(n <= 64);
    for (int i = 0; i < n; i++)
        ids[i] = n - 1 - i; /* a permutation: one put per block */
    for (int l = 0; l < lay->n_layers; l++) {
        for (int i = 0; i < n; i++)
            memset(src + (size_t)ids[i] * bb, seed + l + i, bb);
        BT_ASSERT_OK(kv_ucx_put_layer_window(peer, rw, l, src, src, lay,
                                             KV_UCX_MEM_HOST, ids, n));
        uw_settle(peer, drain);
    }
}

/* Window block i of every layer (K and V) holds seed + layer + i. */
__attribute__((unused)) static void
uw_check_window(const kv_ucx_window_t *w, const kv_layout_t *lay, int n,
                int seed)
{
    size_t bb = kv_layout_block_bytes(lay);

    for (int l = 0; l < lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n; i++) {
                const uint8_t *p =
                    (const uint8_t *)kv_ucx_window_data(w, l, kv) + i * bb;
                for (size_t j = 0; j < bb; j++)
                    if (p[j] != (uint8_t)(seed + l + i))
                        BT_TEST_FAIL("layer %d %c block %d byte %zu: %u, "
                                     "want %u", l, kv ? 'V' : 'K', i, j,
                                     p[j], (uint8_t)(seed + l + i));
            }
}

/* Whether every byte of window w is still zero (nothing landed). */
__attribute__((unused)) static bool uw_window_zero(const kv_ucx_window_t *w,
                                                   const kv_layout_t *lay)
{
    size_t bytes = (size_t)kv_ucx_window_blocks(w) *
                   kv_layout_block_bytes(lay);

    for (int l = 0; l < lay->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *p = kv_ucx_window_data(w, l, kv);
            for (size_t j = 0; j < bytes; j++)
                if (p[j] != 0)
                    return false;
        }
    return true;
}

/* `lay` grown to a 2048-token hand-off of about `mib` MiB over 32 layers
 * (8 KV heads of 128), for a measurement by hand. */
__attribute__((unused)) static kv_layout_t uw_big_layout(kv_layout_t lay,
                                                         int mib)
{
    lay.n_layers = 32;
    lay.n_kv_heads = 8;
    lay.head_dim = 128;
    lay.elem_size = (size_t)mib * (1u << 20) / (2u * 32 * 2048 * 8 * 128);
    if (lay.elem_size < 1)
        lay.elem_size = 1;
    return lay;
}

// ---------------------------------------------------------------------------
// Untrusted and forged window descriptors

/* Opens (or begins a hand-off with) window descriptor `desc`, as the
 * test at hand does: BT_OK when it was accepted. */
typedef bt_status_t (*uw_open_fn)(void *arg, const uint8_t *desc,
                                  size_t len);

/* Every single-byte change of descriptor `desc` is refused by `open`. */
__attribute__((unused)) static void
uw_check_each_byte(const uint8_t *desc, size_t len, uw_open_fn open,
                   void *arg)
{
    uint8_t *bad = bt_malloc(len, "test");

    BT_CHECK(bad != NULL);
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, desc, len);
        bad[i] ^= 0x01;
        if (open(arg, bad, len) == BT_OK)
            BT_TEST_FAIL("a window descriptor with byte %zu changed was "
                         "accepted", i);
        bt_error_clear();
    }
    bt_free(bad);
}

__attribute__((unused)) static uint64_t uw_get_u64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

__attribute__((unused)) static void uw_set_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

__attribute__((unused)) static void uw_set_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#endif /* BT_TESTS_KV_TRANSPORT_UCX_WINDOW_UTIL_H */
