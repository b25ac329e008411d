/* test_cpu_fp8.c - the cpu backend's fp8 precision and fp8 KV cache (the
 * reference the CUDA FP8 kernels will be checked against):
 *   1. --kv-dtype fp8 stores bytes (kv_layout elem_size 1): with bf16
 *      precision, layer 0's cached codes equal bt_f32_to_e4m3 of the
 *      bf16-KV backend's cached K/V (the same values up to that store)
 *      divided by the layer/head scale, for every slot the sequence
 *      wrote; block copies and slot copies move bytes;
 *   2. over the golden sequences, teacher-forced top-1 agreement (bf16 vs
 *      f32 is the models' own sensitivity: the ceiling), fp8 weights +
 *      dynamic activations vs bf16, and the same with fp8 KV (scale 1):
 *      aidreams260K holds >= 97%; stories260K, which FP8 moves far more,
 *      its measured level less a margin (PERFORMANCE.md);
 *   3. fp8 + fp8 KV is consistent across its own paths: the sequence as
 *      one prompt and token by token agree (aidreams >= 99%; stories,
 *      whose E4M3 roundings flip on the two paths' float differences,
 *      >= 95%). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_fp8.h"
#include "bt_golden.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv.h"

#define N_BLOCKS 64

/* Layer-0 codes of the kv8 backend against its bf16-KV twin. */
static void check_kv_codes(backend_t *b16, backend_t *b8, int n_slots)
{
    const kv_layout_t *l16 = backend_kv_layout(b16);
    const kv_layout_t *l8 = backend_kv_layout(b8);
    size_t row = (size_t)l8->n_kv_heads * l8->head_dim;
    long checked = 0, nonzero = 0;

    BT_ASSERT_EQ(l16->elem_size, 4);
    BT_ASSERT_EQ(l8->elem_size, 1);
    for (int kv = 0; kv < 2; kv++) {
        const float *f = backend_kv_data(b16, 0, kv);
        const uint8_t *c = backend_kv_data(b8, 0, kv);

        for (int s = 0; s < n_slots; s++) {
            int block = bt_golden_block(s / l8->block_size, N_BLOCKS);
            size_t off = kv_layout_offset(l8, 0, block, s % l8->block_size);

            for (size_t i = 0; i < row; i++) {
                /* the model has no k/v scales: 1.0 */
                uint8_t want = bt_f32_to_e4m3(f[off + i]);

                if (c[off + i] != want)
                    BT_TEST_FAIL("slot %d kv %d elem %zu: code 0x%02x, want "
                                 "0x%02x (value %g)", s, kv, i, c[off + i],
                                 want, (double)f[off + i]);
                nonzero += c[off + i] != 0;
                checked++;
            }
        }
    }
    BT_CHECK(nonzero > checked / 2);
}

/* Block and slot copies move E4M3 bytes. */
static void check_kv_copies(backend_t *b8)
{
    const kv_layout_t *l = backend_kv_layout(b8);
    size_t bytes = kv_layout_block_bytes(l);
    int src = bt_golden_block(0, N_BLOCKS), dst = N_BLOCKS - 1;
    int ss = src * l->block_size + 1, ds = dst * l->block_size + 3;
    const uint8_t *k = backend_kv_data(b8, 1, 0);

    BT_ASSERT_OK(backend_kv_copy_block(b8, src, dst));
    BT_CHECK(memcmp(k + kv_layout_offset(l, 1, src, 0),
                    k + kv_layout_offset(l, 1, dst, 0), bytes) == 0);
    BT_ASSERT_OK(backend_kv_copy_slots(b8, 1, &ss, &ds));
    BT_CHECK(memcmp(k + kv_layout_offset(l, 1, src, 1),
                    k + kv_layout_offset(l, 1, dst, 3),
                    (size_t)l->n_kv_heads * l->head_dim) == 0);
}

/* The calibration statistic: absmax, and percentiles read from the log2
 * histogram within one bin (1/16 octave). */
static void check_calib(void)
{
    static backend_calib_stat_t st;
    float v[1000];

    for (int i = 0; i < 1000; i++)
        v[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i + 1);
    backend_calib_add(&st, v, 1000);
    BT_ASSERT_EQ(st.count, 1000);
    BT_ASSERT_NEAR(backend_calib_percentile(&st, 100.0), 1000.0, 0);
    BT_ASSERT_NEAR(backend_calib_percentile(&st, 50.0), 500.0, 500.0 * 0.05);
    BT_ASSERT_NEAR(backend_calib_percentile(&st, 99.9), 999.0, 1000.0 * 0.05);
    BT_CHECK(backend_calib_percentile(&st, 99.9) <= 1000.0);
}

int main(void)
{
    bt_golden_t *g;
    int lines;
    /* per model: [0] aidreams260K, [1] stories260K */
    long total[2] = { 0 }, bf16_f32[2] = { 0 }, fp8_bf16[2] = { 0 };
    long kv8_bf16[2] = { 0 }, paths[2] = { 0 };
    /* held: aidreams the 97%; stories260K its measured level
     * less a margin (FP8 moves it far more than bf16: PERFORMANCE.md) */
    const double min_fp8[2] = { 97.0, 62.0 }, min_kv8[2] = { 96.5, 61.0 };
    const double min_paths[2] = { 99.0, 95.0 };
    const char *names[2] = { "aidreams260K", "stories260K" };
    size_t before = bt_alloc_live_count();

    check_calib();
    lines = bt_golden_read(&g);
    BT_CHECK(lines >= 2);
    for (int l = 0; l < lines; l++) {
        char path[512];
        model_t *m = NULL;
        backend_t *f32 = NULL, *bf16 = NULL, *fp8 = NULL, *kv8 = NULL;
        backend_t *b16kv8 = NULL;
        backend_config_t cfg;
        int n = g[l].n_prompt + g[l].n_want;
        int *ids = malloc(sizeof(int) * (size_t)n);
        int *a = malloc(sizeof(int) * (size_t)n);
        int *b = malloc(sizeof(int) * (size_t)n);
        int *c = malloc(sizeof(int) * (size_t)n);
        int *d = malloc(sizeof(int) * (size_t)n);
        int *e = malloc(sizeof(int) * (size_t)n);
        int vocab, k = strstr(g[l].model, "stories") != NULL;

        BT_CHECK(ids && a && b && c && d && e);
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
        cfg.kv_dtype = BACKEND_KV_DTYPE_FP8;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &b16kv8));
        cfg.precision = BACKEND_PRECISION_FP8;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &kv8));
        cfg.kv_dtype = BACKEND_KV_DTYPE_AUTO;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &fp8));

        bt_golden_teacher_argmax(f32, vocab, ids, n, n, N_BLOCKS, a);
        bt_golden_teacher_argmax(bf16, vocab, ids, n, n, N_BLOCKS, b);
        bt_golden_teacher_argmax(b16kv8, vocab, ids, n, n, N_BLOCKS, e);
        check_kv_codes(bf16, b16kv8, n);
        bt_golden_teacher_argmax(fp8, vocab, ids, n, n, N_BLOCKS, c);
        bt_golden_teacher_argmax(kv8, vocab, ids, n, n, N_BLOCKS, d);
        bt_golden_teacher_argmax(kv8, vocab, ids, n, 1, N_BLOCKS, e);
        check_kv_copies(kv8);
        for (int i = 0; i < n; i++) {
            bf16_f32[k] += b[i] == a[i];
            fp8_bf16[k] += c[i] == b[i];
            kv8_bf16[k] += d[i] == b[i];
            paths[k] += d[i] == e[i];
        }
        total[k] += n;
        backend_destroy(&b16kv8);
        backend_destroy(&kv8);
        backend_destroy(&fp8);
        backend_destroy(&bf16);
        backend_destroy(&f32);
        model_destroy(&m);
        free(ids);
        free(a);
        free(b);
        free(c);
        free(d);
        free(e);
    }
    bt_golden_free(g, lines);
    for (int k = 0; k < 2; k++) {
        double pf = 100.0 * fp8_bf16[k] / total[k];
        double pk = 100.0 * kv8_bf16[k] / total[k];
        double pp = 100.0 * paths[k] / total[k];

        BT_CHECK(total[k] > 0);
        fprintf(stderr, "%s, teacher-forced top-1 over %ld golden positions: "
                "bf16 vs f32 %.2f%% (ceiling), fp8 vs bf16 %.2f%%, fp8+kv8 "
                "vs bf16 %.2f%%, fp8+kv8 one prompt vs decode steps "
                "%.2f%%\n", names[k], total[k],
                100.0 * bf16_f32[k] / total[k], pf, pk, pp);
        if (pf < min_fp8[k] || pk < min_kv8[k] || pp < min_paths[k])
            BT_TEST_FAIL("%s below the held levels (fp8 >= %.1f%%, kv8 >= "
                         "%.1f%%, paths >= %.1f%%)", names[k], min_fp8[k],
                         min_kv8[k], min_paths[k]);
    }
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("cpu fp8 mode");
    return 0;
}
