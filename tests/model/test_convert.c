/*
 * test_convert.c - llama2.c <-> Hugging Face conversion of the shared
 * models: .bin -> HF gives exactly the shared -hf model.safetensors (same
 * bytes, so the q/k permutation matches llama2.c's export), and both
 * directions round-trip (the legacy RoPE tables of a .bin, which nothing
 * reads, are regenerated to within float rounding).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"
#include "model/model_write.h"
#include "model_test_util.h"

/* Compares two llama2.c files: header and weights byte-exact, RoPE tables
 * (which start at `tab_off` and take `tab_bytes`) within 1e-6. */
static void same_llama2c(const char *a, const char *b, const model_t *m)
{
    const model_config_t *c = model_config(m);
    size_t na, nb, tab_off, tab_bytes;
    char *da = mt_read(a, &na), *db = mt_read(b, &nb);
    int64_t n = 7 * 4;

    BT_ASSERT_EQ(na, nb);
    n += 4 * ((int64_t)c->vocab_size * c->dim +
              (int64_t)c->n_layers *
                  (2 * c->dim + 2 * (int64_t)c->dim * c->dim +
                   2 * (int64_t)c->n_kv_heads * c->head_dim * c->dim +
                   3 * (int64_t)c->hidden_dim * c->dim) +
              c->dim);
    tab_off = (size_t)n;
    tab_bytes = (size_t)c->max_seq_len * (size_t)c->head_dim * 4;
    BT_CHECK(memcmp(da, db, tab_off) == 0);
    BT_CHECK(memcmp(da + tab_off + tab_bytes, db + tab_off + tab_bytes,
                    na - tab_off - tab_bytes) == 0);
    for (size_t i = 0; i < tab_bytes / 4; i++) {
        float x, y;
        memcpy(&x, da + tab_off + 4 * i, 4);
        memcpy(&y, db + tab_off + 4 * i, 4);
        BT_ASSERT_NEAR(x, y, 1e-6);
    }
    bt_free(da);
    bt_free(db);
}

static void convert(const char *name)
{
    char bin[1024], hf[1024], hf_st[1100], tmp[256], out[512], out_st[600];
    char out_bin[512], out2[512], out2_st[600];
    model_t *m = NULL, *m2 = NULL, *m3 = NULL;

    snprintf(bin, sizeof(bin), "%s/models/%s.bin", BT_SHARED_DIR, name);
    snprintf(hf, sizeof(hf), "%s/models/%s-hf", BT_SHARED_DIR, name);
    snprintf(hf_st, sizeof(hf_st), "%s/model.safetensors", hf);
    mt_mkdtemp(tmp, sizeof(tmp));
    snprintf(out, sizeof(out), "%s/hf", tmp);
    snprintf(out_st, sizeof(out_st), "%s/model.safetensors", out);
    snprintf(out_bin, sizeof(out_bin), "%s/model.bin", tmp);
    snprintf(out2, sizeof(out2), "%s/hf2", tmp);
    snprintf(out2_st, sizeof(out2_st), "%s/model.safetensors", out2);

    /* .bin -> HF: the exact bytes of the shared -hf safetensors */
    BT_ASSERT_OK(model_load(bin, &m));
    BT_ASSERT_OK(model_write_hf(m, out, MODEL_DTYPE_F32));
    mt_same_file(out_st, hf_st);
    /* ... and it loads to the same config and weights as the shared dir */
    BT_ASSERT_OK(model_load(out, &m2));
    BT_ASSERT_OK(model_load(hf, &m3));
    mt_same_weights(m2, m3);
    BT_ASSERT_EQ(model_config(m2)->n_kv_heads, model_config(m3)->n_kv_heads);
    BT_ASSERT_EQ(model_config(m2)->max_seq_len, model_config(m3)->max_seq_len);
    BT_ASSERT_EQ(model_config(m2)->tied_embeddings,
                 model_config(m3)->tied_embeddings);
    BT_ASSERT_NEAR(model_config(m2)->rms_eps, model_config(m3)->rms_eps, 0);
    BT_ASSERT_NEAR(model_config(m2)->rope_theta, model_config(m3)->rope_theta,
                   0);
    model_destroy(&m3);

    /* HF -> .bin: the original .bin back */
    BT_ASSERT_OK(model_write_llama2c(m2, out_bin));
    same_llama2c(out_bin, bin, m);
    BT_ASSERT_OK(model_load(out_bin, &m3));
    mt_same_weights(m, m3);
    model_destroy(&m3);
    model_destroy(&m2);

    /* shared HF -> .bin -> HF: the shared safetensors back */
    BT_ASSERT_OK(model_load(hf, &m2));
    BT_ASSERT_OK(model_write_llama2c(m2, out_bin));
    BT_ASSERT_OK(model_load(out_bin, &m3));
    BT_ASSERT_OK(model_write_hf(m3, out2, MODEL_DTYPE_F32));
    mt_same_file(out2_st, hf_st);
    model_destroy(&m3);
    model_destroy(&m2);
    model_destroy(&m);
    mt_rmtree(tmp);
}

int main(void)
{
    bt_log_init("test");
    convert("aidreams260K");
    convert("stories260K");
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("model/convert");
    return 0;
}
