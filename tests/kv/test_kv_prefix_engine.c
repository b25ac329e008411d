/* test_kv_prefix_engine.c - the prefix cache under a real engine (cpu
 * backend, the trained stories260K checkpoint): a request that reuses
 * cached blocks (kv_prefix_match + engine_seq_adopt_kv, as a worker will
 * wire it; the engine allocates, releases and evicts through the pool's
 * allocator unchanged, in a pool too small to keep everything) generates
 * exactly the tokens the same request computes with the cache off, for a
 * repeated prompt, for a continuation that reuses blocks holding
 * generated tokens, and under a second salt (which recomputes, then hits
 * its own blocks). */
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "engine.h"
#include "kv/kv_prefix.h"

#define STEPS 24

static engine_t *make(void)
{
    engine_config_t cfg;
    engine_t *e = NULL;

    engine_config_init(&cfg);
    cfg.model_path = BT_SHARED_DIR "/models/stories260K.bin";
    cfg.device = "cpu";
    cfg.backend.n_threads = 1;
    /* tight: 84 tokens (6 blocks) a request, so the engine's own
     * allocations evict cached blocks */
    cfg.backend.n_kv_blocks = 9;
    cfg.backend.max_seqs = 4;
    BT_ASSERT_OK(engine_create(&cfg, &e));
    return e;
}

/* Generates STEPS greedy tokens after prompt[0..n) into out.  With a
 * cache: reuses its blocks under `root` (at least one prompt token is
 * computed), and afterwards caches the sequence's full blocks and hands
 * them back through the cache (returns the hit in blocks). */
static int generate(engine_t *e, kv_prefix_t *prefix, bt_blockhash_t root,
                    const int *prompt, int n, int *out)
{
    sampler_params_t sp;
    engine_seq_t *seq = NULL;
    int bs = engine_block_size(e);
    int ids[64];
    int hit = 0;

    sampler_params_init(&sp);
    sp.temperature = 0;
    BT_ASSERT_OK(engine_seq_create(e, prompt, n, &sp, &seq));
    if (prefix != NULL) {
        hit = kv_prefix_match(prefix, root, prompt, n, (n - 1) / bs, ids);
        if (hit > 0)
            BT_ASSERT_OK(engine_seq_adopt_kv(e, seq, ids, hit, hit * bs));
    }
    for (int g = 0; g < STEPS;) {
        int tok = -1;

        BT_ASSERT_OK(engine_step(e, &seq, 1, 0, &tok));
        if (tok >= 0)
            out[g++] = tok;
    }
    if (prefix != NULL) {
        const int *tokens = engine_seq_tokens(seq);
        int n_blocks;
        const int *blocks = engine_seq_blocks(seq, &n_blocks);

        kv_prefix_insert(prefix, root, tokens, engine_seq_cached(seq),
                         blocks);
    }
    /* The engine frees its table through the allocator as always; the
     * attached cache keeps the cached blocks, evictable. */
    engine_seq_destroy(e, &seq);
    if (prefix != NULL)
        BT_CHECK(kv_prefix_check(prefix));
    return hit;
}

int main(void)
{
    size_t before = bt_alloc_live_count();
    engine_t *e;
    kv_prefix_config_t pc;
    kv_prefix_t *prefix = NULL;
    bt_blockhash_t r_a, r_b, none = { 0, 0 };
    int prompt[40 + STEPS];
    int off[STEPS], on[STEPS], off2[STEPS], on2[STEPS];
    int n2, bs, hit;
    kv_prefix_stats_t st;

    bt_log_init("test");
    e = make();
    bs = engine_block_size(e);
    for (int i = 0; i < 40; i++)
        prompt[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    kv_prefix_config_init(&pc);
    pc.block_size = bs;
    pc.model_id = "stories260K.bin";
    pc.kv_dtype = "f32";
    BT_ASSERT_OK(kv_prefix_create(&pc, engine_kv(e), &prefix));
    r_a = kv_prefix_root(prefix, "a", 1);
    r_b = kv_prefix_root(prefix, "b", 1);

    /* cache off */
    generate(e, NULL, none, prompt, 40, off);
    /* cache on, cold: computes everything, caches its full blocks */
    BT_ASSERT_EQ(generate(e, prefix, r_a, prompt, 40, on), 0);
    BT_CHECK(memcmp(on, off, sizeof(off)) == 0);
    /* cache on, warm: the prompt's full blocks come from the cache */
    BT_ASSERT_EQ(generate(e, prefix, r_a, prompt, 40, on), 39 / bs);
    for (int i = 0; i < STEPS; i++)
        if (on[i] != off[i])
            BT_TEST_FAIL("warm token %d: %d with the cache, %d without", i,
                         on[i], off[i]);

    /* a continuation: prompt + the first 20 generated tokens reuses the
     * blocks that hold generated tokens too */
    memcpy(prompt + 40, off, 20 * sizeof(int));
    n2 = 60;
    generate(e, NULL, none, prompt, n2, off2);
    hit = generate(e, prefix, r_a, prompt, n2, on2);
    BT_ASSERT_EQ(hit, (n2 - 1) / bs);
    BT_CHECK(hit * bs > 40);
    for (int i = 0; i < STEPS; i++)
        if (on2[i] != off2[i])
            BT_TEST_FAIL("continuation token %d: %d with the cache, %d "
                         "without", i, on2[i], off2[i]);

    /* another salt: two computations, same output */
    BT_ASSERT_EQ(generate(e, prefix, r_b, prompt, 40, on), 0);
    BT_CHECK(memcmp(on, off, sizeof(off)) == 0);
    BT_ASSERT_EQ(generate(e, prefix, r_b, prompt, 40, on), 39 / bs);
    BT_CHECK(memcmp(on, off, sizeof(off)) == 0);

    kv_prefix_stats(prefix, &st);
    fprintf(stderr, "engine: block_size:%d pool:%d hit_blocks:%llu "
            "lookups:%llu evictions:%llu cached:%d\n", bs,
            kv_allocator_total(engine_kv(e)),
            (unsigned long long)st.hit_blocks,
            (unsigned long long)st.lookups,
            (unsigned long long)st.evictions, st.cached_blocks);
    BT_CHECK(st.evictions > 0);
    kv_prefix_destroy(&prefix);
    BT_ASSERT_EQ(kv_allocator_free_count(engine_kv(e)),
                 kv_allocator_total(engine_kv(e)));
    engine_destroy(&e);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("engine: output with the cache = output without, token "
                 "for token");
    return 0;
}
