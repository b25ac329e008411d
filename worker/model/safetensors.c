/*
 * safetensors.c - validating safetensors header parser (see safetensors.h).
 */
#include "safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

/* Element size of a safetensors dtype name, 0 when unknown. */
static size_t st_dtype_size(const char *name)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        { "F64", 8 }, { "F32", 4 }, { "F16", 2 },  { "BF16", 2 },
        { "I64", 8 }, { "I32", 4 }, { "I16", 2 },  { "I8", 1 },
        { "U64", 8 }, { "U32", 4 }, { "U16", 2 },  { "U8", 1 },
        { "BOOL", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
    };
    for (size_t i = 0; i < BT_ARRAY_SIZE(sizes); i++) {
        if (strcmp(name, sizes[i].name) == 0)
            return sizes[i].size;
    }
    return 0;
}

/* Reads a JSON number that must be a non-negative integer below 2^53. */
static bool st_get_u64(const cJSON *item, uint64_t *v_p)
{
    double d;

    if (!cJSON_IsNumber(item))
        return false;
    d = item->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || floor(d) != d)
        return false;
    *v_p = (uint64_t)d;
    return true;
}

static int st_cmp_name(const void *a, const void *b)
{
    const model_st_tensor_t *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static int st_cmp_begin(const void *a, const void *b)
{
    const model_st_tensor_t *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin)
        return (*x)->begin < (*y)->begin ? -1 : 1;
    return 0;
}

static bt_status_t st_parse_entry(const cJSON *item, const char *what,
                                  const model_st_file_t *st,
                                  model_st_tensor_t *t)
{
    const char *name = item->string;
    const cJSON *dtype, *shape, *offs, *dim;
    uint64_t numel = 1, bytes, v;
    size_t esize;

    if (!cJSON_IsObject(item))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: entry is not a JSON object", what,
                        name);
    dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || strlen(dtype->valuestring) == 0 ||
        strlen(dtype->valuestring) >= sizeof(t->dtype_name))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: missing or bad \"dtype\"", what, name);
    if (!cJSON_IsArray(shape) ||
        cJSON_GetArraySize(shape) > MODEL_ST_MAX_DIMS)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: missing or bad \"shape\"", what, name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: \"data_offsets\" must be [begin, end]",
                        what, name);

    snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", dtype->valuestring);
    t->dtype_ok = true;
    if (strcmp(t->dtype_name, "F32") == 0)
        t->dtype = MODEL_DTYPE_F32;
    else if (strcmp(t->dtype_name, "F16") == 0)
        t->dtype = MODEL_DTYPE_F16;
    else if (strcmp(t->dtype_name, "BF16") == 0)
        t->dtype = MODEL_DTYPE_BF16;
    else
        t->dtype_ok = false;

    t->ndim = 0;
    cJSON_ArrayForEach(dim, shape) {
        if (!st_get_u64(dim, &v) || v > (uint64_t)INT64_MAX)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: tensor %s: shape has a bad dimension", what,
                            name);
        t->shape[t->ndim++] = (int64_t)v;
        if (v != 0 && numel > UINT64_MAX / v)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: tensor %s: shape overflows", what, name);
        numel *= v;
    }
    if (!st_get_u64(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !st_get_u64(cJSON_GetArrayItem(offs, 1), &t->end))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: data_offsets are not non-negative "
                        "integers", what, name);
    if (t->begin > t->end || t->end > st->data_len)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: tensor %s: data_offsets [%llu, %llu] outside the "
                        "data area (%zu bytes)", what, name,
                        (unsigned long long)t->begin,
                        (unsigned long long)t->end, st->data_len);
    esize = st_dtype_size(t->dtype_name);
    if (esize != 0) {
        if (numel > UINT64_MAX / esize)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: tensor %s: shape overflows", what, name);
        bytes = numel * esize;
        if (bytes != t->end - t->begin)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s: tensor %s: %s shape needs %llu bytes, "
                            "data_offsets give %llu", what, name,
                            t->dtype_name, (unsigned long long)bytes,
                            (unsigned long long)(t->end - t->begin));
    }
    t->data = st->data + t->begin;
    t->name = bt_strdup(name, "st_name");
    if (t->name == NULL)
        return BT_ERR_NO_MEMORY;
    return BT_OK;
}

bt_status_t model_st_parse(const void *buf, size_t size, const char *what,
                           model_st_file_t *st)
{
    const uint8_t *p = buf;
    model_st_file_t out;
    model_st_tensor_t **by_begin = NULL;
    cJSON *root = NULL;
    const cJSON *item;
    uint64_t hlen = 0;
    int n = 0;
    bt_status_t status;

    memset(&out, 0, sizeof(out));
    if (size < 8)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: file has %zu bytes, too short for a "
                        "safetensors header", what, size);
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > MODEL_ST_MAX_HEADER || hlen > size - 8)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "%s: header length %llu is beyond the file (%zu "
                        "bytes) or above the %u-byte limit", what,
                        (unsigned long long)hlen, size, MODEL_ST_MAX_HEADER);
    out.header_len = (size_t)hlen;
    out.data = p + 8 + hlen;
    out.data_len = size - 8 - (size_t)hlen;

    root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (root == NULL || !cJSON_IsObject(root)) {
        status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                          "%s: safetensors header is not a JSON object",
                          what);
        goto err_free;
    }
    cJSON_ArrayForEach(item, root) {
        if (item->string == NULL) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                              "%s: header entry without a name", what);
            goto err_free;
        }
        if (strcmp(item->string, "__metadata__") != 0)
            n++;
    }
    if (n > 0) {
        out.tensors = bt_calloc((size_t)n, sizeof(*out.tensors), "st_tensors");
        by_begin = bt_malloc((size_t)n * sizeof(*by_begin), "st_sort");
        if (out.tensors == NULL || by_begin == NULL) {
            status = BT_ERR_NO_MEMORY;
            goto err_free;
        }
    }
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        status = st_parse_entry(item, what, &out, &out.tensors[out.n_tensors]);
        if (status != BT_OK)
            goto err_free;
        by_begin[out.n_tensors] = &out.tensors[out.n_tensors];
        out.n_tensors++;
    }

    /* Ranges may not overlap (empty tensors take no bytes). */
    if (n > 1)
        qsort(by_begin, (size_t)n, sizeof(*by_begin), st_cmp_begin);
    for (int i = 1; i < n; i++) {
        const model_st_tensor_t *a = by_begin[i - 1], *b = by_begin[i];
        if (a->end > b->begin && a->end > a->begin && b->end > b->begin) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                              "%s: tensors %s and %s overlap in the data "
                              "area", what, a->name, b->name);
            goto err_free;
        }
    }
    if (n > 1)
        qsort(out.tensors, (size_t)n, sizeof(*out.tensors), st_cmp_name);
    for (int i = 1; i < n; i++) {
        if (strcmp(out.tensors[i - 1].name, out.tensors[i].name) == 0) {
            status = BT_ERROR(BT_ERR_FORMAT, "MODEL",
                              "%s: tensor %s appears twice", what,
                              out.tensors[i].name);
            goto err_free;
        }
    }
    bt_free(by_begin);
    cJSON_Delete(root);
    *st = out;
    return BT_OK;

err_free:
    bt_free(by_begin);
    cJSON_Delete(root);
    model_st_cleanup(&out);
    return status;
}

void model_st_cleanup(model_st_file_t *st)
{
    for (int i = 0; i < st->n_tensors; i++)
        bt_free(st->tensors[i].name);
    bt_free(st->tensors);
    memset(st, 0, sizeof(*st));
}

const model_st_tensor_t *model_st_find(const model_st_file_t *st,
                                       const char *name)
{
    int lo = 0, hi = st->n_tensors - 1;

    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0)
            return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
