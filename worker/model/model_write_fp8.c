/*
 * model_write_fp8.c - writes a model as a compressed-tensors FP8
 * checkpoint (see model_write_hf_fp8 in model_write.h).
 *
 * The output tensors are built in memory first (a name, a safetensors
 * dtype, a shape and the bytes), then sorted and written in one pass:
 * unlike model_write_hf, one file mixes F8_E4M3, F32 and BF16 tensors.
 * Fine for the models baton quantizes on a CPU; a 70B model would want a
 * streaming writer.
 */
#include "model_write.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_fp8.h"
#include "bt_util.h"
#include "model_int.h"

typedef struct {
    char name[256];       /* tensor name */
    const char *dtype;    /* "F8_E4M3", "F32", "BF16" */
    int ndim;             /* entries used in shape (0: a scalar) */
    int64_t shape[3];
    void *data;           /* (bytes) owned */
    size_t bytes;
} fp8_entry_t;

typedef struct {
    fp8_entry_t *e;       /* (n) */
    int n;
    int cap;
} fp8_list_t;

/* Appends an entry that takes ownership of `data` (freed on failure). */
static bt_status_t fp8_add(fp8_list_t *l, const char *name, const char *dtype,
                           int ndim, const int64_t *shape, void *data,
                           size_t bytes)
{
    fp8_entry_t *e;

    if (data == NULL)
        return BT_ERR_NO_MEMORY;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;

        e = bt_realloc(l->e, sizeof(*e) * (size_t)cap, "fp8_write");
        if (e == NULL) {
            bt_free(data);
            return BT_ERR_NO_MEMORY;
        }
        l->e = e;
        l->cap = cap;
    }
    e = &l->e[l->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->data = data;
    e->bytes = bytes;
    return BT_OK;
}

/* Tensor t as f32 rows in the Hugging Face layout: q/k rows (or bias
 * elements) of an adjacent-pair RoPE model permuted to half-split.
 * bt_malloc'ed, rows * cols floats. */
static float *fp8_rows_f32(const model_t *m, const model_tensor_t *t,
                           bool qk)
{
    int64_t rows = t->rows, cols = t->cols, n = rows * cols;
    bool perm = qk && m->cfg.rope_layout == MODEL_ROPE_ADJACENT;
    float *src = bt_malloc((size_t)n * sizeof(float), "fp8_write");
    float *dst;

    if (src == NULL)
        return NULL;
    model_tensor_to_f32(t, 0, n, src);
    if (!perm)
        return src;
    dst = bt_malloc((size_t)n * sizeof(float), "fp8_write");
    if (dst != NULL) {
        if (rows == 1) { /* a bias: permute elements */
            for (int64_t r = 0; r < cols; r++)
                dst[r] = src[model__rope_row_adj_to_half(r,
                                                         m->cfg.head_dim)];
        } else {
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + r * cols,
                       src + model__rope_row_adj_to_half(r, m->cfg.head_dim) *
                                 cols,
                       (size_t)cols * sizeof(float));
        }
    }
    bt_free(src);
    return dst;
}

/* A plain tensor as BF16, or F32 with keep_f32. */
static bt_status_t fp8_add_plain(fp8_list_t *l, const model_t *m,
                                const char *name, const model_tensor_t *t,
                                bool qk, bool keep_f32)
{
    int64_t n = t->rows * t->cols;
    int64_t shape[2] = { t->rows, t->cols };
    float *f = fp8_rows_f32(m, t, qk);
    uint16_t *h;

    if (f == NULL)
        return BT_ERR_NO_MEMORY;
    if (keep_f32)
        return fp8_add(l, name, "F32", t->rows == 1 ? 1 : 2,
                       t->rows == 1 ? &shape[1] : shape, f,
                       (size_t)n * sizeof(float));
    h = bt_malloc((size_t)n * sizeof(*h), "fp8_write");
    if (h != NULL)
        for (int64_t i = 0; i < n; i++)
            h[i] = model_f32_to_bf16(f[i]);
    bt_free(f);
    if (t->rows == 1)
        return fp8_add(l, name, "BF16", 1, &shape[1], h,
                       (size_t)n * sizeof(*h));
    return fp8_add(l, name, "BF16", 2, shape, h, (size_t)n * sizeof(*h));
}

/* A single F32 value as a [1] tensor. */
static bt_status_t fp8_add_scalar(fp8_list_t *l, const char *name, float v)
{
    int64_t one = 1;
    float *p = bt_malloc(sizeof(float), "fp8_write");

    if (p != NULL)
        *p = v;
    return fp8_add(l, name, "F32", 1, &one, p, sizeof(float));
}

/* Linear `base` (e.g. "model.layers.0.self_attn.q_proj"): base.weight as
 * E4M3 codes, base.weight_scale, and base.input_scale when in_scale > 0. */
static bt_status_t fp8_add_linear(fp8_list_t *l, const model_t *m,
                                  const char *base, const model_tensor_t *t,
                                  bool qk, bool per_tensor, float in_scale)
{
    int64_t rows = t->rows, cols = t->cols;
    int64_t wshape[2] = { rows, cols }, sshape[2] = { rows, 1 };
    float *f = fp8_rows_f32(m, t, qk), *scale;
    uint8_t *codes;
    char name[256];
    float amax_all = 0.0f;
    bt_status_t status;

    if (f == NULL)
        return BT_ERR_NO_MEMORY;
    scale = bt_malloc((size_t)rows * sizeof(float), "fp8_write");
    codes = bt_malloc((size_t)(rows * cols), "fp8_write");
    if (scale == NULL || codes == NULL) {
        bt_free(f);
        bt_free(scale);
        bt_free(codes);
        return BT_ERR_NO_MEMORY;
    }
    for (int64_t r = 0; r < rows; r++) {
        float amax = 0.0f;

        for (int64_t j = 0; j < cols; j++)
            amax = fmaxf(amax, fabsf(f[r * cols + j]));
        scale[r] = bt_fp8_scale(amax);
        amax_all = fmaxf(amax_all, amax);
    }
    if (per_tensor)
        for (int64_t r = 0; r < rows; r++)
            scale[r] = bt_fp8_scale(amax_all);
    for (int64_t r = 0; r < rows; r++) {
        float inv = 1.0f / scale[r];

        for (int64_t j = 0; j < cols; j++)
            codes[r * cols + j] = bt_f32_to_e4m3(f[r * cols + j] * inv);
    }
    bt_free(f);
    snprintf(name, sizeof(name), "%s.weight", base);
    status = fp8_add(l, name, "F8_E4M3", 2, wshape, codes,
                     (size_t)(rows * cols));
    if (status != BT_OK) {
        bt_free(scale);
        return status;
    }
    snprintf(name, sizeof(name), "%s.weight_scale", base);
    if (per_tensor) {
        float s = scale[0];

        bt_free(scale);
        status = fp8_add_scalar(l, name, s);
    } else {
        status = fp8_add(l, name, "F32", 2, sshape, scale,
                         (size_t)rows * sizeof(float));
    }
    if (status != BT_OK || !(in_scale > 0.0f))
        return status;
    snprintf(name, sizeof(name), "%s.input_scale", base);
    return fp8_add_scalar(l, name, in_scale);
}

static int fp8_cmp(const void *a, const void *b)
{
    return strcmp(((const fp8_entry_t *)a)->name,
                  ((const fp8_entry_t *)b)->name);
}

/* Sorts the entries and writes them as one safetensors file (header
 * padded to 8 bytes with spaces, as the Python library writes it),
 * through path.tmp. */
static bt_status_t fp8_write_st(fp8_list_t *l, const char *path)
{
    char tmp[PATH_MAX + 128];
    size_t cap = 64 + (size_t)l->n * 320, len;
    char *hdr = bt_malloc(cap, "fp8_write");
    uint64_t off = 0;
    uint8_t len8[8];
    FILE *fp = NULL;
    bt_status_t status = BT_OK;

    if (hdr == NULL)
        return BT_ERR_NO_MEMORY;
    qsort(l->e, (size_t)l->n, sizeof(*l->e), fp8_cmp);
    len = (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < l->n; i++) {
        const fp8_entry_t *e = &l->e[i];
        char shape[96];
        int sl = 0;

        shape[0] = '\0';
        for (int d = 0; d < e->ndim; d++)
            sl += snprintf(shape + sl, sizeof(shape) - (size_t)sl, "%s%lld",
                           d ? "," : "", (long long)e->shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len,
                                ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                "\"data_offsets\":[%llu,%llu]}", e->name,
                                e->dtype, shape, (unsigned long long)off,
                                (unsigned long long)(off + e->bytes));
        off += e->bytes;
    }
    hdr[len++] = '}';
    while (len % 8 != 0)
        hdr[len++] = ' ';
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fp = fopen(tmp, "wb");
    if (fp == NULL) {
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot create %s: %s", tmp,
                          strerror(errno));
        goto out;
    }
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(hdr, 1, len, fp) != len)
        goto err_write;
    for (int i = 0; i < l->n; i++)
        if (fwrite(l->e[i].data, 1, l->e[i].bytes, fp) != l->e[i].bytes)
            goto err_write;
    if (fclose(fp) != 0) {
        fp = NULL;
        goto err_write;
    }
    fp = NULL;
    if (rename(tmp, path) != 0)
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot rename %s: %s", tmp,
                          strerror(errno));
    goto out;

err_write:
    status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", tmp,
                      strerror(errno));
out:
    if (fp != NULL)
        fclose(fp);
    if (status != BT_OK)
        unlink(tmp);
    bt_free(hdr);
    return status;
}

/* config.json's quantization_config member. */
static void fp8_quant_json(const model_fp8_write_t *q, char *out, size_t len)
{
    const char *args = "\"num_bits\": 8, \"type\": \"float\", "
                       "\"symmetric\": true, \"group_size\": null, "
                       "\"block_structure\": null, \"actorder\": null, "
                       "\"observer\": \"minmax\", \"observer_kwargs\": {}";
    char act[512], kv[512];

    if (q->input_scale != NULL)
        snprintf(act, sizeof(act), "{%s, \"strategy\": \"tensor\", "
                 "\"dynamic\": false}", args);
    else
        snprintf(act, sizeof(act), "{%s, \"strategy\": \"token\", "
                 "\"dynamic\": true}", args);
    if (q->kv_scale != NULL)
        snprintf(kv, sizeof(kv), "{%s, \"strategy\": \"%s\", "
                 "\"dynamic\": false}", args,
                 q->kv_per_head ? "attn_head" : "tensor");
    else
        snprintf(kv, sizeof(kv), "null");
    if (q->kv_only) {
        snprintf(out, len,
                 "\"quantization_config\": {\"quant_method\": "
                 "\"compressed-tensors\", \"format\": \"dense\", "
                 "\"quantization_status\": \"compressed\", "
                 "\"global_compression_ratio\": null, "
                 "\"config_groups\": {}, \"ignore\": [], "
                 "\"kv_cache_scheme\": %s, \"sparsity_config\": {}}",
                 kv);
        return;
    }
    snprintf(out, len,
             "\"quantization_config\": {\"quant_method\": "
             "\"compressed-tensors\", \"format\": \"float-quantized\", "
             "\"quantization_status\": \"compressed\", "
             "\"global_compression_ratio\": null, "
             "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
             "\"format\": \"float-quantized\", "
             "\"weights\": {%s, \"strategy\": \"%s\", \"dynamic\": false}, "
             "\"input_activations\": %s, \"output_activations\": null}}, "
             "\"ignore\": [\"lm_head\"], \"kv_cache_scheme\": %s, "
             "\"sparsity_config\": {}}",
             args, q->per_tensor ? "tensor" : "channel", act, kv);
}

bt_status_t model_write_hf_fp8(const model_t *model, const char *dir,
                               const model_fp8_write_t *q)
{
    static const char *const lin[MODEL_N_LINEAR] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    };
    const model_config_t *c = &model->cfg;
    int nkv = c->n_kv_heads;
    fp8_list_t l = { NULL, 0, 0 };
    char name[192], path[PATH_MAX + 64], qjson[3072];
    bt_status_t status;

    if (q->kv_only && q->kv_scale == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "a KV-only checkpoint "
                        "needs KV scales");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot create directory %s: %s",
                        dir, strerror(errno));
    fp8_quant_json(q, qjson, sizeof(qjson));
    status = model__write_hf_config(model, dir, q->keep_f32
                                                    ? MODEL_DTYPE_F32
                                                    : MODEL_DTYPE_BF16, qjson);
    if (status != BT_OK)
        return status;

    status = fp8_add_plain(&l, model, "model.embed_tokens.weight",
                          &model->tok_embedding, false,
                                  q->keep_f32);
    for (int i = 0; i < c->n_layers && status == BT_OK; i++) {
        const model_layer_t *ly = &model->layers[i];
        const model_tensor_t *bias[3] = { &ly->bq, &ly->bk, &ly->bv };

        snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight",
                 i);
        status = fp8_add_plain(&l, model, name, &ly->attn_norm, false,
                                  q->keep_f32);
        snprintf(name, sizeof(name),
                 "model.layers.%d.post_attention_layernorm.weight", i);
        if (status == BT_OK)
            status = fp8_add_plain(&l, model, name, &ly->ffn_norm, false,
                                  q->keep_f32);
        for (int k = 0; k < MODEL_N_LINEAR && status == BT_OK; k++) {
            float in = q->input_scale ? q->input_scale[i * MODEL_N_LINEAR + k]
                                      : 0.0f;
            const model_tensor_t *w =
                model_layer_linear(ly, (model_linear_t)k);
            bool qk = k == MODEL_LIN_Q || k == MODEL_LIN_K;

            if (q->kv_only) { /* as the other plain tensors */
                snprintf(name, sizeof(name), "model.layers.%d.%s.weight", i,
                         lin[k]);
                status = fp8_add_plain(&l, model, name, w, qk, q->keep_f32);
                continue;
            }
            snprintf(name, sizeof(name), "model.layers.%d.%s", i, lin[k]);
            status = fp8_add_linear(&l, model, name, w, qk, q->per_tensor,
                                    in);
        }
        for (int k = 0; k < 3 && status == BT_OK; k++) {
            if (!c->qkv_bias || bias[k]->data == NULL)
                continue;
            snprintf(name, sizeof(name), "model.layers.%d.%s.bias", i,
                     lin[k]);
            status = fp8_add_plain(&l, model, name, bias[k], k < 2,
                                  q->keep_f32);
        }
        for (int kv = 0; kv < 2 && q->kv_scale != NULL && status == BT_OK;
             kv++) {
            const float *s = q->kv_scale + ((size_t)i * 2 + kv) * nkv;

            snprintf(name, sizeof(name), "model.layers.%d.self_attn.%c_scale",
                     i, kv ? 'v' : 'k');
            if (q->kv_per_head) {
                int64_t shape[3] = { nkv, 1, 1 };
                float *p = bt_malloc((size_t)nkv * sizeof(float),
                                     "fp8_write");

                if (p != NULL)
                    memcpy(p, s, (size_t)nkv * sizeof(float));
                status = fp8_add(&l, name, "F32", 3, shape, p,
                                 (size_t)nkv * sizeof(float));
            } else {
                float mx = 0.0f;

                for (int h = 0; h < nkv; h++)
                    mx = fmaxf(mx, s[h]);
                status = fp8_add_scalar(&l, name, mx);
            }
        }
    }
    if (status == BT_OK)
        status = fp8_add_plain(&l, model, "model.norm.weight",
                              &model->final_norm, false,
                                  q->keep_f32);
    if (status == BT_OK && !c->tied_embeddings &&
        model->classifier.data != model->tok_embedding.data)
        status = fp8_add_plain(&l, model, "lm_head.weight", &model->classifier,
                              false, q->keep_f32);
    if (status == BT_OK) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        status = fp8_write_st(&l, path);
    }
    for (int i = 0; i < l.n; i++)
        bt_free(l.e[i].data);
    bt_free(l.e);
    return status;
}
