/*
 * test_hf.c - the shared models load through both loaders (llama2.c .bin
 * and the Hugging Face -hf directories) with identical configs (except the
 * RoPE layout and stop ids) and identical weights once q/k rows are
 * un-permuted from the half-split layout.
 */
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"

static void expect_same(const char *what, const model_tensor_t *a,
                        const model_tensor_t *b)
{
    if (a->rows != b->rows || a->cols != b->cols)
        BT_TEST_FAIL("%s: shapes %lldx%lld vs %lldx%lld", what,
                     (long long)a->rows, (long long)a->cols,
                     (long long)b->rows, (long long)b->cols);
    BT_ASSERT_EQ(a->dtype, MODEL_DTYPE_F32);
    BT_ASSERT_EQ(b->dtype, MODEL_DTYPE_F32);
    if (memcmp(a->data, b->data, (size_t)(a->rows * a->cols) * 4) != 0)
        BT_TEST_FAIL("%s: weights differ", what);
}

/* a is adjacent-pair (llama2.c), b half-split (HF): HF row h*hd + j*hd/2 + i
 * must equal llama2.c row h*hd + 2i + j. */
static void expect_permuted(const char *what, const model_tensor_t *a,
                            const model_tensor_t *b, int hd)
{
    BT_ASSERT_EQ(a->rows, b->rows);
    BT_ASSERT_EQ(a->cols, b->cols);
    for (int64_t r = 0; r < b->rows; r++) {
        int64_t h = r / hd, k = r % hd, j = k / (hd / 2), i = k % (hd / 2);
        int64_t src = h * hd + 2 * i + j;
        const float *ra = (const float *)a->data + src * a->cols;
        const float *rb = (const float *)b->data + r * b->cols;
        if (memcmp(ra, rb, (size_t)a->cols * 4) != 0)
            BT_TEST_FAIL("%s: HF row %lld != llama2.c row %lld", what,
                         (long long)r, (long long)src);
    }
}

static void compare(const char *name)
{
    char p1[1024], p2[1024];
    model_t *a = NULL, *b = NULL;
    const model_config_t *ca, *cb;

    snprintf(p1, sizeof(p1), "%s/models/%s.bin", BT_SHARED_DIR, name);
    snprintf(p2, sizeof(p2), "%s/models/%s-hf", BT_SHARED_DIR, name);
    BT_ASSERT_OK(model_load(p1, &a));
    BT_ASSERT_OK(model_load(p2, &b));
    BT_ASSERT_EQ(model_format(b), MODEL_FORMAT_HF);
    BT_ASSERT_STREQ(model_architecture(b), "LlamaForCausalLM");
    ca = model_config(a);
    cb = model_config(b);
    BT_ASSERT_EQ(ca->dim, cb->dim);
    BT_ASSERT_EQ(ca->hidden_dim, cb->hidden_dim);
    BT_ASSERT_EQ(ca->n_layers, cb->n_layers);
    BT_ASSERT_EQ(ca->n_heads, cb->n_heads);
    BT_ASSERT_EQ(ca->n_kv_heads, cb->n_kv_heads);
    BT_ASSERT_EQ(ca->head_dim, cb->head_dim);
    BT_ASSERT_EQ(ca->vocab_size, cb->vocab_size);
    BT_ASSERT_EQ(ca->max_seq_len, cb->max_seq_len);
    BT_ASSERT_NEAR(ca->rope_theta, cb->rope_theta, 0);
    BT_ASSERT_NEAR(ca->rms_eps, cb->rms_eps, 0);
    BT_ASSERT_EQ(ca->rope_scaling, cb->rope_scaling);
    BT_ASSERT_EQ(ca->tied_embeddings, cb->tied_embeddings);
    BT_ASSERT_EQ(ca->qkv_bias, cb->qkv_bias);
    BT_ASSERT_EQ(ca->bos_id, cb->bos_id);
    BT_ASSERT_EQ(cb->rope_layout, MODEL_ROPE_HALF);
    /* generation_config.json names EOS 2 (see the models README) */
    BT_ASSERT_EQ(cb->n_eos, 1);
    BT_ASSERT_EQ(cb->eos_ids[0], 2);
    BT_ASSERT_EQ(model_param_count(a), model_param_count(b));

    expect_same("embedding", model_tok_embedding(a), model_tok_embedding(b));
    expect_same("final_norm", model_final_norm(a), model_final_norm(b));
    expect_same("classifier", model_classifier(a), model_classifier(b));
    for (int l = 0; l < ca->n_layers; l++) {
        const model_layer_t *la = model_layer(a, l), *lb = model_layer(b, l);
        expect_same("attn_norm", &la->attn_norm, &lb->attn_norm);
        expect_permuted("wq", &la->wq, &lb->wq, ca->head_dim);
        expect_permuted("wk", &la->wk, &lb->wk, ca->head_dim);
        expect_same("wv", &la->wv, &lb->wv);
        expect_same("wo", &la->wo, &lb->wo);
        expect_same("ffn_norm", &la->ffn_norm, &lb->ffn_norm);
        expect_same("w_gate", &la->w_gate, &lb->w_gate);
        expect_same("w_up", &la->w_up, &lb->w_up);
        expect_same("w_down", &la->w_down, &lb->w_down);
    }
    model_destroy(&a);
    model_destroy(&b);
}

int main(void)
{
    char p[1024];
    model_t *m = NULL;

    bt_log_init("test");
    compare("aidreams260K");
    compare("stories260K");
    /* config.json and model.safetensors paths load the directory too */
    snprintf(p, sizeof(p), "%s/models/aidreams260K-hf/config.json",
             BT_SHARED_DIR);
    BT_ASSERT_OK(model_load(p, &m));
    model_destroy(&m);
    snprintf(p, sizeof(p), "%s/models/stories260K-hf/model.safetensors",
             BT_SHARED_DIR);
    BT_ASSERT_OK(model_load(p, &m));
    model_destroy(&m);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("model/hf");
    return 0;
}
