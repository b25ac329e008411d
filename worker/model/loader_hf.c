/*
 * loader_hf.c - Hugging Face Llama-family directories: config.json (+
 * generation_config.json) and model.safetensors or a sharded
 * model.safetensors.index.json.  Shards are mmap'ed; every tensor's dtype
 * and shape is checked against the config.
 */
#include "model_int.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_fp8.h"
#include "bt_util.h"
#include "safetensors.h"

#define HF_MAX_JSON (64u << 20) /* config / index file size limit */

// ----------------------------------------------------------------------------
// config.json

static const char *const hf_archs[] = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
};

/* Reads an integer field.  Absent (or null when allow_null): returns BT_OK
 * and leaves *v_p untouched if !required. */
static bt_status_t hf_get_int(const cJSON *obj, const char *field,
                              bool required, int *v_p)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);
    double d;

    if (it == NULL || cJSON_IsNull(it)) {
        if (required)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "config.json: missing field %s", field);
        return BT_OK;
    }
    if (!cJSON_IsNumber(it))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config.json: field %s must be an integer", field);
    d = it->valuedouble;
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX) || floor(d) != d)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config.json: field %s = %g is not a 32-bit integer",
                        field, d);
    *v_p = (int)d;
    return BT_OK;
}

static bt_status_t hf_get_float(const cJSON *obj, const char *field,
                                float *v_p)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);

    if (it == NULL || cJSON_IsNull(it))
        return BT_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config.json: field %s must be a number", field);
    *v_p = (float)it->valuedouble;
    return BT_OK;
}

static bt_status_t hf_get_bool(const cJSON *obj, const char *field,
                               bool *v_p)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);

    if (it == NULL || cJSON_IsNull(it))
        return BT_OK;
    if (!cJSON_IsBool(it))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config.json: field %s must be true or false", field);
    *v_p = cJSON_IsTrue(it);
    return BT_OK;
}

/* bos_token_id / eos_token_id: int, list of ints or null.  `found_p` says
 * whether the field was present (so generation_config can override). */
static bt_status_t hf_get_token_ids(const cJSON *obj, const char *field,
                                    int *ids, int max_ids, int *n_p,
                                    bool *found_p)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);
    const cJSON *el;
    int n = 0;

    *found_p = false;
    if (it == NULL)
        return BT_OK;
    *found_p = true;
    if (cJSON_IsNull(it)) {
        *n_p = 0;
        return BT_OK;
    }
    if (cJSON_IsNumber(it)) {
        bt_status_t status = hf_get_int(obj, field, true, &ids[0]);
        if (status != BT_OK)
            return status;
        *n_p = 1;
        return BT_OK;
    }
    if (!cJSON_IsArray(it))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config: field %s must be an integer or a list", field);
    cJSON_ArrayForEach(el, it) {
        double d;
        if (!cJSON_IsNumber(el))
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "config: field %s has a non-integer entry", field);
        d = el->valuedouble;
        if (!(d >= 0 && d <= (double)INT_MAX) || floor(d) != d)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "config: field %s has a bad id %g", field, d);
        if (n == max_ids) {
            BT_LOG_WARN("MODEL", "config: %s has more than %d ids; "
                        "keeping the first %d", field, max_ids, max_ids);
            break;
        }
        ids[n++] = (int)d;
    }
    *n_p = n;
    return BT_OK;
}

/* rope_scaling / rope_parameters: {rope_type|type, factor, ...}. */
static bt_status_t hf_parse_rope(const cJSON *rope, model_config_t *cfg)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rope, "rope_type");
    bt_status_t status;

    if (type == NULL)
        type = cJSON_GetObjectItemCaseSensitive(rope, "type");
    status = hf_get_float(rope, "rope_theta", &cfg->rope_theta);
    if (status != BT_OK)
        return status;
    if (type == NULL || cJSON_IsNull(type))
        return BT_OK;
    if (!cJSON_IsString(type))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config.json: rope_type must be a string");
    if (strcmp(type->valuestring, "default") == 0)
        return BT_OK;
    if (strcmp(type->valuestring, "linear") == 0) {
        cfg->rope_scaling = MODEL_ROPE_SCALING_LINEAR;
    } else if (strcmp(type->valuestring, "llama3") == 0) {
        cfg->rope_scaling = MODEL_ROPE_SCALING_LLAMA3;
        cfg->rope_low_freq_factor = 1.0f;
        cfg->rope_high_freq_factor = 4.0f;
        cfg->rope_orig_max_pos = 8192;
    } else {
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "config.json: rope_type \"%s\" is not supported "
                        "(default, linear, llama3 are)", type->valuestring);
    }
    cfg->rope_factor = 0.0f;
    if ((status = hf_get_float(rope, "factor", &cfg->rope_factor)) != BT_OK ||
        (status = hf_get_float(rope, "low_freq_factor",
                               &cfg->rope_low_freq_factor)) != BT_OK ||
        (status = hf_get_float(rope, "high_freq_factor",
                               &cfg->rope_high_freq_factor)) != BT_OK)
        return status;
    return hf_get_int(rope, "original_max_position_embeddings", false,
                      &cfg->rope_orig_max_pos);
}

bt_status_t model_hf_config_parse(const char *json, size_t len,
                                  const char *gen_json, size_t gen_len,
                                  model_config_t *cfg_p, char *arch,
                                  size_t arch_len)
{
    cJSON *root = NULL, *gen = NULL;
    const cJSON *archs, *a0, *rope;
    model_config_t cfg;
    bool is_qwen2 = false, found;
    bool supported = false;
    int bos[1];
    int n_bos = 0;
    bt_status_t status;

    memset(&cfg, 0, sizeof(cfg));
    root = cJSON_ParseWithLength(json, len);
    if (root == NULL || !cJSON_IsObject(root)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json is not a JSON object");
        goto out;
    }
    archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json: missing field architectures (a list "
                          "of names)");
        goto out;
    }
    for (size_t i = 0; i < BT_ARRAY_SIZE(hf_archs); i++)
        supported |= strcmp(a0->valuestring, hf_archs[i]) == 0;
    if (!supported) {
        status = BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                          "config.json: architecture %.100s is not supported "
                          "(LlamaForCausalLM, MistralForCausalLM, "
                          "Qwen2ForCausalLM are)", a0->valuestring);
        goto out;
    }
    is_qwen2 = strcmp(a0->valuestring, "Qwen2ForCausalLM") == 0;

    cfg.rope_theta = 10000.0f;
    cfg.rms_eps = 1e-6f;
    cfg.rope_layout = MODEL_ROPE_HALF;
    cfg.rope_scaling = MODEL_ROPE_SCALING_NONE;
    cfg.bos_id = -1;
    cfg.n_kv_heads = -1;
    cfg.head_dim = -1;
    if ((status = hf_get_int(root, "hidden_size", true, &cfg.dim)) ||
        (status = hf_get_int(root, "intermediate_size", true,
                             &cfg.hidden_dim)) ||
        (status = hf_get_int(root, "num_hidden_layers", true,
                             &cfg.n_layers)) ||
        (status = hf_get_int(root, "num_attention_heads", true,
                             &cfg.n_heads)) ||
        (status = hf_get_int(root, "num_key_value_heads", false,
                             &cfg.n_kv_heads)) ||
        (status = hf_get_int(root, "head_dim", false, &cfg.head_dim)) ||
        (status = hf_get_int(root, "vocab_size", true, &cfg.vocab_size)) ||
        (status = hf_get_int(root, "max_position_embeddings", true,
                             &cfg.max_seq_len)) ||
        (status = hf_get_float(root, "rms_norm_eps", &cfg.rms_eps)) ||
        (status = hf_get_float(root, "rope_theta", &cfg.rope_theta)) ||
        (status = hf_get_bool(root, "tie_word_embeddings",
                              &cfg.tied_embeddings)) ||
        (status = hf_get_bool(root, "attention_bias", &cfg.qkv_bias)))
        goto out;
    {
        bool mlp_bias = false;
        if ((status = hf_get_bool(root, "mlp_bias", &mlp_bias)))
            goto out;
        if (mlp_bias) {
            status = BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                              "config.json: mlp_bias is not supported");
            goto out;
        }
    }
    if (cfg.n_heads <= 0) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json: num_attention_heads = %d is not > 0",
                          cfg.n_heads);
        goto out;
    }
    if (cfg.n_kv_heads == -1)
        cfg.n_kv_heads = cfg.n_heads;
    if (cfg.head_dim == -1) {
        if (cfg.dim % cfg.n_heads != 0) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                              "config.json: num_attention_heads %d does not "
                              "divide hidden_size %d", cfg.n_heads, cfg.dim);
            goto out;
        }
        cfg.head_dim = cfg.dim / cfg.n_heads;
    }
    if (is_qwen2)
        cfg.qkv_bias = true;

    /* transformers >= 5 nests rope_theta and the scaling parameters in
     * rope_parameters; older files have rope_theta + rope_scaling. */
    rope = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rope != NULL && !cJSON_IsNull(rope) && !cJSON_IsObject(rope)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json: rope_scaling must be an object");
        goto out;
    }
    if (cJSON_IsObject(rope) && (status = hf_parse_rope(rope, &cfg)))
        goto out;
    rope = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rope != NULL && !cJSON_IsNull(rope) && !cJSON_IsObject(rope)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json: rope_parameters must be an object");
        goto out;
    }
    if (cJSON_IsObject(rope) && (status = hf_parse_rope(rope, &cfg)))
        goto out;

    if ((status = hf_get_token_ids(root, "bos_token_id", bos, 1, &n_bos,
                                   &found)))
        goto out;
    if (found)
        cfg.bos_id = n_bos > 0 ? bos[0] : -1;
    if ((status = hf_get_token_ids(root, "eos_token_id", cfg.eos_ids,
                                   MODEL_MAX_EOS, &cfg.n_eos, &found)))
        goto out;

    if (gen_json != NULL) {
        gen = cJSON_ParseWithLength(gen_json, gen_len);
        if (gen == NULL || !cJSON_IsObject(gen)) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                              "generation_config.json is not a JSON object");
            goto out;
        }
        if ((status = hf_get_token_ids(gen, "bos_token_id", bos, 1, &n_bos,
                                       &found)))
            goto out;
        if (found)
            cfg.bos_id = n_bos > 0 ? bos[0] : -1;
        {
            int ids[MODEL_MAX_EOS] = { 0 };
            int n_ids = 0;
            if ((status = hf_get_token_ids(gen, "eos_token_id", ids,
                                           MODEL_MAX_EOS, &n_ids, &found)))
                goto out;
            if (found) {
                memcpy(cfg.eos_ids, ids, sizeof(ids));
                cfg.n_eos = n_ids;
            }
        }
    }
    status = model_config_validate(&cfg);
    if (status != BT_OK)
        goto out;
    if (arch != NULL && arch_len > 0)
        snprintf(arch, arch_len, "%s", a0->valuestring);
    *cfg_p = cfg;

out:
    cJSON_Delete(gen);
    cJSON_Delete(root);
    return status;
}

// ----------------------------------------------------------------------------
// weights

typedef struct {
    model_t *model;            /* being filled */
    const char *dir;           /* directory, for messages */
    model_st_file_t *shards;   /* (n_shards) parsed shard headers */
    char **shard_names;        /* (n_shards) file names */
    int n_shards;              /* entries in shards */
    cJSON *weight_map;         /* index.json weight_map, NULL if unsharded */
} hf_loader_t;

static const model_st_tensor_t *hf_lookup(const hf_loader_t *ld,
                                          const char *name)
{
    const cJSON *file;

    if (ld->weight_map == NULL)
        return model_st_find(&ld->shards[0], name);
    file = cJSON_GetObjectItemCaseSensitive(ld->weight_map, name);
    if (!cJSON_IsString(file))
        return NULL;
    for (int i = 0; i < ld->n_shards; i++) {
        if (strcmp(ld->shard_names[i], file->valuestring) == 0)
            return model_st_find(&ld->shards[i], name);
    }
    return NULL;
}

/* Resolves tensor `name` of shape (rows, cols), or (cols) when rows == 0. */
static bt_status_t hf_tensor(const hf_loader_t *ld, const char *name,
                             int64_t rows, int64_t cols, model_tensor_t *t)
{
    const model_st_tensor_t *st = hf_lookup(ld, name);
    bool ok;

    if (st == NULL)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: missing tensor %s",
                        ld->dir, name);
    if (!st->dtype_ok)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "%s: tensor %s has dtype %s (F32, F16, BF16 are "
                        "supported)", ld->dir, name, st->dtype_name);
    if (rows == 0)
        ok = st->ndim == 1 && st->shape[0] == cols;
    else
        ok = st->ndim == 2 && st->shape[0] == rows && st->shape[1] == cols;
    if (!ok) {
        char got[128];
        int off = 0;
        got[0] = '\0';
        for (int i = 0; i < st->ndim && off < (int)sizeof(got) - 24; i++)
            off += snprintf(got + off, sizeof(got) - (size_t)off, "%s%lld",
                            i ? ", " : "", (long long)st->shape[i]);
        if (rows == 0)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: tensor %s has shape [%s], expected [%lld]",
                            ld->dir, name, got, (long long)cols);
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s has shape [%s], expected [%lld, %lld]",
                        ld->dir, name, got, (long long)rows, (long long)cols);
    }
    t->data = st->data;
    if ((uintptr_t)st->data % model_dtype_size(st->dtype) != 0) {
        bt_status_t status;
        BT_LOG_WARN("MODEL", "%s: tensor %s is unaligned in its file; "
                    "copying it", ld->dir, name);
        status = model__copy_aligned(ld->model, st->data,
                                     (size_t)(st->end - st->begin), &t->data);
        if (status != BT_OK)
            return status;
    }
    t->dtype = st->dtype;
    t->rows = rows == 0 ? 1 : rows;
    t->cols = cols;
    return BT_OK;
}

/* A small F32/BF16/F16 tensor (a scale) as floats into out (n values):
 * its element count must be 1 or n; 1 is broadcast. */
static bt_status_t hf_scale(const hf_loader_t *ld, const char *name,
                            int64_t n, float *out, int64_t *numel_p)
{
    const model_st_tensor_t *st = hf_lookup(ld, name);
    int64_t numel = 1;
    model_tensor_t t;

    if (st == NULL)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: missing tensor %s",
                        ld->dir, name);
    if (!st->dtype_ok)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "%s: scale %s has dtype "
                        "%s (F32, F16, BF16 are supported)", ld->dir, name,
                        st->dtype_name);
    for (int i = 0; i < st->ndim; i++)
        numel *= st->shape[i];
    if (numel != 1 && numel != n)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: scale %s has %lld "
                        "elements, expected 1 or %lld", ld->dir, name,
                        (long long)numel, (long long)n);
    t = (model_tensor_t){ st->data, st->dtype, 1, numel };
    if ((uintptr_t)st->data % model_dtype_size(st->dtype) != 0) {
        bt_status_t status = model__copy_aligned(
            ld->model, st->data, (size_t)(st->end - st->begin), &t.data);
        if (status != BT_OK)
            return status;
    }
    model_tensor_to_f32(&t, 0, numel, out);
    for (int64_t i = 0; i < numel; i++)
        if (!(out[i] > 0.0f) || !isfinite(out[i]))
            return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: scale %s[%lld] = %g "
                            "is not a positive number", ld->dir, name,
                            (long long)i, (double)out[i]);
    for (int64_t i = numel; i < n; i++)
        out[i] = out[0];
    if (numel_p != NULL)
        *numel_p = numel;
    return BT_OK;
}

/* Linear weight `base`.weight of shape (rows, cols).  F8_E4M3 (an FP8
 * checkpoint): the codes and scales go into *f8 (base.weight_scale, 1 or
 * rows values; base.input_scale when the activations are static) and *t
 * becomes a model-owned F32 dequantized copy; other dtypes as hf_tensor. */
static bt_status_t hf_linear(const hf_loader_t *ld, const char *base,
                             int64_t rows, int64_t cols, model_tensor_t *t,
                             model_fp8_t *f8)
{
    const model_quant_t *q = &ld->model->quant;
    const model_st_tensor_t *st;
    char name[192];
    float *scale, *deq, in_scale = 0.0f;
    int64_t n_scale = 0;
    bt_status_t status;

    snprintf(name, sizeof(name), "%s.weight", base);
    st = hf_lookup(ld, name);
    if (st == NULL || strcmp(st->dtype_name, "F8_E4M3") != 0)
        return hf_tensor(ld, name, rows, cols, t);
    if (!q->fp8)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: tensor %s is F8_E4M3 "
                        "but config.json declares no FP8 quantization_config",
                        ld->dir, name);
    if (st->ndim != 2 || st->shape[0] != rows || st->shape[1] != cols)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: tensor %s is not [%lld, "
                        "%lld]", ld->dir, name, (long long)rows,
                        (long long)cols);
    status = model__alloc_owned(ld->model, (size_t)rows * sizeof(float),
                                (void **)&scale);
    if (status != BT_OK)
        return status;
    snprintf(name, sizeof(name), "%s.weight_scale", base);
    status = hf_scale(ld, name, rows, scale, &n_scale);
    if (status != BT_OK)
        return status;
    snprintf(name, sizeof(name), "%s.input_scale", base);
    if (hf_lookup(ld, name) != NULL) {
        status = hf_scale(ld, name, 1, &in_scale, NULL);
        if (status != BT_OK)
            return status;
    } else if (q->static_act) {
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: missing tensor %s (the "
                        "config declares static activation scales)", ld->dir,
                        name);
    }
    status = model__alloc_owned(ld->model,
                                (size_t)(rows * cols) * sizeof(float),
                                (void **)&deq);
    if (status != BT_OK)
        return status;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = (const uint8_t *)st->data + r * cols;

        for (int64_t j = 0; j < cols; j++)
            deq[r * cols + j] = bt_e4m3_to_f32(c[j]) * scale[r];
    }
    *t = (model_tensor_t){ deq, MODEL_DTYPE_F32, rows, cols };
    *f8 = (model_fp8_t){ st->data, scale, n_scale, in_scale };
    return BT_OK;
}

/* k_scale / v_scale of layer l's attention (n_kv_heads values, from a
 * per-tensor or per-head tensor), under the names compressed-tensors
 * (self_attn.k_scale), ModelOpt (self_attn.k_proj.k_scale) and older vLLM
 * exports (self_attn.k_proj.output_scale) use.  Absent: NULL. */
static bt_status_t hf_kv_scale(const hf_loader_t *ld, int l, char kv,
                               const float **out_p)
{
    const char *const fmts[] = {
        "model.layers.%d.self_attn.%c_scale",
        "model.layers.%d.self_attn.%c_proj.%c_scale",
        "model.layers.%d.self_attn.%c_proj.output_scale",
    };
    int n = ld->model->cfg.n_kv_heads;
    char name[160];
    float *s;
    bt_status_t status;

    for (size_t i = 0; i < BT_ARRAY_SIZE(fmts); i++) {
        snprintf(name, sizeof(name), fmts[i], l, kv, kv);
        if (hf_lookup(ld, name) == NULL)
            continue;
        status = model__alloc_owned(ld->model, (size_t)n * sizeof(float),
                                    (void **)&s);
        if (status != BT_OK)
            return status;
        status = hf_scale(ld, name, n, s, NULL);
        if (status != BT_OK)
            return status;
        *out_p = s;
        return BT_OK;
    }
    *out_p = NULL;
    return BT_OK;
}

static bt_status_t hf_resolve_all(hf_loader_t *ld)
{
    model_t *m = ld->model;
    const model_config_t *c = &m->cfg;
    int64_t dim = c->dim, hid = c->hidden_dim;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    int64_t kvd = (int64_t)c->n_kv_heads * c->head_dim;
    char name[160];
    bt_status_t status;

#define HF_T(_t, _rows, _cols, ...)                                         \
    do {                                                                    \
        snprintf(name, sizeof(name), __VA_ARGS__);                          \
        status = hf_tensor(ld, name, _rows, _cols, _t);                     \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)

    /* q/k/v/o and the feed-forward projections: FP8 or plain */
#define HF_L(_which, _t, _rows, _cols, _module, _proj)                      \
    do {                                                                    \
        snprintf(name, sizeof(name), "model.layers.%d.%s.%s", l, _module,   \
                 _proj);                                                    \
        status = hf_linear(ld, name, _rows, _cols, _t, &ly->fp8[_which]);   \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)

    /* Llama's attention_bias also adds an o_proj bias, which baton's
     * layer struct does not carry: refuse rather than ignore it. */
    if (hf_lookup(ld, "model.layers.0.self_attn.o_proj.bias") != NULL)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "%s: tensor model.layers.0.self_attn.o_proj.bias: "
                        "o_proj biases are not supported", ld->dir);
    HF_T(&m->tok_embedding, c->vocab_size, dim, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        model_layer_t *ly = &m->layers[l];
        const char *p = "model.layers";
        HF_T(&ly->attn_norm, 0, dim, "%s.%d.input_layernorm.weight", p, l);
        HF_L(MODEL_LIN_Q, &ly->wq, qd, dim, "self_attn", "q_proj");
        HF_L(MODEL_LIN_K, &ly->wk, kvd, dim, "self_attn", "k_proj");
        HF_L(MODEL_LIN_V, &ly->wv, kvd, dim, "self_attn", "v_proj");
        if (c->qkv_bias) {
            HF_T(&ly->bq, 0, qd, "%s.%d.self_attn.q_proj.bias", p, l);
            HF_T(&ly->bk, 0, kvd, "%s.%d.self_attn.k_proj.bias", p, l);
            HF_T(&ly->bv, 0, kvd, "%s.%d.self_attn.v_proj.bias", p, l);
        }
        HF_L(MODEL_LIN_O, &ly->wo, dim, qd, "self_attn", "o_proj");
        HF_T(&ly->ffn_norm, 0, dim, "%s.%d.post_attention_layernorm.weight",
             p, l);
        HF_L(MODEL_LIN_GATE, &ly->w_gate, hid, dim, "mlp", "gate_proj");
        HF_L(MODEL_LIN_UP, &ly->w_up, hid, dim, "mlp", "up_proj");
        HF_L(MODEL_LIN_DOWN, &ly->w_down, dim, hid, "mlp", "down_proj");
        if (m->quant.fp8 || m->quant.kv_scales) { /* kv_scales alone:
                                                     a dense model */
            if ((status = hf_kv_scale(ld, l, 'k', &ly->k_scale)) ||
                (status = hf_kv_scale(ld, l, 'v', &ly->v_scale)))
                return status;
            if ((ly->k_scale == NULL) != (ly->v_scale == NULL))
                return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: layer %d has "
                                "only one of k_scale and v_scale", ld->dir,
                                l);
            if (m->quant.kv_scales && ly->k_scale == NULL)
                return BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: layer %d: "
                                "missing self_attn.k_scale (the config "
                                "declares a kv_cache_scheme)", ld->dir, l);
            m->quant.kv_scales |= ly->k_scale != NULL;
        }
    }
    HF_T(&m->final_norm, 0, dim, "model.norm.weight");
    if (c->tied_embeddings)
        m->classifier = m->tok_embedding;
    else
        HF_T(&m->classifier, c->vocab_size, dim, "lm_head.weight");
#undef HF_T
#undef HF_L
    return BT_OK;
}

/* Adds a shard by file name (relative to dir), unless already present. */
static bt_status_t hf_add_shard(hf_loader_t *ld, const char *dir,
                                const char *file)
{
    char path[PATH_MAX];
    const void *data;
    size_t size;
    model_st_file_t *shards;
    char **names;
    bt_status_t status;

    for (int i = 0; i < ld->n_shards; i++) {
        if (strcmp(ld->shard_names[i], file) == 0)
            return BT_OK;
    }
    if (strchr(file, '/') != NULL || strcmp(file, "..") == 0 ||
        file[0] == '\0')
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: shard name \"%.100s\" must be a plain file name",
                        dir, file);
    if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "path too long: %s",
                        dir);
    if (access(path, F_OK) != 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "%s: missing shard %s", dir,
                        file);
    status = model__map_file(ld->model, path, &data, &size);
    if (status != BT_OK)
        return status;
    shards = bt_realloc(ld->shards, sizeof(*shards) * (size_t)(ld->n_shards + 1),
                        "hf_shards");
    if (shards == NULL)
        return BT_ERR_NO_MEMORY;
    ld->shards = shards;
    names = bt_realloc(ld->shard_names,
                       sizeof(*names) * (size_t)(ld->n_shards + 1),
                       "hf_shard_names");
    if (names == NULL)
        return BT_ERR_NO_MEMORY;
    ld->shard_names = names;
    names[ld->n_shards] = bt_strdup(file, "hf_shard_name");
    if (names[ld->n_shards] == NULL)
        return BT_ERR_NO_MEMORY;
    status = model_st_parse(data, size, path, &shards[ld->n_shards]);
    if (status != BT_OK) {
        bt_free(names[ld->n_shards]);
        return status;
    }
    ld->n_shards++;
    return BT_OK;
}

/* Parses model.safetensors.index.json and maps every shard it names. */
static bt_status_t hf_load_index(hf_loader_t *ld, const char *dir,
                                 const char *index_path, cJSON **root_p)
{
    const cJSON *file;
    cJSON *root;
    char *text;
    size_t len;
    bt_status_t status;

    status = bt_read_file(index_path, HF_MAX_JSON, &text, &len);
    if (status != BT_OK)
        return status;
    root = cJSON_ParseWithLength(text, len);
    bt_free(text);
    *root_p = root;
    if (root == NULL || !cJSON_IsObject(root))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s is not a JSON object", index_path);
    ld->weight_map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(ld->weight_map))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: missing object weight_map", index_path);
    cJSON_ArrayForEach(file, ld->weight_map) {
        if (!cJSON_IsString(file))
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: weight_map entry %s is not a file name",
                            index_path, file->string);
        status = hf_add_shard(ld, dir, file->valuestring);
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

bt_status_t model__load_hf(const char *path, model_t **model_p)
{
    char dir[PATH_MAX], file[PATH_MAX + 64];
    char *cfg_text = NULL, *gen_text = NULL;
    size_t cfg_len = 0, gen_len = 0;
    struct stat st;
    model_config_t cfg;
    hf_loader_t ld;
    cJSON *index = NULL;
    char arch[64];
    bt_status_t status;

    memset(&ld, 0, sizeof(ld));
    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "path too long");
    if (stat(dir, &st) != 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "%s does not exist", path);
    if (!S_ISDIR(st.st_mode)) { /* config.json or a .safetensors file */
        char *slash = strrchr(dir, '/');
        if (slash == NULL)
            snprintf(dir, sizeof(dir), ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
    }

    snprintf(file, sizeof(file), "%s/config.json", dir);
    status = bt_read_file(file, HF_MAX_JSON, &cfg_text, &cfg_len);
    if (status != BT_OK)
        return status;
    snprintf(file, sizeof(file), "%s/generation_config.json", dir);
    if (access(file, F_OK) == 0) {
        status = bt_read_file(file, HF_MAX_JSON, &gen_text, &gen_len);
        if (status != BT_OK)
            goto err_free_text;
    }
    status = model_hf_config_parse(cfg_text, cfg_len, gen_text, gen_len,
                                   &cfg, arch, sizeof(arch));
    if (status != BT_OK)
        goto err_free_text;

    status = model__create(cfg.n_layers, &ld.model);
    if (status != BT_OK)
        goto err_free_text;
    {
        char *hfq = NULL;
        size_t hfq_len = 0;

        snprintf(file, sizeof(file), "%s/hf_quant_config.json", dir);
        if (access(file, F_OK) == 0)
            status = bt_read_file(file, HF_MAX_JSON, &hfq, &hfq_len);
        if (status == BT_OK)
            status = model_hf_quant_parse(cfg_text, cfg_len, hfq, hfq_len,
                                          &ld.model->quant);
        bt_free(hfq);
        if (status != BT_OK) {
            model_destroy(&ld.model);
            goto err_free_text;
        }
    }
    ld.model->cfg = cfg;
    ld.model->format = MODEL_FORMAT_HF;
    snprintf(ld.model->arch, sizeof(ld.model->arch), "%s", arch);
    ld.dir = dir;

    snprintf(file, sizeof(file), "%s/model.safetensors.index.json", dir);
    if (access(file, F_OK) == 0) {
        status = hf_load_index(&ld, dir, file, &index);
    } else {
        snprintf(file, sizeof(file), "%s/model.safetensors", dir);
        if (access(file, F_OK) != 0)
            status = BT_ERROR(BT_ERR_IO, "MODEL",
                              "%s: no model.safetensors or "
                              "model.safetensors.index.json", dir);
        else
            status = hf_add_shard(&ld, dir, "model.safetensors");
    }
    if (status == BT_OK && ld.n_shards == 0)
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL", "%s: no weight shards",
                          dir);
    if (status == BT_OK)
        status = hf_resolve_all(&ld);
    if (status == BT_OK)
        *model_p = ld.model;
    else
        model_destroy(&ld.model);

    for (int i = 0; i < ld.n_shards; i++) {
        model_st_cleanup(&ld.shards[i]);
        bt_free(ld.shard_names[i]);
    }
    bt_free(ld.shards);
    bt_free(ld.shard_names);
    cJSON_Delete(index);
err_free_text:
    bt_free(gen_text);
    bt_free(cfg_text);
    return status;
}
