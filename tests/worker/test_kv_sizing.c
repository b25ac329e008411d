/*
 * test_kv_sizing.c - the KV pool sized from memory (issue 36), cpu
 * backend: with n_kv_blocks 0 the pool follows the host budget
 * (kv_memory_bytes: blocks = budget / (bytes a token x block size)), is
 * capped at kv_auto_contexts (else max_seqs) full contexts, --kv-blocks
 * still wins, a budget below one block is a clear error, the default
 * budget stays small (CI), max_seqs 0 follows the pool, and the engine
 * and the backend report the sizes chosen (the allocator has them).
 */
#include <string.h>

#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "engine.h"

/* stories260K: 5 layers, 4 KV heads of 8, f32: 1280 bytes a token. */
#define TOKEN_BYTES 1280
#define CONTEXT 512

static engine_t *make(int n_kv_blocks, size_t budget, int contexts,
                      int max_seqs, bt_status_t *status_p)
{
    engine_config_t cfg;
    engine_t *e = NULL;

    engine_config_init(&cfg);
    cfg.model_path = BT_SHARED_DIR "/models/stories260K.bin";
    cfg.device = "cpu";
    cfg.backend.n_threads = 1;
    cfg.backend.n_kv_blocks = n_kv_blocks;
    cfg.backend.kv_memory_bytes = budget;
    cfg.backend.kv_auto_contexts = contexts;
    cfg.backend.max_seqs = max_seqs;
    *status_p = engine_create(&cfg, &e);
    return e;
}

/* Blocks the pool got, checked against the backend, the engine's config
 * and the allocator (all three must agree). */
static int blocks_of(engine_t *e)
{
    int n = backend_config(engine_backend(e))->n_kv_blocks;

    BT_ASSERT_EQ(engine_config(e)->backend.n_kv_blocks, n);
    BT_ASSERT_EQ(kv_allocator_total(engine_kv(e)), n);
    BT_ASSERT_EQ(backend_kv_layout(engine_backend(e))->n_blocks, n);
    BT_ASSERT_EQ((long)backend_kv_token_bytes(engine_backend(e)),
                 (long)TOKEN_BYTES);
    return n;
}

int main(void)
{
    engine_t *e;
    bt_status_t status;
    int n1, n2;

    bt_log_init("test");
    /* 1. The size follows the budget. */
    e = make(0, (size_t)1 << 20, 0, 0, &status);
    BT_ASSERT_OK(status);
    n1 = blocks_of(e);
    BT_ASSERT_EQ(n1, (1 << 20) / (TOKEN_BYTES * 16));
    engine_destroy(&e);
    e = make(0, (size_t)2 << 20, 0, 0, &status);
    BT_ASSERT_OK(status);
    n2 = blocks_of(e);
    BT_ASSERT_EQ(n2, (2 << 20) / (TOKEN_BYTES * 16));
    BT_CHECK(n2 >= 2 * n1 && n2 <= 2 * n1 + 1);
    engine_destroy(&e);

    /* 2. Capped: max_seqs (64) full contexts on cpu, or
     * kv_auto_contexts of them. */
    e = make(0, (size_t)1 << 30, 0, 0, &status);
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(blocks_of(e), 64 * CONTEXT / 16);
    engine_destroy(&e);
    e = make(0, (size_t)1 << 30, 2, 0, &status);
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(blocks_of(e), 2 * CONTEXT / 16);
    engine_destroy(&e);

    /* 3. --kv-blocks wins over any budget. */
    e = make(37, (size_t)1 << 20, 0, 0, &status);
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(blocks_of(e), 37);
    engine_destroy(&e);

    /* 4. The default host budget: at most BACKEND_KV_HOST_DEFAULT_MAX. */
    e = make(0, 0, 0, 0, &status);
    BT_ASSERT_OK(status);
    n1 = blocks_of(e);
    BT_CHECK(n1 >= 1);
    BT_CHECK((size_t)n1 * 16 * TOKEN_BYTES <= BACKEND_KV_HOST_DEFAULT_MAX);
    engine_destroy(&e);

    /* 5. max_seqs 0 follows the pool: min(64, batch tokens, blocks). */
    e = make(8, 0, 0, 0, &status);
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(engine_config(e)->backend.max_seqs, 8);
    BT_ASSERT_EQ(backend_config(engine_backend(e))->max_seqs, 8);
    engine_destroy(&e);
    e = make(0, (size_t)1 << 20, 0, 0, &status); /* 51 blocks */
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(engine_config(e)->backend.max_seqs, 51);
    engine_destroy(&e);
    e = make(0, (size_t)2 << 20, 0, 0, &status); /* 102 blocks */
    BT_ASSERT_OK(status);
    BT_ASSERT_EQ(engine_config(e)->backend.max_seqs, BACKEND_MAX_SEQS_CPU);
    /* the warm-up runs the served shapes and gives every block back */
    BT_ASSERT_OK(engine_warmup(e, 32, 64, true));
    BT_ASSERT_EQ(kv_allocator_free_count(engine_kv(e)),
                 kv_allocator_total(engine_kv(e)));
    engine_destroy(&e);

    /* 6. A budget below one block: a clear error, nothing created. */
    e = make(0, 1000, 0, 0, &status);
    BT_ASSERT_EQ(status, BT_ERR_NO_MEMORY);
    BT_CHECK(e == NULL);
    BT_CHECK(strstr(bt_error_last(), "no room for the KV pool") != NULL);
    bt_error_clear();

    BT_TEST_PASS("worker/kv_sizing: the cpu KV pool follows its budget, "
                 "capped, overridable, reported");
    return 0;
}
