/* test_reshard.c - worker/kv/kv_reshard: plans between pools of different
 * tensor-parallel degrees, executed with memcpy on host arrays.
 *
 * For every (prefill TP, decode TP) pair of the list, a model of 8 KV
 * heads: every source rank's pool holds its heads of a request's tokens
 * (each element a value that encodes layer, token, head and column), every
 * destination rank's pool starts as sentinel bytes; one plan per
 * (source rank, destination rank) and layer is executed.  Then every
 * destination element of a reserved block holds the value of its (layer,
 * token, global head, column), every other byte is still the sentinel, the
 * plans moved exactly the destination's bytes (no element written twice),
 * and each plan has one copy per run of consecutive block ids (zero when
 * the ranks share no head).  TP 1 -> 1 must be the transport's old plan:
 * one 1D copy of run * block bytes per run. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "kv/kv_reshard.h"

#define N_HEADS 8
#define HEAD_DIM 4
#define BLOCK 4
#define LAYERS 3
#define SENTINEL 0xEEu
#define MAX_BLOCKS 64

/* Value of element (layer, token, head, col); never all-sentinel bytes. */
static uint32_t val(int layer, int tok, int head, int col)
{
    uint32_t h = (uint32_t)(((layer * 1000 + tok) * 64 + head) * 16 + col);
    h ^= h >> 7;
    h *= 0x9e3779b1u;
    h ^= h >> 13;
    return (h % 0xE000u) + 1; /* fits 16 bits, != 0xEEEE */
}

static void put_elem(uint8_t *p, size_t es, uint32_t v)
{
    if (es == 2) {
        uint16_t x = (uint16_t)v;
        memcpy(p, &x, 2);
    } else {
        memcpy(p, &v, 4);
    }
}

static uint32_t get_elem(const uint8_t *p, size_t es)
{
    if (es == 2) {
        uint16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int count_runs(const int *a, const int *b, int n)
{
    int runs = 0;
    for (int i = 0; i < n; i++)
        runs += i == 0 || a[i] != a[i - 1] + 1 || b[i] != b[i - 1] + 1;
    return runs;
}

/* Random block list of n distinct ids in [0, n_blocks) outside
 * [lo, hi), with runs. */
static void make_ids(int *ids, int n, int n_blocks, int lo, int hi,
                     unsigned *seed)
{
    int used[MAX_BLOCKS] = { 0 };
    for (int b = lo; b < hi; b++)
        used[b] = 1;
    for (int i = 0; i < n;) {
        int start = (int)(rand_r(seed) % (unsigned)n_blocks);
        int len = 1 + (int)(rand_r(seed) % 4u);
        for (int k = 0; k < len && i < n && start + k < n_blocks; k++) {
            if (used[start + k])
                break;
            used[start + k] = 1;
            ids[i++] = start + k;
        }
    }
}

static void run_pair(int tp_s, int tp_d, size_t es, int n, unsigned seed)
{
    kv_layout_t ls = { .n_layers = LAYERS, .n_blocks = 24, .block_size = BLOCK,
                       .n_kv_heads = N_HEADS / tp_s, .head_dim = HEAD_DIM,
                       .elem_size = es };
    kv_layout_t ld = ls;
    uint8_t *src[8], *dst[8];
    int src_ids[MAX_BLOCKS], dst_ids[MAX_BLOCKS];
    kv_copy2d_t copies[MAX_BLOCKS];
    size_t lb_s, lb_d, row_s, row_d;
    int runs;

    ld.n_blocks = 32;
    ld.n_kv_heads = N_HEADS / tp_d;
    lb_s = kv_layout_layer_bytes(&ls);
    lb_d = kv_layout_layer_bytes(&ld);
    row_s = (size_t)ls.n_kv_heads * HEAD_DIM * es;
    row_d = (size_t)ld.n_kv_heads * HEAD_DIM * es;
    make_ids(src_ids, n, ls.n_blocks, 20, 23, &seed);
    make_ids(dst_ids, n, ld.n_blocks, 28, 31, &seed);
    if (n >= 4) /* a run of 3 on both sides */
        for (int k = 0; k < 3; k++) {
            src_ids[k] = 20 + k;
            dst_ids[k] = 28 + k;
        }
    runs = count_runs(src_ids, dst_ids, n);

    for (int r = 0; r < tp_s; r++) {
        src[r] = bt_malloc(lb_s * LAYERS, "test");
        BT_CHECK(src[r] != NULL);
        memset(src[r], 0x5A, lb_s * LAYERS); /* unused source blocks */
        for (int l = 0; l < LAYERS; l++)
            for (int i = 0; i < n; i++)
                for (int s = 0; s < BLOCK; s++)
                    for (int h = 0; h < ls.n_kv_heads; h++)
                        for (int c = 0; c < HEAD_DIM; c++) {
                            size_t off = (size_t)l * lb_s +
                                         ((size_t)src_ids[i] * BLOCK + s) *
                                             row_s +
                                         ((size_t)h * HEAD_DIM + c) * es;
                            put_elem(src[r] + off, es,
                                     val(l, i * BLOCK + s,
                                         r * ls.n_kv_heads + h, c));
                        }
    }
    for (int r = 0; r < tp_d; r++) {
        dst[r] = bt_malloc(lb_d * LAYERS, "test");
        BT_CHECK(dst[r] != NULL);
        memset(dst[r], SENTINEL, lb_d * LAYERS);
    }

    for (int rd = 0; rd < tp_d; rd++) {
        kv_reshard_side_t d = kv_reshard_side_rank(&ld, tp_d, rd);
        size_t moved = 0;
        int senders = 0;
        for (int rs = 0; rs < tp_s; rs++) {
            kv_reshard_side_t s = kv_reshard_side_rank(&ls, tp_s, rs);
            int nc = -1, h0, h1;
            BT_ASSERT_OK(kv_reshard_plan(&s, &d, src_ids, dst_ids, n, copies,
                                         n, &nc));
            kv_reshard_overlap(&s, &d, &h0, &h1);
            if (h0 >= h1) {
                BT_ASSERT_EQ(nc, 0);
                continue;
            }
            senders++;
            BT_ASSERT_EQ(nc, runs); /* one copy per run, minimal */
            for (int k = 0; k < nc; k++) {
                const kv_copy2d_t *c = &copies[k];
                BT_CHECK(c->width <= c->spitch && c->width <= c->dpitch);
                if (tp_s == tp_d) { /* whole rows: 1D per run */
                    BT_ASSERT_EQ(c->height, 1);
                    BT_ASSERT_EQ(c->width % kv_layout_block_bytes(&ls), 0);
                } else {
                    BT_ASSERT_EQ(c->width,
                                 (size_t)(h1 - h0) * HEAD_DIM * es);
                    BT_ASSERT_EQ(c->height % BLOCK, 0);
                }
            }
            moved += kv_reshard_plan_bytes(copies, nc);
            for (int l = 0; l < LAYERS; l++)
                kv_reshard_exec_host(copies, nc, dst[rd] + (size_t)l * lb_d,
                                     src[rs] + (size_t)l * lb_s);
        }
        /* Exactly this rank's bytes of the blocks, each once. */
        BT_ASSERT_EQ(moved, (size_t)n * kv_layout_block_bytes(&ld));
        BT_ASSERT_EQ(senders, tp_s > tp_d ? tp_s / tp_d : 1);
    }

    /* Every destination byte: the right value in reserved blocks, the
     * sentinel everywhere else. */
    for (int rd = 0; rd < tp_d; rd++)
        for (int l = 0; l < LAYERS; l++)
            for (int b = 0; b < ld.n_blocks; b++) {
                int pos = -1;
                for (int i = 0; i < n; i++)
                    if (dst_ids[i] == b)
                        pos = i;
                for (int s = 0; s < BLOCK; s++)
                    for (int h = 0; h < ld.n_kv_heads; h++)
                        for (int c = 0; c < HEAD_DIM; c++) {
                            size_t off = (size_t)l * lb_d +
                                         ((size_t)b * BLOCK + s) * row_d +
                                         ((size_t)h * HEAD_DIM + c) * es;
                            const uint8_t *p = dst[rd] + off;
                            if (pos < 0) {
                                for (size_t e = 0; e < es; e++)
                                    if (p[e] != SENTINEL)
                                        BT_TEST_FAIL("tp %d->%d: byte of "
                                                     "unreserved block %d "
                                                     "written", tp_s, tp_d,
                                                     b);
                            } else if (get_elem(p, es) !=
                                       val(l, pos * BLOCK + s,
                                           rd * ld.n_kv_heads + h, c)) {
                                BT_TEST_FAIL("tp %d->%d es %zu: layer %d "
                                             "block %d slot %d head %d col "
                                             "%d wrong", tp_s, tp_d, es, l,
                                             b, s, rd * ld.n_kv_heads + h, c);
                            }
                        }
            }
    for (int r = 0; r < tp_s; r++)
        bt_free(src[r]);
    for (int r = 0; r < tp_d; r++)
        bt_free(dst[r]);
}

static void test_pairs(void)
{
    static const int pairs[][2] = { { 1, 1 }, { 2, 1 }, { 1, 2 }, { 2, 4 },
                                    { 4, 2 }, { 2, 2 }, { 8, 2 }, { 1, 8 },
                                    { 4, 1 } };
    for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++)
        for (int es = 2; es <= 4; es += 2)
            for (int n = 0; n <= 12; n += 3)
                run_pair(pairs[p][0], pairs[p][1], (size_t)es, n,
                         (unsigned)(p * 100 + (size_t)n + (size_t)es));
    BT_TEST_PASS("reshard: tp pairs land every element, nothing else");
}

/* TP 1 -> 1 is the CUDA IPC transport's original plan: one contiguous
 * copy of run * block bytes per run of consecutive ids. */
static void test_identity_plan(void)
{
    kv_layout_t l = { .n_layers = 32, .n_blocks = 100, .block_size = 16,
                      .n_kv_heads = 8, .head_dim = 128, .elem_size = 2 };
    kv_reshard_side_t s = kv_reshard_side_whole(&l);
    int src_ids[] = { 0, 1, 2, 3, 10, 11, 40, 5 };
    int dst_ids[] = { 7, 8, 9, 10, 20, 22, 41, 6 };
    kv_copy2d_t c[8];
    size_t blk = kv_layout_block_bytes(&l);
    int nc;

    BT_ASSERT_OK(kv_reshard_plan(&s, &s, src_ids, dst_ids, 8, c, 8, &nc));
    BT_ASSERT_EQ(nc, 5); /* [0..3]->[7..10], 10->20, 11->22, 40->41, 5->6 */
    BT_ASSERT_EQ(c[0].src_off, 0);
    BT_ASSERT_EQ(c[0].dst_off, 7 * blk);
    BT_ASSERT_EQ(c[0].width, 4 * blk);
    BT_ASSERT_EQ(c[1].width, blk);
    BT_ASSERT_EQ(c[2].dst_off, 22 * blk);
    BT_ASSERT_EQ(c[4].src_off, 5 * blk);
    for (int i = 0; i < nc; i++) {
        BT_ASSERT_EQ(c[i].height, 1);
        BT_ASSERT_EQ(c[i].spitch, c[i].width);
        BT_ASSERT_EQ(c[i].dpitch, c[i].width);
    }
    BT_TEST_PASS("reshard: tp 1->1 = one 1D copy per run");
}

static void test_errors(void)
{
    kv_layout_t l = { .n_layers = 2, .n_blocks = 8, .block_size = 4,
                      .n_kv_heads = 4, .head_dim = 8, .elem_size = 2 };
    kv_layout_t m = l;
    kv_reshard_side_t s = kv_reshard_side_rank(&l, 2, 1), d;
    int a[] = { 0, 2, 4 }, b[] = { 1, 3, 5 }, bad[] = { 0, 8, 1 };
    kv_copy2d_t c[3];
    int nc;

    d = kv_reshard_side_whole(&l);
    /* Different total heads (8 vs 4). */
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, a, b, 3, c, 3, &nc),
                 BT_ERR_INVALID_ARG);
    m.head_dim = 16;
    d = kv_reshard_side_rank(&m, 2, 0);
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, a, b, 3, c, 3, &nc),
                 BT_ERR_INVALID_ARG);
    d = kv_reshard_side_rank(&l, 2, 0);
    d.head0 = 5; /* 5 + 4 > 8 */
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, a, b, 3, c, 3, &nc),
                 BT_ERR_INVALID_ARG);
    d = kv_reshard_side_rank(&l, 2, 1);
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, a, bad, 3, c, 3, &nc),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, bad, b, 3, c, 3, &nc),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_reshard_plan(&s, &d, a, b, 3, c, 2, &nc),
                 BT_ERR_NO_RESOURCE);
    BT_ASSERT_OK(kv_reshard_plan(&s, &d, a, b, 3, c, 3, &nc));
    BT_ASSERT_EQ(nc, 3);
    /* Ranks 1 -> 0 of TP 2 share no head: an empty plan. */
    d = kv_reshard_side_rank(&l, 2, 0);
    BT_ASSERT_OK(kv_reshard_plan(&s, &d, a, b, 3, c, 0, &nc));
    BT_ASSERT_EQ(nc, 0);
    BT_TEST_PASS("reshard: bad input refused");
}

int main(void)
{
    test_identity_plan();
    test_pairs();
    test_errors();
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("kv/reshard");
    return 0;
}
