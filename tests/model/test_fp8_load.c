/* test_fp8_load.c - FP8 checkpoints in: the quantization_config check
 * (compressed-tensors float-quantized and ModelOpt FP8 accepted, every
 * other method, format, bit width, type and group/block strategy refused
 * with an error naming it), model_write_hf_fp8 -> model_load round trips
 * (per channel and per tensor, with biases and KV scales, and the same
 * checkpoint relabelled as ModelOpt with its tensor names), and the
 * exactness of the two FP8 paths of the cpu backend: a checkpoint's codes
 * and scales give bit-identical logits to the backend quantizing the
 * original weights itself. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/model.h"
#include "model/model_write.h"

#define CT_ARGS "\"num_bits\": %d, \"type\": \"%s\", \"symmetric\": true, " \
                "\"group_size\": %s, \"strategy\": \"%s\", \"dynamic\": %s"

/* A config.json with a compressed-tensors quantization_config. */
static void ct_config(char *out, size_t len, const char *method,
                      const char *format, int bits, const char *type,
                      const char *wstrat, const char *group,
                      const char *act, const char *kv)
{
    char w[512];

    snprintf(w, sizeof(w), "{" CT_ARGS "}", bits, type, group, wstrat,
             "false");
    snprintf(out, len, "{\"architectures\": [\"LlamaForCausalLM\"], "
             "\"quantization_config\": {\"quant_method\": \"%s\", "
             "\"format\": \"%s\", \"config_groups\": {\"group_0\": "
             "{\"targets\": [\"Linear\"], \"weights\": %s, "
             "\"input_activations\": %s}}, \"ignore\": [\"lm_head\"], "
             "\"kv_cache_scheme\": %s}}", method, format, w, act, kv);
}

/* A config.json with a compressed-tensors quantization_config of no
 * weight scheme: `format` ("dense", ...), `groups` ("{}", "null") and
 * the kv_cache_scheme `kv` (a JSON value). */
static void ct_kv_only(char *out, size_t len, const char *format,
                       const char *groups, const char *kv)
{
    snprintf(out, len, "{\"quantization_config\": {\"quant_method\": "
             "\"compressed-tensors\", \"format\": \"%s\", "
             "\"config_groups\": %s, \"kv_cache_scheme\": %s}}", format,
             groups, kv);
}

static void expect_refused(const char *json, const char *hfq,
                           const char *needle)
{
    model_quant_t q;
    bt_status_t status = model_hf_quant_parse(json, strlen(json), hfq,
                                              hfq ? strlen(hfq) : 0, &q);

    if (status == BT_OK)
        BT_TEST_FAIL("accepted: %s", json);
    if (strstr(bt_error_last(), needle) == NULL)
        BT_TEST_FAIL("error '%s' does not name '%s'", bt_error_last(),
                     needle);
}

static void test_config(void)
{
    const char *tensor_static = "{\"num_bits\": 8, \"type\": \"float\", "
                                "\"strategy\": \"tensor\", \"dynamic\": "
                                "false, \"symmetric\": true}";
    const char *token_dynamic = "{\"num_bits\": 8, \"type\": \"float\", "
                                "\"strategy\": \"token\", \"dynamic\": "
                                "true, \"symmetric\": true}";
    char j[2048];
    model_quant_t q;

    /* accepted */
    BT_ASSERT_OK(model_hf_quant_parse("{}", 2, NULL, 0, &q));
    BT_CHECK(!q.fp8);
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "channel", "null", token_dynamic, "null");
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(q.fp8 && q.per_channel && !q.static_act && !q.kv_scales);
    BT_ASSERT_STREQ(q.scheme, "compressed-tensors");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "tensor", "null", tensor_static, tensor_static);
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(q.fp8 && !q.per_channel && q.static_act && q.kv_scales);
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "channel", "null", "null", "null");
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(q.fp8 && !q.static_act); /* weight-only: dynamic */
    snprintf(j, sizeof(j), "{\"quantization_config\": {\"quant_method\": "
             "\"modelopt\", \"quant_algo\": \"FP8\", "
             "\"kv_cache_quant_algo\": \"FP8\"}}");
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(q.fp8 && q.static_act && q.kv_scales);
    BT_ASSERT_STREQ(q.scheme, "modelopt");
    BT_ASSERT_OK(model_hf_quant_parse("{}", 2, "{\"quantization\": "
                                      "{\"quant_algo\": \"FP8\", "
                                      "\"kv_cache_quant_algo\": null}}",
                                      70, &q));
    BT_CHECK(q.fp8 && !q.kv_scales);
    /* the KV cache alone (llm-compressor's KV-only recipe, --kv-only) */
    ct_kv_only(j, sizeof(j), "dense", "{}", tensor_static);
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(!q.fp8 && q.kv_scales);
    BT_ASSERT_STREQ(q.scheme, "compressed-tensors");
    ct_kv_only(j, sizeof(j), "dense", "null", tensor_static);
    BT_ASSERT_OK(model_hf_quant_parse(j, strlen(j), NULL, 0, &q));
    BT_CHECK(!q.fp8 && q.kv_scales);

    /* refused, by name */
    ct_kv_only(j, sizeof(j), "dense", "{}", "null");
    expect_refused(j, NULL, "format 'dense'");
    ct_kv_only(j, sizeof(j), "pack-quantized", "{}", tensor_static);
    expect_refused(j, NULL, "format 'pack-quantized'");
    ct_kv_only(j, sizeof(j), "dense", "{}", token_dynamic);
    expect_refused(j, NULL, "kv_cache_scheme strategy 'token'");
    expect_refused("{\"quantization_config\": {\"quant_method\": \"awq\", "
                   "\"bits\": 4}}", NULL, "quant_method 'awq' is not "
                   "supported (supported: compressed-tensors "
                   "float-quantized FP8 (or a dense model with an FP8 "
                   "kv_cache_scheme), modelopt FP8)");
    expect_refused("{\"quantization_config\": {\"quant_method\": \"gptq\"}}",
                   NULL, "'gptq'");
    expect_refused("{\"quantization_config\": {\"quant_method\": \"fp8\", "
                   "\"weight_block_size\": [128, 128]}}", NULL, "'fp8'");
    ct_config(j, sizeof(j), "compressed-tensors", "pack-quantized", 4, "int",
              "group", "128", "null", "null");
    expect_refused(j, NULL, "format 'pack-quantized'");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 4,
              "float", "channel", "null", "null", "null");
    expect_refused(j, NULL, "num_bits 4");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "int", "channel", "null", "null", "null");
    expect_refused(j, NULL, "type 'int'");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "group", "128", "null", "null");
    expect_refused(j, NULL, "group / block");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "block", "null", "null", "null");
    expect_refused(j, NULL, "strategy 'block'");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "channel", "null",
              "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": "
              "\"token\", \"dynamic\": false}", "null");
    expect_refused(j, NULL, "strategy 'token' with dynamic false");
    ct_config(j, sizeof(j), "compressed-tensors", "float-quantized", 8,
              "float", "channel", "null", "null", token_dynamic);
    expect_refused(j, NULL, "kv_cache_scheme strategy 'token'");
    expect_refused("{\"quantization_config\": {\"quant_method\": "
                   "\"modelopt\", \"quant_algo\": \"NVFP4\"}}", NULL,
                   "quant_algo 'NVFP4'");
    expect_refused("{}", "{\"quantization\": {\"quant_algo\": \"W4A8_AWQ\"}}",
                   "quant_algo 'W4A8_AWQ'");
    expect_refused("{\"quantization_config\": 3}", NULL, "must be an object");
}

/* Rewrites dir's model.safetensors header with `from` -> `to` renames
 * and its config.json as ModelOpt's (no quantization_config, an
 * hf_quant_config.json beside it). */
static void relabel_modelopt(const char *dir)
{
    char path[PATH_MAX], *buf, *cfg, *hdr, *nh;
    size_t len, clen, hl, nl = 0;
    FILE *fp;

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    BT_ASSERT_OK(bt_read_file(path, 1 << 26, &buf, &len));
    hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (size_t)(uint8_t)buf[i] << (8 * i);
    hdr = buf + 8;
    nh = malloc(hl * 2 + 64);
    BT_CHECK(nh != NULL);
    for (size_t i = 0; i < hl;) {
        if (strncmp(hdr + i, "self_attn.k_scale\"", 18) == 0 ||
            strncmp(hdr + i, "self_attn.v_scale\"", 18) == 0) {
            char kv = hdr[i + 10];

            nl += (size_t)sprintf(nh + nl, "self_attn.%c_proj.%c_scale\"", kv,
                                  kv);
            i += 18;
        } else {
            nh[nl++] = hdr[i++];
        }
    }
    while (nl > 0 && nh[nl - 1] == ' ')
        nl--;
    while (nl % 8 != 0)
        nh[nl++] = ' ';
    fp = fopen(path, "wb");
    BT_CHECK(fp != NULL);
    for (int i = 0; i < 8; i++)
        fputc((int)((uint64_t)nl >> (8 * i)) & 0xff, fp);
    BT_CHECK(fwrite(nh, 1, nl, fp) == nl);
    BT_CHECK(fwrite(buf + 8 + hl, 1, len - 8 - hl, fp) == len - 8 - hl);
    BT_CHECK(fclose(fp) == 0);
    free(nh);
    bt_free(buf);

    snprintf(path, sizeof(path), "%s/config.json", dir);
    BT_ASSERT_OK(bt_read_file(path, 1 << 20, &cfg, &clen));
    hdr = strstr(cfg, ",\n  \"quantization_config\"");
    BT_CHECK(hdr != NULL);
    strcpy(hdr, "\n}\n");
    BT_ASSERT_OK(bt_write_file(path, cfg, strlen(cfg)));
    bt_free(cfg);
    snprintf(path, sizeof(path), "%s/hf_quant_config.json", dir);
    cfg = "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": "
          "{\"quant_algo\": \"FP8\", \"kv_cache_quant_algo\": \"FP8\", "
          "\"exclude_modules\": [\"lm_head\"]}}";
    BT_ASSERT_OK(bt_write_file(path, cfg, strlen(cfg)));
}

/* Logits of one prompt through a cpu backend. */
static void logits_of(const model_t *m, backend_precision_t prec,
                      backend_kv_dtype_t kv, float *out)
{
    static const int ids[12] = { 1, 5, 9, 33, 2, 7, 100, 64, 3, 17, 8, 4 };
    static const int table[4] = { 0, 1, 2, 3 };
    backend_seq_t seq = { .n_tokens = 12, .tokens = ids,
                          .block_table = table, .n_logits = 12 };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
    backend_config_t cfg;
    backend_t *be = NULL;

    backend_config_init(&cfg);
    cfg.n_kv_blocks = 4;
    cfg.block_size = 4;
    cfg.max_batch_tokens = 16;
    cfg.n_threads = 1;
    cfg.precision = prec;
    cfg.kv_dtype = kv;
    BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
    BT_ASSERT_OK(backend_forward(be, &batch, out, NULL));
    backend_destroy(&be);
}

static void test_roundtrip(const char *spec, bool per_tensor, bool modelopt,
                           const char *dir)
{
    model_t *o = NULL, *q = NULL;
    const model_config_t *c;
    float *in_scale, *kv_scale, *a, *b;
    model_fp8_write_t wq;
    size_t nl;
    int vocab;

    BT_ASSERT_OK(model_load(spec, &o));
    c = model_config(o);
    vocab = c->vocab_size;
    nl = (size_t)c->n_layers;
    in_scale = malloc(sizeof(float) * nl * MODEL_N_LINEAR);
    kv_scale = malloc(sizeof(float) * nl * 2 * (size_t)c->n_kv_heads);
    BT_CHECK(in_scale && kv_scale);
    for (size_t i = 0; i < nl * MODEL_N_LINEAR; i++)
        in_scale[i] = 0.01f + 0.001f * (float)i;
    for (size_t i = 0; i < nl * 2 * (size_t)c->n_kv_heads; i++)
        kv_scale[i] = 0.02f + 0.003f * (float)i;
    /* the ModelOpt case also keeps the unquantized tensors in f32 */
    wq = (model_fp8_write_t){ per_tensor, modelopt ? in_scale : NULL,
                              kv_scale, !modelopt, modelopt, false };
    BT_ASSERT_OK(model_write_hf_fp8(o, dir, &wq));
    if (modelopt)
        relabel_modelopt(dir);
    BT_ASSERT_OK(model_load(dir, &q));
    BT_CHECK(model_quant(q)->fp8);
    BT_ASSERT_STREQ(model_quant(q)->scheme,
                    modelopt ? "modelopt" : "compressed-tensors");
    BT_CHECK(model_quant(q)->kv_scales);
    BT_ASSERT_EQ(model_tok_embedding(q)->dtype,
                 modelopt ? MODEL_DTYPE_F32 : MODEL_DTYPE_BF16);
    for (int l = 0; l < c->n_layers; l++) {
        const model_layer_t *ly = model_layer(q, l);

        for (int h = 0; h < c->n_kv_heads; h++) {
            /* per head, or the layer's largest when written per layer */
            float k = kv_scale[((size_t)l * 2) * c->n_kv_heads +
                               (modelopt ? c->n_kv_heads - 1 : h)];

            BT_ASSERT_NEAR(ly->k_scale[h], k, 0);
        }
        for (int k = 0; k < MODEL_N_LINEAR; k++) {
            const model_fp8_t *f = &ly->fp8[k];

            BT_CHECK(f->codes != NULL);
            BT_ASSERT_EQ(f->n_w_scale, per_tensor
                                           ? 1 : model_layer_linear(ly, k)->rows);
            BT_ASSERT_NEAR(f->input_scale,
                           modelopt ? in_scale[l * MODEL_N_LINEAR + k] : 0,
                           0);
        }
    }

    /* per channel + dynamic: the checkpoint path equals the backend's own
     * quantization of the original, to the bit */
    a = malloc(sizeof(float) * (size_t)vocab * 12);
    b = malloc(sizeof(float) * (size_t)vocab * 12);
    BT_CHECK(a && b);
    logits_of(q, BACKEND_PRECISION_FP8, BACKEND_KV_DTYPE_FP8, a);
    if (!per_tensor && !modelopt) {
        logits_of(o, BACKEND_PRECISION_FP8, BACKEND_KV_DTYPE_AUTO, a);
        logits_of(q, BACKEND_PRECISION_FP8, BACKEND_KV_DTYPE_AUTO, b);
        BT_CHECK(memcmp(a, b, sizeof(float) * (size_t)vocab * 12) == 0);
    }
    /* the dequantized checkpoint runs anywhere as a plain model */
    logits_of(q, BACKEND_PRECISION_F32, BACKEND_KV_DTYPE_AUTO, b);
    for (int i = 0; i < vocab * 12; i++)
        BT_CHECK(b[i] == b[i]);
    free(a);
    free(b);
    free(in_scale);
    free(kv_scale);
    model_destroy(&q);
    model_destroy(&o);
}

/* An F8_E4M3 weight without an FP8 quantization config is refused: the
 * ModelOpt directory less its hf_quant_config.json. */
static void test_undeclared(const char *dir)
{
    char path[PATH_MAX];
    model_t *m = NULL;

    snprintf(path, sizeof(path), "%s/hf_quant_config.json", dir);
    BT_CHECK(unlink(path) == 0);
    BT_CHECK(model_load(dir, &m) != BT_OK);
    BT_CHECK(strstr(bt_error_last(), "F8_E4M3") != NULL);
}

int main(void)
{
    char tmp[] = "/tmp/bt_fp8_XXXXXX", dir[256], cmd[300];
    size_t before = bt_alloc_live_count();

    BT_CHECK(mkdtemp(tmp) != NULL);
    test_config();
    snprintf(dir, sizeof(dir), "%s/ch", tmp);
    test_roundtrip("synth:tiny-qwen2", false, false, dir);
    snprintf(dir, sizeof(dir), "%s/te", tmp);
    test_roundtrip("synth:tiny-gqa", true, false, dir);
    snprintf(dir, sizeof(dir), "%s/mo", tmp);
    test_roundtrip("synth:tiny", true, true, dir);
    test_undeclared(dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    BT_CHECK(system(cmd) == 0);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("fp8 checkpoints");
    return 0;
}
