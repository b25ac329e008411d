/*
 * test_llama2c.c - loads the shared llama2.c checkpoints and checks their
 * configs and tensor views against the header and known values.
 */
#include <stdio.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"

static void check_model(const char *file, int dim, int hidden, int layers,
                        int heads, int kv_heads, int vocab, int seq)
{
    char path[1024];
    model_t *model = NULL;
    const model_config_t *c;
    float v[4];

    snprintf(path, sizeof(path), "%s/models/%s", BT_SHARED_DIR, file);
    BT_ASSERT_OK(model_load(path, &model));
    c = model_config(model);
    BT_ASSERT_EQ(model_format(model), MODEL_FORMAT_LLAMA2C);
    BT_ASSERT_EQ(c->dim, dim);
    BT_ASSERT_EQ(c->hidden_dim, hidden);
    BT_ASSERT_EQ(c->n_layers, layers);
    BT_ASSERT_EQ(c->n_heads, heads);
    BT_ASSERT_EQ(c->n_kv_heads, kv_heads);
    BT_ASSERT_EQ(c->head_dim, dim / heads);
    BT_ASSERT_EQ(c->vocab_size, vocab);
    BT_ASSERT_EQ(c->max_seq_len, seq);
    BT_ASSERT_EQ(c->rope_layout, MODEL_ROPE_ADJACENT);
    BT_ASSERT_EQ(c->bos_id, 1);
    BT_ASSERT_EQ(c->n_eos, 1);
    BT_ASSERT_EQ(c->eos_ids[0], 1);
    BT_CHECK(c->tied_embeddings);
    BT_CHECK(model_classifier(model)->data == model_tok_embedding(model)->data);
    BT_ASSERT_EQ(model_layer(model, layers - 1)->wk.rows,
                 kv_heads * (dim / heads));
    BT_CHECK(model_layer(model, 0)->bq.data == NULL);
    model_tensor_to_f32(model_final_norm(model), 0, 4, v);
    BT_CHECK(isfinite(v[0]) && v[0] != 0.0f);
    /* embedding + per layer (2 norms, q, k, v, o, 3 ffn) + final norm */
    BT_ASSERT_EQ(model_param_count(model),
                 (int64_t)vocab * dim +
                     (int64_t)layers *
                         (2 * dim + 2 * dim * dim +
                          2 * (int64_t)kv_heads * (dim / heads) * dim +
                          3 * (int64_t)hidden * dim) +
                     dim);
    BT_ASSERT_EQ(model_weight_bytes(model), 4 * model_param_count(model));
    model_destroy(&model);
    BT_CHECK(model == NULL);
}

int main(void)
{
    bt_log_init("test");
    check_model("aidreams260K.bin", 64, 172, 4, 4, 4, 512, 128);
    check_model("stories260K.bin", 64, 172, 5, 8, 4, 512, 512);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("model/llama2c");
    return 0;
}
