/* test_cpu_bf16.c - the cpu backend's bf16 precision mode (the same-
 * precision reference for the CUDA backend's bf16 path):
 *   1. it rounds: every K and V value it caches is a bf16 value (the low
 *      16 bits of its float32 pattern are zero), while the float32 mode's
 *      cache is not;
 *   2. over the golden sequences, teacher-forced top-1 of bf16 against
 *      float32 is printed (the models' sensitivity to bf16, ~3%) and held
 *      to >= 90% (a wrong rounding point, e.g. rounding a residual add,
 *      moves far more);
 *   3. it is consistent across its own paths: the sequence as one prompt
 *      (prefill attention) and token by token (decode attention) agree on
 *      >= 99% of the positions, as the GPU is asked to against it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_golden.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv.h"

#define N_BLOCKS 64 /* the KV pool, and bt_golden_teacher_argmax's table */

/* Cached K/V values of layer 0 whose float32 pattern is not a bf16 one,
 * over the first n_slots slots the teacher-forced sequence wrote. */
static long non_bf16_values(backend_t *be, int n_slots)
{
    const kv_layout_t *kl = backend_kv_layout(be);
    size_t row = (size_t)kl->n_kv_heads * kl->head_dim;
    long bad = 0;

    for (int kv = 0; kv < 2; kv++) {
        const float *base = backend_kv_data(be, 0, kv);

        for (int s = 0; s < n_slots; s++) {
            int block = bt_golden_block(s / kl->block_size, N_BLOCKS);
            const float *v = base + kv_layout_offset(kl, 0, block,
                                                     s % kl->block_size);
            for (size_t i = 0; i < row; i++) {
                uint32_t u;

                memcpy(&u, &v[i], sizeof(u));
                bad += (u & 0xffffu) != 0;
            }
        }
    }
    return bad;
}

int main(void)
{
    bt_golden_t *g;
    int lines;
    long total = 0, vs_f32 = 0, paths = 0;
    size_t before = bt_alloc_live_count();

    lines = bt_golden_read(&g);
    BT_CHECK(lines >= 2);
    for (int l = 0; l < lines; l++) {
        char path[512];
        model_t *m = NULL;
        backend_t *f32 = NULL, *bf16 = NULL;
        backend_config_t cfg;
        int n = g[l].n_prompt + g[l].n_want;
        int *ids = malloc(sizeof(int) * (size_t)n);
        int *ref = malloc(sizeof(int) * (size_t)n);
        int *one = malloc(sizeof(int) * (size_t)n);
        int *dec = malloc(sizeof(int) * (size_t)n);
        int vocab;

        BT_CHECK(ids && ref && one && dec);
        memcpy(ids, g[l].prompt, sizeof(int) * (size_t)g[l].n_prompt);
        memcpy(ids + g[l].n_prompt, g[l].want,
               sizeof(int) * (size_t)g[l].n_want);
        snprintf(path, sizeof(path), "%s/models/%s", bt_golden_shared_dir(),
                 g[l].model);
        BT_ASSERT_OK(model_load(path, &m));
        vocab = model_config(m)->vocab_size;
        backend_config_init(&cfg);
        cfg.n_kv_blocks = N_BLOCKS;
        cfg.block_size = 8;
        cfg.max_batch_tokens = 512;
        cfg.n_threads = 1 + l % 2;
        cfg.precision = BACKEND_PRECISION_F32;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &f32));
        cfg.precision = BACKEND_PRECISION_BF16;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &bf16));

        bt_golden_teacher_argmax(f32, vocab, ids, n, n, N_BLOCKS, ref);
        BT_CHECK(non_bf16_values(f32, n) > 0);
        bt_golden_teacher_argmax(bf16, vocab, ids, n, n, N_BLOCKS, one);
        long bad = non_bf16_values(bf16, n);
        if (bad != 0)
            BT_TEST_FAIL("%s: %ld cached K/V values of the bf16 mode are not "
                         "bf16", path, bad);
        bt_golden_teacher_argmax(bf16, vocab, ids, n, 1, N_BLOCKS, dec);
        for (int i = 0; i < n; i++) {
            vs_f32 += one[i] == ref[i];
            paths += one[i] == dec[i];
        }
        total += n;
        backend_destroy(&bf16);
        backend_destroy(&f32);
        model_destroy(&m);
        free(ids);
        free(ref);
        free(one);
        free(dec);
    }
    bt_golden_free(g, lines);
    fprintf(stderr, "bf16 vs f32 top-1: %.2f%%, bf16 one prompt vs decode "
            "steps: %.2f%% of %ld positions\n", 100.0 * vs_f32 / total,
            100.0 * paths / total, total);
    BT_CHECK(100.0 * vs_f32 / total >= 90.0);
    BT_CHECK(100.0 * paths / total >= 99.0);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("cpu bf16 mode");
    return 0;
}
