/*
 * test_cuda_kv_tier.c - the prefix cache's host tier on the cuda backend
 * (issue 38 item 4; backend_kv_save / backend_kv_load / backend_host_pin):
 *   1. bytes: blocks a forward wrote are saved to pinned host memory
 *      (contiguous runs and scattered blocks), loaded into other blocks,
 *      saved again: identical bytes; bad block ids are refused.
 *   2. round trip: each golden.jsonl line decoded greedily (float32) with
 *      its blocks inserted in a kv_prefix with a host tier, every block
 *      pushed to the host, then prompt + half the golden ids matched
 *      (every full block loaded back from the host) and decoded on:
 *      golden-exact.
 *   3. the copy stream (cuda: saves and loads off the compute stream):
 *      blocks saved, then at once overwritten by a forward of other
 *      tokens (kernels), hold the first bytes on the host; loaded back
 *      and read at once by a forward: the same logits as a copy of the
 *      prompt that never left the pool, and saved again, the same bytes.
 * Prints PASS/FAIL lines; exits non-zero on any failure.  An argument
 * names another backend ("cpu": the same checks without a GPU).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_golden.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_prefix.h"

#define POOL 64
#define BS 8
#define HOST 64

static int g_fail;
static const char *g_backend = "cuda";

static void cfg_small(backend_config_t *cfg)
{
    backend_config_init(cfg);
    cfg->n_kv_blocks = POOL;
    cfg->block_size = BS;
    cfg->max_batch_tokens = 1024;
    cfg->max_seqs = 16;
    cfg->precision = BACKEND_PRECISION_F32;
}

static void report(bool ok, const char *fmt, const char *detail)
{
    printf("%s kv tier %s: %s\n", ok ? "PASS" : "FAIL", fmt, detail);
    g_fail += !ok;
}

// ---------------------------------------------------------------------
// 1. bytes

static void test_bytes(model_t *m, const bt_golden_t *g)
{
    backend_t *be = NULL;
    backend_config_t cfg;
    size_t bb;
    char *h1, *h2;
    int table[16], n = BT_MIN(g->n_prompt + g->n_want, 16 * BS);
    int *ids = malloc(sizeof(int) * (size_t)n);
    float *logits;
    /* a run of three, then scattered; loaded into other blocks */
    int src[6] = { 0, 1, 2, 5, 9, 3 };
    int dst[6] = { 40, 41, 42, 60, 33, 50 };
    void *hp1[6], *hp2[6];
    int bad_id[1] = { POOL };
    bool ok;

    cfg_small(&cfg);
    BT_ASSERT_OK(backend_create(g_backend, m, &cfg, &be));
    logits = malloc(sizeof(float) * (size_t)model_config(m)->vocab_size);
    memcpy(ids, g->prompt, sizeof(int) * (size_t)g->n_prompt);
    memcpy(ids + g->n_prompt, g->want,
           sizeof(int) * (size_t)(n - g->n_prompt));
    for (int i = 0; i < 16; i++)
        table[i] = i;
    {
        backend_seq_t seq = { .n_tokens = n, .ctx_len = 0, .tokens = ids,
                              .block_table = table, .n_logits = 1 };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

        BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    }
    bb = backend_kv_host_block_bytes(be);
    h1 = calloc(6, bb);
    h2 = calloc(6, bb);
    BT_CHECK(h1 != NULL && h2 != NULL);
    BT_ASSERT_OK(backend_host_pin(be, h1, 6 * bb, true));
    BT_ASSERT_OK(backend_host_pin(be, h2, 6 * bb, true));
    for (int i = 0; i < 6; i++) {
        hp1[i] = h1 + (size_t)i * bb;
        hp2[i] = h2 + (size_t)i * bb;
    }
    BT_ASSERT_OK(backend_kv_save(be, 6, src, hp1));
    BT_ASSERT_OK(backend_kv_load(be, 6, dst, hp1));
    BT_ASSERT_OK(backend_kv_save(be, 6, dst, hp2));
    ok = memcmp(h1, h2, 6 * bb) == 0;
    {
        /* the forward wrote the saved blocks: not all zero */
        bool written = false;

        for (size_t i = 0; i < 6 * bb && !written; i++)
            written = h1[i] != 0;
        ok = ok && written;
    }
    report(ok, "bytes", "6 blocks (a run of 3 + scattered) saved, loaded "
           "elsewhere, saved again: identical");
    ok = backend_kv_save(be, 1, bad_id, hp1) == BT_ERR_INVALID_ARG &&
         backend_kv_load(be, -1, src, hp1) == BT_ERR_INVALID_ARG;
    report(ok, "bad ids", "a block outside the pool and n < 0 refused");
    BT_ASSERT_OK(backend_host_pin(be, h1, 6 * bb, false));
    BT_ASSERT_OK(backend_host_pin(be, h2, 6 * bb, false));
    free(h1);
    free(h2);
    free(ids);
    free(logits);
    backend_destroy(&be);
}

// ---------------------------------------------------------------------
// 3. the copy stream: a saved slot reused at once, a loaded one read at once

/* One forward of tokens[0..n) after ctx tokens in table; logits of the
 * last row into logits. */
static void fwd(backend_t *be, const int *tokens, int n, int ctx,
                int *table, float *logits)
{
    backend_seq_t seq = { .n_tokens = n, .ctx_len = ctx, .tokens = tokens,
                          .block_table = table, .n_logits = 1 };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
}

static void test_async(model_t *m, const bt_golden_t *g)
{
    enum { NB = 3, T = NB * BS };
    int vocab = model_config(m)->vocab_size;
    int a[T], b[T], next;
    int slot[NB + 1] = { 0, 1, 2, 3 };
    int ref[NB + 1] = { 20, 21, 22, 23 };
    void *hp[NB], *hp_ref[NB], *hp_again[NB];
    float *l_slot, *l_ref;
    backend_t *be = NULL;
    backend_config_t cfg;
    size_t bb;
    char *h, *h_ref, *h_again;
    bool ok;

    BT_CHECK(g->n_prompt + g->n_want > T);
    memcpy(a, g->prompt, sizeof(int) * (size_t)g->n_prompt);
    memcpy(a + g->n_prompt, g->want, sizeof(int) * (size_t)(T - g->n_prompt));
    next = g->want[T - g->n_prompt];
    for (int i = 0; i < T; i++) /* other tokens, same positions */
        b[i] = 3 + (a[i] * 7 + 11) % (vocab - 3);
    cfg_small(&cfg);
    BT_ASSERT_OK(backend_create(g_backend, m, &cfg, &be));
    bb = backend_kv_host_block_bytes(be);
    h = calloc(NB, bb);
    h_ref = calloc(NB, bb);
    h_again = calloc(NB, bb);
    l_slot = malloc(sizeof(float) * (size_t)vocab);
    l_ref = malloc(sizeof(float) * (size_t)vocab);
    BT_CHECK(h && h_ref && h_again && l_slot && l_ref);
    BT_ASSERT_OK(backend_host_pin(be, h, NB * bb, true));
    BT_ASSERT_OK(backend_host_pin(be, h_ref, NB * bb, true));
    BT_ASSERT_OK(backend_host_pin(be, h_again, NB * bb, true));
    for (int i = 0; i < NB; i++) {
        hp[i] = h + (size_t)i * bb;
        hp_ref[i] = h_ref + (size_t)i * bb;
        hp_again[i] = h_again + (size_t)i * bb;
    }
    /* the prompt twice: in the slots under test and in blocks that stay */
    fwd(be, a, T, 0, slot, l_slot);
    fwd(be, a, T, 0, ref, l_slot);
    /* save, then at once other KV into the same slots (kernels) */
    BT_ASSERT_OK(backend_kv_save(be, NB, slot, hp));
    fwd(be, b, T, 0, slot, l_slot);
    BT_ASSERT_OK(backend_kv_save(be, NB, ref, hp_ref));
    ok = memcmp(h, h_ref, NB * bb) == 0;
    report(ok, "async save", "3 blocks saved, then overwritten at once by "
           "a forward of other tokens: the host holds the first bytes");
    /* load back, then at once a forward that reads them */
    BT_ASSERT_OK(backend_kv_load(be, NB, slot, hp));
    fwd(be, &next, 1, T, slot, l_slot);
    fwd(be, &next, 1, T, ref, l_ref);
    ok = memcmp(l_slot, l_ref, sizeof(float) * (size_t)vocab) == 0;
    report(ok, "async load", "3 blocks loaded, read at once by a forward: "
           "the logits of the blocks that never left the pool");
    BT_ASSERT_OK(backend_kv_save(be, NB, slot, hp_again));
    ok = memcmp(h_again, h_ref, NB * bb) == 0;
    report(ok, "async round trip", "the loaded blocks saved again: the "
           "same bytes");
    BT_ASSERT_OK(backend_host_pin(be, h, NB * bb, false));
    BT_ASSERT_OK(backend_host_pin(be, h_ref, NB * bb, false));
    BT_ASSERT_OK(backend_host_pin(be, h_again, NB * bb, false));
    free(h);
    free(h_ref);
    free(h_again);
    free(l_slot);
    free(l_ref);
    backend_destroy(&be);
}

// ---------------------------------------------------------------------
// 2. prefix cache round trip through the host tier

static bt_status_t hook_save(void *arg, int n, const int *blocks,
                             void *const *host)
{
    return backend_kv_save(arg, n, blocks, host);
}

static bt_status_t hook_load(void *arg, int n, const int *blocks,
                             void *const *host)
{
    return backend_kv_load(arg, n, blocks, host);
}

static void round_trip(model_t *m, const bt_golden_t *g, int line)
{
    backend_t *be = NULL;
    backend_config_t cfg;
    kv_allocator_t *alloc = NULL;
    kv_prefix_t *prefix = NULL;
    kv_prefix_config_t pc;
    kv_prefix_stats_t st;
    bt_blockhash_t root;
    int vocab = model_config(m)->vocab_size;
    int table[POOL], fill[POOL], seq[POOL * BS + 1], out[POOL * BS + 1];
    int n_seq, n_out, need, hit, half, avail, first_bad = -1;
    char *host;
    char detail[400];

    cfg_small(&cfg);
    BT_ASSERT_OK(backend_create(g_backend, m, &cfg, &be));
    host = malloc((size_t)HOST * backend_kv_host_block_bytes(be));
    BT_CHECK(host != NULL);
    BT_ASSERT_OK(backend_host_pin(be, host, (size_t)HOST *
                                  backend_kv_host_block_bytes(be), true));
    BT_ASSERT_OK(kv_allocator_create(POOL, &alloc));
    kv_prefix_config_init(&pc);
    pc.block_size = BS;
    pc.model_id = g->model;
    pc.host_blocks = HOST;
    pc.host_block_bytes = backend_kv_host_block_bytes(be);
    pc.host_mem = host;
    pc.host_save = hook_save;
    pc.host_load = hook_load;
    pc.host_arg = be;
    BT_ASSERT_OK(kv_prefix_create(&pc, alloc, &prefix));
    root = kv_prefix_root(prefix, "", 0);

    /* cold: the golden decode, its blocks cached */
    need = BT_DIV_UP(g->steps, BS);
    BT_ASSERT_OK(kv_prefix_alloc(prefix, need, table));
    n_out = bt_golden_greedy(be, vocab, g->prompt, g->n_prompt, 0, g->steps,
                             table, out, NULL);
    memcpy(seq, g->prompt, sizeof(int) * (size_t)g->n_prompt);
    memcpy(seq + g->n_prompt, out, sizeof(int) * (size_t)n_out);
    n_seq = g->n_prompt + n_out;
    kv_prefix_insert(prefix, root, seq, n_seq - 1, table);
    kv_prefix_release(prefix, need, table);
    /* push every cached block to the host */
    avail = kv_prefix_available(prefix);
    BT_ASSERT_OK(kv_prefix_alloc(prefix, avail, fill));
    kv_prefix_release(prefix, avail, fill);
    kv_prefix_stats(prefix, &st);
    BT_CHECK(st.cached_blocks == 0 && st.host_cached > 0);

    /* warm: prompt + half the golden ids, its full blocks from the host */
    half = g->n_prompt + BT_MIN(n_out, g->n_want) / 2;
    hit = kv_prefix_match(prefix, root, seq, half, (half - 1) / BS, table);
    BT_ASSERT_OK(kv_prefix_alloc(prefix, need - hit, table + hit));
    n_out = bt_golden_greedy(be, vocab, seq, half, hit * BS, g->steps,
                             table, out, NULL);
    kv_prefix_release(prefix, need, table);
    kv_prefix_stats(prefix, &st);
    for (int i = 0; i < n_out && half - g->n_prompt + i < g->n_want; i++)
        if (out[i] != g->want[half - g->n_prompt + i]) {
            first_bad = i;
            break;
        }
    if (half - g->n_prompt + n_out != g->n_want)
        first_bad = first_bad < 0 ? n_out : first_bad;
    snprintf(detail, sizeof(detail), "line %d (%s): %d blocks back from "
             "the host, %d ids decoded on, first mismatch %d", line,
             g->model, hit, n_out, first_bad);
    report(first_bad < 0 && hit == (half - 1) / BS &&
           st.host_loads == (uint64_t)hit && kv_prefix_check(prefix),
           "golden round trip", detail);
    kv_prefix_destroy(&prefix);
    kv_allocator_destroy(&alloc);
    BT_ASSERT_OK(backend_host_pin(be, host, (size_t)HOST *
                                  backend_kv_host_block_bytes(be), false));
    free(host);
    backend_destroy(&be);
}

int main(int argc, char **argv)
{
    bt_golden_t *g;
    int n_lines;

    if (argc > 1)
        g_backend = argv[1];
    n_lines = bt_golden_read(&g);
    BT_CHECK(n_lines >= 2);
    for (int li = 0; li < n_lines; li++) {
        char path[512];
        model_t *m = NULL;

        if (g[li].steps > POOL * BS || g[li].n_prompt < 2)
            continue;
        snprintf(path, sizeof(path), "%s/models/%s", bt_golden_shared_dir(),
                 g[li].model);
        BT_ASSERT_OK(model_load(path, &m));
        if (li == 0) {
            test_bytes(m, &g[li]);
            test_async(m, &g[li]);
        }
        round_trip(m, &g[li], li);
        model_destroy(&m);
    }
    bt_golden_free(g, n_lines);
    printf("test_cuda_kv_tier (%s): %s\n", g_backend,
           g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
