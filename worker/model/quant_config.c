/*
 * quant_config.c - which quantized Hugging Face checkpoints baton loads:
 * compressed-tensors (llm-compressor) "float-quantized" FP8, a dense
 * compressed-tensors model with only FP8 KV-cache scales, and NVIDIA
 * ModelOpt FP8 (see model_hf_quant_parse in model.h).
 *
 * Everything else is refused here, by name, before a tensor is read: a
 * checkpoint whose numbers mean something else (AWQ, GPTQ, int8, FP4,
 * block or group scales) must never run as if it were plain weights.
 */
#include "model_int.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bt_error.h"

#define QUANT_SUPPORTED "supported: compressed-tensors float-quantized FP8 " \
                        "(or a dense model with an FP8 kv_cache_scheme), " \
                        "modelopt FP8"

/* A string field of obj, or NULL when absent or not a string. */
static const char *quant_str(const cJSON *obj, const char *field)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);

    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* One compressed-tensors QuantizationArgs object (weights,
 * input_activations or kv_cache_scheme): 8-bit float, symmetric, with a
 * strategy from `strategies` (a '|'-separated list).  *dynamic_p gets its
 * dynamic flag. */
static bt_status_t quant_args(const cJSON *args, const char *what,
                              const char *strategies, bool *dynamic_p,
                              char *strategy, size_t strategy_len)
{
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(args, "num_bits");
    const cJSON *sym = cJSON_GetObjectItemCaseSensitive(args, "symmetric");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(args, "dynamic");
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(args, "group_size");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(args,
                                                       "block_structure");
    const char *type = quant_str(args, "type");
    const char *strat = quant_str(args, "strategy");
    char list[64];
    bool found = false;

    if (!cJSON_IsObject(args))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "quantization_config: %s "
                        "must be an object", what);
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 8.0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "%s num_bits %g is not supported (%s)", what,
                        cJSON_IsNumber(bits) ? bits->valuedouble : -1.0,
                        QUANT_SUPPORTED);
    if (type == NULL || strcmp(type, "float") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "%s type '%s' is not supported (%s)", what,
                        type ? type : "(none)", QUANT_SUPPORTED);
    if (sym != NULL && !cJSON_IsTrue(sym))
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "%s: asymmetric quantization is not supported", what);
    if ((gs != NULL && !cJSON_IsNull(gs)) ||
        (bs != NULL && !cJSON_IsNull(bs)))
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "%s: group / block scales are not supported (%s)",
                        what, QUANT_SUPPORTED);
    snprintf(list, sizeof(list), "%s", strategies);
    for (char *tok = strtok(list, "|"); tok != NULL && strat != NULL;
         tok = strtok(NULL, "|"))
        found |= strcmp(tok, strat) == 0;
    if (!found)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "%s strategy '%s' is not supported (%s are)", what,
                        strat ? strat : "(none)", strategies);
    *dynamic_p = cJSON_IsTrue(dyn);
    snprintf(strategy, strategy_len, "%s", strat);
    return BT_OK;
}

/* compressed-tensors' kv_cache_scheme: static FP8 scales per layer
 * ("tensor") or per KV head ("attn_head"); null or absent: none. */
static bt_status_t quant_kv_scheme(const cJSON *kv, model_quant_t *q)
{
    char ks[16];
    bool kdyn;
    bt_status_t status;

    if (kv == NULL || cJSON_IsNull(kv))
        return BT_OK;
    status = quant_args(kv, "kv_cache_scheme", "tensor|attn_head", &kdyn, ks,
                        sizeof(ks));
    if (status != BT_OK)
        return status;
    if (kdyn)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                        " dynamic kv_cache_scheme is not supported");
    q->kv_scales = true;
    return BT_OK;
}

/* compressed-tensors: every config group must be the same FP8 scheme; no
 * group at all is a checkpoint whose weights stay as they are and whose
 * kv_cache_scheme alone is quantized (llm-compressor's KV-cache-only
 * recipe, `baton model quantize --fp8 --kv-only`), format "dense". */
static bt_status_t quant_compressed_tensors(const cJSON *qc,
                                            model_quant_t *q)
{
    const char *format = quant_str(qc, "format");
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc,
                                                           "config_groups");
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(qc, "kv_cache_scheme");
    const cJSON *g;
    int n = 0;
    bt_status_t status;

    if ((groups == NULL || cJSON_IsNull(groups) ||
         (cJSON_IsObject(groups) && groups->child == NULL)) &&
        kv != NULL && !cJSON_IsNull(kv)) {
        if (format != NULL && strcmp(format, "dense") != 0 &&
            strcmp(format, "float-quantized") != 0)
            return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                            " compressed-tensors format '%s' is not "
                            "supported (%s)", format, QUANT_SUPPORTED);
        status = quant_kv_scheme(kv, q);
        if (status == BT_OK)
            snprintf(q->scheme, sizeof(q->scheme), "compressed-tensors");
        return status;
    }
    if (!cJSON_IsObject(groups))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "quantization_config: "
                        "missing object config_groups");
    if (format == NULL || strcmp(format, "float-quantized") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "compressed-tensors format '%s' is not supported (%s)",
                        format ? format : "(none)", QUANT_SUPPORTED);
    cJSON_ArrayForEach(g, groups) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(g,
                                                          "input_activations");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(g,
                                                          "output_activations");
        const char *gf = quant_str(g, "format");
        char ws[16], as[16];
        bool wdyn, adyn = true, per_channel, static_act;

        if (gf != NULL && strcmp(gf, "float-quantized") != 0)
            return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                            " group %s format '%s' is not supported (%s)",
                            g->string, gf, QUANT_SUPPORTED);
        status = quant_args(w, "weights", "channel|tensor", &wdyn, ws,
                            sizeof(ws));
        if (status != BT_OK)
            return status;
        if (wdyn)
            return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                            " dynamic weight scales are not supported");
        if (a != NULL && !cJSON_IsNull(a)) {
            status = quant_args(a, "input_activations", "tensor|token",
                                &adyn, as, sizeof(as));
            if (status != BT_OK)
                return status;
            if (adyn != (strcmp(as, "token") == 0))
                return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                                "quantization_config: input_activations "
                                "strategy '%s' with dynamic %s is not "
                                "supported (static tensor or dynamic token)",
                                as, adyn ? "true" : "false");
        }
        if (o != NULL && !cJSON_IsNull(o))
            return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                            " output_activations are not supported");
        per_channel = strcmp(ws, "channel") == 0;
        static_act = !adyn;
        if (n > 0 && (per_channel != q->per_channel ||
                      static_act != q->static_act))
            return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                            " config groups with different schemes are not "
                            "supported");
        q->per_channel = per_channel;
        q->static_act = static_act;
        n++;
    }
    if (n == 0)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "quantization_config: "
                        "config_groups is empty");
    status = quant_kv_scheme(kv, q);
    if (status != BT_OK)
        return status;
    q->fp8 = true;
    snprintf(q->scheme, sizeof(q->scheme), "compressed-tensors");
    return BT_OK;
}

/* ModelOpt: quant_algo FP8 (per-tensor weight and static input scales),
 * kv_cache_quant_algo FP8 or none. */
static bt_status_t quant_modelopt(const cJSON *obj, model_quant_t *q)
{
    const char *algo = quant_str(obj, "quant_algo");
    const char *kv = quant_str(obj, "kv_cache_quant_algo");

    if (algo == NULL || strcmp(algo, "FP8") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "modelopt quant_algo '%s' is not supported (%s)",
                        algo ? algo : "(none)", QUANT_SUPPORTED);
    if (kv != NULL && strcmp(kv, "FP8") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config: "
                        "modelopt kv_cache_quant_algo '%s' is not supported "
                        "(FP8 is)", kv);
    q->fp8 = true;
    q->per_channel = false;
    q->static_act = true;
    q->kv_scales = kv != NULL;
    snprintf(q->scheme, sizeof(q->scheme), "modelopt");
    return BT_OK;
}

bt_status_t model_hf_quant_parse(const char *json, size_t len,
                                 const char *hfq, size_t hfq_len,
                                 model_quant_t *q_p)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    cJSON *hroot = NULL;
    const cJSON *qc;
    const char *method;
    model_quant_t q;
    bt_status_t status = BT_OK;

    memset(&q, 0, sizeof(q));
    if (root == NULL || !cJSON_IsObject(root)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "config.json is not a JSON object");
        goto out;
    }
    qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (hfq != NULL && (qc == NULL || cJSON_IsNull(qc))) {
        const cJSON *mq;

        hroot = cJSON_ParseWithLength(hfq, hfq_len);
        mq = cJSON_GetObjectItemCaseSensitive(hroot, "quantization");
        if (!cJSON_IsObject(mq)) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL", "hf_quant_config.json:"
                              " missing object quantization");
            goto out;
        }
        status = quant_modelopt(mq, &q);
        goto out;
    }
    if (qc == NULL || cJSON_IsNull(qc))
        goto out;
    if (!cJSON_IsObject(qc)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL", "config.json: "
                          "quantization_config must be an object");
        goto out;
    }
    method = quant_str(qc, "quant_method");
    if (method != NULL && strcmp(method, "compressed-tensors") == 0)
        status = quant_compressed_tensors(qc, &q);
    else if (method != NULL && strcmp(method, "modelopt") == 0)
        status = quant_modelopt(qc, &q);
    else
        status = BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "quantization_config:"
                          " quant_method '%.60s' is not supported (%s)",
                          method ? method : "(none)", QUANT_SUPPORTED);

out:
    if (status == BT_OK)
        *q_p = q;
    cJSON_Delete(hroot);
    cJSON_Delete(root);
    return status;
}
