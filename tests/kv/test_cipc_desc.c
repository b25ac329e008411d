/* test_cipc_desc.c - the CUDA IPC descriptor of tensor-parallel decode
 * pools (worker/kv/kv_transport_cuda_ipc.h, version 2) and the per-rank
 * planning a TP prefill worker does against it (kv_cipc_put_layer_ranks'
 * loop, executed here with memcpy on host pools: no GPU needed).
 *
 *   1. Version 1 is unchanged: n_ranks 0/1 encodes the fixed 288-byte
 *      record with version 1, and parses back to the same struct.
 *   2. Version 2 round trip for 2, 4 and 8 ranks: sizes, rank fields,
 *      the top level repeating rank 0, the accessors.
 *   3. Version 2 rejections: wrong head0, heads total, rank counts,
 *      truncation, checksum, unterminated bus id, encode of bad input.
 *   4. Prefill TP p -> decode TP d for (1,1) (2,1) (1,2) (2,2) (4,2)
 *      (2,4): every source rank plans against every destination rank of
 *      a parsed descriptor (head ranges from the descriptor) and the
 *      destination pools end up holding exactly the source heads of the
 *      reserved blocks; TP 1 -> 1 is one 1D copy per run of blocks.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_reshard.h"
#include "kv/kv_transport_cuda_ipc.h"

#define N_HEADS 8
#define HEAD_DIM 4
#define BLOCK 4
#define LAYERS 2
#define POOL_BLOCKS 16

static kv_cipc_desc_t make_desc(int n_ranks, int heads_per_rank)
{
    kv_cipc_desc_t d;

    memset(&d, 0, sizeof(d));
    d.pool_id = 0xfeedface01234567ull + (uint64_t)n_ranks;
    d.pid = 777;
    d.layout = (kv_layout_t){ LAYERS, POOL_BLOCKS, BLOCK, heads_per_rank,
                              HEAD_DIM, 2 };
    d.n_slots = 64;
    for (int i = 0; i < KV_CIPC_HANDLE_BYTES; i++)
        d.arrival_handle[i] = (uint8_t)(i * 3 + 1);
    if (n_ranks <= 1) {
        d.device = 2;
        snprintf(d.bus_id, sizeof(d.bus_id), "0000:19:00.0");
        for (int i = 0; i < KV_CIPC_HANDLE_BYTES; i++) {
            d.k_handle[i] = (uint8_t)i;
            d.v_handle[i] = (uint8_t)(200 - i);
        }
        return d;
    }
    d.n_ranks = n_ranks;
    d.n_heads_total = n_ranks * heads_per_rank;
    for (int r = 0; r < n_ranks; r++) {
        kv_cipc_rank_desc_t *rk = &d.ranks[r];
        rk->device = 3 + r;
        snprintf(rk->bus_id, sizeof(rk->bus_id), "0000:%02x:00.0",
                 0x19 + 0x10 * r);
        rk->head0 = r * heads_per_rank;
        for (int i = 0; i < KV_CIPC_HANDLE_BYTES; i++) {
            rk->k_handle[i] = (uint8_t)(i + 7 * r);
            rk->v_handle[i] = (uint8_t)(255 - i - r);
        }
    }
    /* the top level repeats rank 0 (what the parser fills in) */
    d.device = d.ranks[0].device;
    snprintf(d.bus_id, sizeof(d.bus_id), "%s", d.ranks[0].bus_id);
    memcpy(d.k_handle, d.ranks[0].k_handle, KV_CIPC_HANDLE_BYTES);
    memcpy(d.v_handle, d.ranks[0].v_handle, KV_CIPC_HANDLE_BYTES);
    return d;
}

static void test_v1(void)
{
    kv_cipc_desc_t d = make_desc(1, N_HEADS), back;
    uint8_t buf[2048];
    size_t n = kv_cipc_desc_encoded_size(&d);
    kv_cipc_rank_desc_t r0;

    BT_ASSERT_EQ(n, kv_cipc_desc_size());
    BT_ASSERT_EQ(n, (size_t)288);
    BT_ASSERT_OK(kv_cipc_desc_encode(&d, buf, sizeof(buf)));
    BT_ASSERT_EQ(buf[4], KV_CIPC_DESC_VERSION);
    BT_ASSERT_OK(kv_cipc_desc_parse(buf, n, &back));
    BT_CHECK(memcmp(&d, &back, sizeof(d)) == 0);
    BT_ASSERT_EQ(kv_cipc_desc_n_ranks(&back), 1);
    BT_ASSERT_EQ(kv_cipc_desc_heads_total(&back), N_HEADS);
    r0 = kv_cipc_desc_rank(&back, 0);
    BT_ASSERT_EQ(r0.device, 2);
    BT_ASSERT_EQ(r0.head0, 0);
    BT_ASSERT_STREQ(r0.bus_id, "0000:19:00.0");
    BT_CHECK(memcmp(r0.k_handle, d.k_handle, KV_CIPC_HANDLE_BYTES) == 0);
    BT_CHECK(memcmp(r0.v_handle, d.v_handle, KV_CIPC_HANDLE_BYTES) == 0);
    /* n_ranks 1 is version 1 too, byte for byte */
    {
        uint8_t again[2048];
        d.n_ranks = 1;
        BT_ASSERT_OK(kv_cipc_desc_encode(&d, again, sizeof(again)));
        d.n_ranks = 0;
        BT_CHECK(memcmp(buf, again, n) == 0);
    }
}

static void test_v2_round_trip(void)
{
    const int ranks[] = { 2, 4, 8 };

    for (size_t k = 0; k < sizeof(ranks) / sizeof(ranks[0]); k++) {
        int nr = ranks[k];
        kv_cipc_desc_t d = make_desc(nr, N_HEADS / nr), back;
        uint8_t buf[2048], again[2048];
        size_t n = kv_cipc_desc_encoded_size(&d);

        BT_ASSERT_EQ(n, (size_t)(132 + 168 * nr));
        BT_ASSERT_OK(kv_cipc_desc_encode(&d, buf, sizeof(buf)));
        BT_ASSERT_EQ(buf[4], KV_CIPC_DESC_VERSION_TP);
        BT_ASSERT_OK(kv_cipc_desc_parse(buf, n, &back));
        BT_CHECK(memcmp(&d, &back, sizeof(d)) == 0);
        BT_ASSERT_EQ(kv_cipc_desc_n_ranks(&back), nr);
        BT_ASSERT_EQ(kv_cipc_desc_heads_total(&back), N_HEADS);
        for (int r = 0; r < nr; r++) {
            kv_cipc_rank_desc_t rk = kv_cipc_desc_rank(&back, r);
            BT_ASSERT_EQ(rk.head0, r * (N_HEADS / nr));
            BT_ASSERT_EQ(rk.device, 3 + r);
        }
        BT_ASSERT_OK(kv_cipc_desc_encode(&back, again, sizeof(again)));
        BT_CHECK(memcmp(buf, again, n) == 0);
        BT_CHECK(kv_cipc_desc_encode(&d, buf, n - 1) == BT_ERR_INVALID_ARG);
    }
}

static void test_v2_rejects(void)
{
    kv_cipc_desc_t d = make_desc(2, 4), back;
    uint8_t buf[2048], bad[2048];
    size_t n = kv_cipc_desc_encoded_size(&d);
    /* offsets of the version-2 record */
    const size_t o_nranks = 24, o_total = 28, o_rank0 = 124;
    const size_t o_head0_r1 = o_rank0 + 168 + 4 + KV_CIPC_BUS_ID_LEN;

    BT_ASSERT_OK(kv_cipc_desc_encode(&d, buf, sizeof(buf)));
    BT_ASSERT_OK(kv_cipc_desc_parse(buf, n, &back));
    /* truncated, extended, checksum */
    BT_CHECK(kv_cipc_desc_parse(buf, n - 1, &back) == BT_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[n] = 0;
    BT_CHECK(kv_cipc_desc_parse(bad, n + 1, &back) == BT_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[40] ^= 1;
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* rank 1 claiming heads from 0 */
    memcpy(bad, buf, n);
    bad[o_head0_r1] = 0;
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* heads total not ranks x heads */
    memcpy(bad, buf, n);
    bad[o_total] = 9;
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* one rank in a version-2 record; more ranks than the size holds */
    memcpy(bad, buf, n);
    bad[o_nranks] = 1;
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[o_nranks] = 3;
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* unterminated bus id of rank 0 */
    memcpy(bad, buf, n);
    memset(bad + o_rank0 + 4, 'x', KV_CIPC_BUS_ID_LEN);
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* a version-2 record said to be version 1 */
    memcpy(bad, buf, n);
    bad[4] = 1;
    bt_fnv1a64_seal(bad, n);
    BT_CHECK(kv_cipc_desc_parse(bad, n, &back) == BT_ERR_FORMAT);
    /* encode refuses inconsistent input */
    d.n_heads_total = 7;
    BT_CHECK(kv_cipc_desc_encode(&d, buf, sizeof(buf)) == BT_ERR_INVALID_ARG);
    d = make_desc(2, 4);
    d.n_ranks = KV_CIPC_MAX_RANKS + 1;
    d.n_heads_total = d.n_ranks * 4;
    BT_CHECK(kv_cipc_desc_encode(&d, buf, sizeof(buf)) == BT_ERR_INVALID_ARG);
}

/* Element value of (layer, token, global head, column). */
static uint16_t val(int layer, int tok, int head, int col)
{
    return (uint16_t)(((layer * 97 + tok) * 31 + head) * 8 + col + 1);
}

/* Prefill TP p -> decode TP d through a parsed descriptor of the decode
 * pools: the loop of kv_cipc_put_layer_ranks, executed with memcpy. */
static void test_pair(int p, int d)
{
    const int hp = N_HEADS / p, hd = N_HEADS / d, n_tok = 3 * BLOCK - 1;
    const int n_blk = BT_DIV_UP(n_tok, BLOCK);
    const int src_ids[3] = { 5, 6, 9 }, dst_ids[3] = { 2, 3, 4 };
    kv_layout_t sl = { LAYERS, POOL_BLOCKS, BLOCK, hp, HEAD_DIM, 2 };
    kv_cipc_desc_t desc = make_desc(d, hd), parsed;
    uint8_t enc[2048];
    uint16_t *src[8], *dst[8];
    size_t s_layer = kv_layout_layer_bytes(&sl), d_layer;
    kv_copy2d_t plan[16];
    int copies_total = 0;

    BT_ASSERT_OK(kv_cipc_desc_encode(&desc, enc, sizeof(enc)));
    BT_ASSERT_OK(kv_cipc_desc_parse(enc, kv_cipc_desc_encoded_size(&desc),
                                    &parsed));
    d_layer = kv_layout_layer_bytes(&parsed.layout);
    for (int r = 0; r < p; r++) {
        src[r] = bt_calloc(LAYERS, s_layer, "test");
        for (int l = 0; l < LAYERS; l++)
            for (int t = 0; t < n_tok; t++)
                for (int h = 0; h < hp; h++)
                    for (int c = 0; c < HEAD_DIM; c++) {
                        size_t slot = (size_t)src_ids[t / BLOCK] * BLOCK +
                                      t % BLOCK;
                        src[r][(size_t)l * s_layer / 2 +
                               (slot * hp + h) * HEAD_DIM + c] =
                            val(l, t, r * hp + h, c);
                    }
    }
    for (int r = 0; r < d; r++)
        dst[r] = bt_calloc(LAYERS, d_layer, "test");
    for (int l = 0; l < LAYERS; l++) {
        for (int sr = 0; sr < p; sr++) {
            kv_reshard_side_t s = kv_reshard_side_rank(&sl, p, sr);
            BT_ASSERT_EQ(s.n_heads_total, kv_cipc_desc_heads_total(&parsed));
            for (int dr = 0; dr < kv_cipc_desc_n_ranks(&parsed); dr++) {
                kv_reshard_side_t t;
                int nc = 0;
                t.n_heads_total = s.n_heads_total;
                t.head0 = kv_cipc_desc_rank(&parsed, dr).head0;
                t.layout = parsed.layout;
                BT_ASSERT_OK(kv_reshard_plan(&s, &t, src_ids, dst_ids, n_blk,
                                             plan, 16, &nc));
                kv_reshard_exec_host(plan, nc,
                                     (uint8_t *)dst[dr] + l * d_layer,
                                     (const uint8_t *)src[sr] + l * s_layer);
                copies_total += nc;
                if (p == 1 && d == 1) { /* the old plan: 1D per run */
                    BT_ASSERT_EQ(nc, 2);
                    BT_ASSERT_EQ(plan[0].height, (size_t)1);
                    BT_ASSERT_EQ(plan[0].width,
                                 2 * kv_layout_block_bytes(&sl));
                }
            }
        }
    }
    /* every destination element of the reserved blocks holds its value;
     * every other block is untouched (zero) */
    for (int r = 0; r < d; r++)
        for (int l = 0; l < LAYERS; l++)
            for (int b = 0; b < POOL_BLOCKS; b++)
                for (int i = 0; i < BLOCK; i++)
                    for (int h = 0; h < hd; h++)
                        for (int c = 0; c < HEAD_DIM; c++) {
                            size_t slot = (size_t)b * BLOCK + i;
                            uint16_t got = dst[r][(size_t)l * d_layer / 2 +
                                                  (slot * hd + h) * HEAD_DIM +
                                                  c];
                            int k = b - dst_ids[0], t = k * BLOCK + i;
                            uint16_t want = 0;
                            if (k >= 0 && k < n_blk && t < n_tok)
                                want = val(l, t, r * hd + h, c);
                            else if (k >= 0 && k < n_blk)
                                continue; /* copied padding of a block */
                            if (got != want)
                                BT_TEST_FAIL("tp %d -> %d: rank %d layer %d "
                                             "block %d slot %d head %d: %u, "
                                             "want %u", p, d, r, l, b, i, h,
                                             got, want);
                        }
    BT_CHECK(copies_total > 0);
    for (int r = 0; r < p; r++)
        bt_free(src[r]);
    for (int r = 0; r < d; r++)
        bt_free(dst[r]);
}

int main(void)
{
    test_v1();
    test_v2_round_trip();
    test_v2_rejects();
    test_pair(1, 1);
    test_pair(2, 1);
    test_pair(1, 2);
    test_pair(2, 2);
    test_pair(4, 2);
    test_pair(2, 4);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("kv/cipc_desc");
    return 0;
}
