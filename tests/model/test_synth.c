/*
 * test_synth.c - synthesized models: deterministic in (shape, seed, dtype)
 * whatever the thread count, sane statistics, and synth -> write HF -> load
 * gives identical tensors in f32, bf16 and f16.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"
#include "model/model_synth.h"
#include "model/model_write.h"
#include "model_test_util.h"

static void check_stats(const model_t *m)
{
    const model_tensor_t *t = &model_layer(m, 0)->w_gate;
    int64_t n = t->rows * t->cols;
    float *v = malloc((size_t)n * sizeof(float));
    double sum = 0, sq = 0;

    model_tensor_to_f32(t, 0, n, v);
    for (int64_t i = 0; i < n; i++) {
        sum += v[i];
        sq += (double)v[i] * v[i];
    }
    BT_ASSERT_NEAR(sum / n, 0.0, 0.001);
    BT_ASSERT_NEAR(sqrt(sq / n), 0.02, 0.001);
    model_tensor_to_f32(&model_layer(m, 0)->attn_norm, 0, 4, v);
    BT_ASSERT_NEAR(v[0], 1.0, 0);
    BT_ASSERT_NEAR(v[3], 1.0, 0);
    model_tensor_to_f32(model_final_norm(m), 0, 1, v);
    BT_ASSERT_NEAR(v[0], 1.0, 0);
    free(v);
}

static void roundtrip(const char *shape, model_dtype_t dtype)
{
    char tmp[256];
    model_t *m = NULL, *m2 = NULL;
    const model_config_t *a, *b;

    mt_mkdtemp(tmp, sizeof(tmp));
    BT_ASSERT_OK(model_synth_create(shape, 42, (int)dtype, &m));
    BT_ASSERT_EQ(model_tok_embedding(m)->dtype, dtype);
    BT_ASSERT_OK(model_write_hf(m, tmp, dtype));
    BT_ASSERT_OK(model_load(tmp, &m2));
    a = model_config(m);
    b = model_config(m2);
    BT_ASSERT_STREQ(model_architecture(m), model_architecture(m2));
    BT_CHECK(memcmp(a, b, sizeof(*a)) == 0);
    mt_same_weights(m, m2);
    BT_ASSERT_EQ(model_param_count(m), model_param_count(m2));
    model_destroy(&m2);

    /* model_synth_from_config on the written config gives the same model */
    BT_ASSERT_OK(model_synth_from_config(tmp, 42, (int)dtype, &m2));
    BT_CHECK(memcmp(a, model_config(m2), sizeof(*a)) == 0);
    mt_same_weights(m, m2);
    model_destroy(&m2);
    model_destroy(&m);
    mt_rmtree(tmp);
}

int main(void)
{
    model_t *a = NULL, *b = NULL;
    model_config_t cfg;

    bt_log_init("test");

    /* same seed, different thread counts: same bytes */
    setenv("BT_SYNTH_THREADS", "1", 1);
    BT_ASSERT_OK(model_load("synth:tiny-gqa:7", &a));
    setenv("BT_SYNTH_THREADS", "3", 1);
    BT_ASSERT_OK(model_synth_create("tiny-gqa", 7, MODEL_SYNTH_DTYPE_DEFAULT,
                                    &b));
    unsetenv("BT_SYNTH_THREADS");
    BT_ASSERT_EQ(model_format(a), MODEL_FORMAT_SYNTH);
    BT_ASSERT_EQ(model_config(a)->n_kv_heads, 2);
    BT_ASSERT_EQ(model_config(a)->rope_layout, MODEL_ROPE_HALF);
    BT_CHECK(model_config(a)->tied_embeddings);
    mt_same_weights(a, b);
    check_stats(a);
    model_destroy(&b);
    /* another seed differs */
    BT_ASSERT_OK(model_load("synth:tiny-gqa:8", &b));
    BT_CHECK(memcmp(model_layer(a, 1)->wq.data, model_layer(b, 1)->wq.data,
                    64) != 0);
    model_destroy(&b);
    model_destroy(&a);

    /* the tiny shape of the brief */
    BT_ASSERT_OK(model_load("synth:tiny", &a));
    BT_ASSERT_EQ(model_config(a)->dim, 64);
    BT_ASSERT_EQ(model_config(a)->hidden_dim, 172);
    BT_ASSERT_EQ(model_config(a)->n_layers, 2);
    BT_ASSERT_EQ(model_config(a)->n_heads, 4);
    BT_ASSERT_EQ(model_config(a)->n_kv_heads, 2);
    BT_ASSERT_EQ(model_config(a)->vocab_size, 512);
    BT_ASSERT_EQ(model_config(a)->max_seq_len, 256);
    BT_ASSERT_EQ(model_tok_embedding(a)->dtype, MODEL_DTYPE_F32);
    BT_CHECK(model_classifier(a)->data != model_tok_embedding(a)->data);
    model_destroy(&a);

    /* qwen2 biases are present and round-trip */
    BT_ASSERT_OK(model_load("synth:tiny-qwen2:3", &a));
    BT_CHECK(model_layer(a, 1)->bk.data != NULL);
    BT_ASSERT_EQ(model_layer(a, 1)->bk.cols, 2 * 16);
    BT_ASSERT_EQ(model_llama2c_check(a), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "bias") != NULL);
    model_destroy(&a);

    roundtrip("tiny", MODEL_DTYPE_F32);
    roundtrip("tiny", MODEL_DTYPE_BF16);
    roundtrip("tiny-gqa", MODEL_DTYPE_F16);
    roundtrip("tiny-qwen2", MODEL_DTYPE_BF16);

    /* big shapes: configs only (weights would take GBs) */
    BT_ASSERT_OK(model_synth_shape_config("llama3-8b", &cfg, NULL));
    BT_ASSERT_EQ(cfg.dim, 4096);
    BT_ASSERT_EQ(cfg.hidden_dim, 14336);
    BT_ASSERT_EQ(cfg.n_kv_heads, 8);
    BT_ASSERT_EQ(cfg.vocab_size, 128256);
    BT_ASSERT_NEAR(cfg.rope_theta, 500000.0, 0);
    BT_ASSERT_OK(model_config_validate(&cfg));
    BT_ASSERT_OK(model_synth_shape_config("llama3-70b", &cfg, NULL));
    BT_ASSERT_EQ(cfg.n_layers, 80);
    BT_ASSERT_OK(model_config_validate(&cfg));
    /* the head-64 shape: Llama 3.2's rope scaling factor is 32, not 3.1's 8 */
    BT_ASSERT_OK(model_synth_shape_config("llama3.2-1b", &cfg, NULL));
    BT_ASSERT_EQ(cfg.head_dim, 64);
    BT_ASSERT_EQ(cfg.n_layers, 16);
    BT_CHECK(cfg.tied_embeddings);
    BT_ASSERT_EQ(cfg.rope_scaling, MODEL_ROPE_SCALING_LLAMA3);
    BT_ASSERT_NEAR(cfg.rope_factor, 32.0, 0);
    BT_ASSERT_OK(model_synth_shape_config("llama3.1-8b", &cfg, NULL));
    BT_ASSERT_NEAR(cfg.rope_factor, 8.0, 0);
    for (int i = 0; i < model_synth_shape_count(); i++) {
        BT_ASSERT_OK(model_synth_shape_config(model_synth_shape_name(i), &cfg,
                                              NULL));
        BT_ASSERT_OK(model_config_validate(&cfg));
    }
    BT_ASSERT_EQ(model_load("synth:nope", &a), BT_ERR_NOT_FOUND);
    BT_CHECK(strstr(bt_error_last(), "nope") != NULL);
    BT_ASSERT_EQ(model_load("synth:tiny:x1", &a), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(model_load("synth:", &a), BT_ERR_INVALID_ARG);
    BT_CHECK(a == NULL);

    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("model/synth");
    return 0;
}
