/*
 * model_write.c - Hugging Face and llama2.c writers (see model_write.h).
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
#include "bt_util.h"
#include "model_int.h"

#define WRITE_BUF_ELEMS (1 << 20) /* conversion buffer, elements */

// ----------------------------------------------------------------------------
// tensor streaming with dtype conversion and q/k row permutation

typedef enum {
    WRITE_PERM_NONE = 0,
    WRITE_PERM_ADJ_TO_HALF, /* llama2.c rows -> HF rows */
    WRITE_PERM_HALF_TO_ADJ  /* HF rows -> llama2.c rows */
} write_perm_t;

typedef struct {
    FILE *fp;              /* destination */
    const char *path;      /* for messages */
    uint8_t *buf;          /* (WRITE_BUF_ELEMS * 4) staging bytes */
    size_t used;           /* bytes staged in buf */
    float *row;            /* (row_cap) one source row as f32 */
    int64_t row_cap;       /* elements row can hold */
} write_out_t;

static bt_status_t write_flush(write_out_t *w)
{
    if (w->used > 0 && fwrite(w->buf, 1, w->used, w->fp) != w->used)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", w->path,
                        strerror(errno));
    w->used = 0;
    return BT_OK;
}

static bt_status_t write_init(write_out_t *w, FILE *fp, const char *path)
{
    memset(w, 0, sizeof(*w));
    w->fp = fp;
    w->path = path;
    w->buf = bt_malloc((size_t)WRITE_BUF_ELEMS * 4, "write_buf");
    if (w->buf == NULL)
        return BT_ERR_NO_MEMORY;
    return BT_OK;
}

static void write_cleanup(write_out_t *w)
{
    bt_free(w->buf);
    bt_free(w->row);
    memset(w, 0, sizeof(*w));
}

/* Appends n f32 values converted to dtype. */
static bt_status_t write_values(write_out_t *w, const float *v, int64_t n,
                                model_dtype_t dtype)
{
    size_t es = model_dtype_size(dtype);
    bt_status_t status;

    for (int64_t i = 0; i < n; i++) {
        if (w->used + es > (size_t)WRITE_BUF_ELEMS * 4) {
            status = write_flush(w);
            if (status != BT_OK)
                return status;
        }
        if (dtype == MODEL_DTYPE_F32) {
            memcpy(w->buf + w->used, &v[i], 4);
        } else {
            uint16_t h = dtype == MODEL_DTYPE_BF16 ? model_f32_to_bf16(v[i])
                                                   : model_f32_to_f16(v[i]);
            memcpy(w->buf + w->used, &h, 2);
        }
        w->used += es;
    }
    return BT_OK;
}

/* Appends raw bytes (same dtype, no conversion). */
static bt_status_t write_bytes(write_out_t *w, const void *p, size_t n)
{
    const uint8_t *src = p;
    bt_status_t status;

    while (n > 0) {
        size_t room = (size_t)WRITE_BUF_ELEMS * 4 - w->used;
        size_t k = BT_MIN(room, n);
        memcpy(w->buf + w->used, src, k);
        w->used += k;
        src += k;
        n -= k;
        if (w->used == (size_t)WRITE_BUF_ELEMS * 4) {
            status = write_flush(w);
            if (status != BT_OK)
                return status;
        }
    }
    return BT_OK;
}

/* Streams tensor t as dtype, permuting rows (or elements of a vector) by
 * `perm` over heads of head_dim. */
static bt_status_t write_tensor(write_out_t *w, const model_tensor_t *t,
                                model_dtype_t dtype, write_perm_t perm,
                                int head_dim)
{
    int64_t rows = t->rows, cols = t->cols;
    size_t es = model_dtype_size(t->dtype);
    bt_status_t status;

    if (perm != WRITE_PERM_NONE && rows == 1) { /* bias: permute elements */
        rows = cols;
        cols = 1;
    }
    if (perm == WRITE_PERM_NONE && dtype == t->dtype)
        return write_bytes(w, t->data, (size_t)(rows * cols) * es);
    if (w->row_cap < cols) {
        bt_free(w->row);
        w->row = bt_malloc((size_t)cols * sizeof(float), "write_row");
        if (w->row == NULL)
            return BT_ERR_NO_MEMORY;
        w->row_cap = cols;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r;
        if (perm == WRITE_PERM_ADJ_TO_HALF)
            src = model__rope_row_adj_to_half(r, head_dim);
        else if (perm == WRITE_PERM_HALF_TO_ADJ)
            src = model__rope_row_half_to_adj(r, head_dim);
        if (dtype == t->dtype)
            status = write_bytes(w, (const uint8_t *)t->data +
                                        (size_t)(src * cols) * es,
                                 (size_t)cols * es);
        else {
            model_tensor_to_f32(t, src * cols, cols, w->row);
            status = write_values(w, w->row, cols, dtype);
        }
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

static bool write_is_qk(const char *name)
{
    return strstr(name, ".q_proj.") != NULL || strstr(name, ".k_proj.") != NULL;
}

// ----------------------------------------------------------------------------
// Hugging Face

typedef struct {
    char name[128];          /* tensor name */
    const model_tensor_t *t; /* view */
} write_entry_t;

typedef struct {
    write_entry_t *e; /* (n) */
    int n;            /* entries used */
    int cap;          /* entries allocated */
} write_list_t;

static bt_status_t write_collect(const char *name, const model_tensor_t *t,
                                 void *arg)
{
    write_list_t *l = arg;

    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        write_entry_t *e = bt_realloc(l->e, sizeof(*e) * (size_t)cap,
                                      "write_list");
        if (e == NULL)
            return BT_ERR_NO_MEMORY;
        l->e = e;
        l->cap = cap;
    }
    snprintf(l->e[l->n].name, sizeof(l->e[l->n].name), "%s", name);
    l->e[l->n].t = t;
    l->n++;
    return BT_OK;
}

static int write_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const write_entry_t *)a)->name,
                  ((const write_entry_t *)b)->name);
}

/* Shortest decimal that reads back as the same float. */
static void write_float(char *out, size_t len, float f)
{
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, len, "%.*g", prec, (double)f);
        if (strtof(out, NULL) == f)
            break;
    }
    if (strpbrk(out, ".eEn") == NULL) /* keep it a JSON float: 10000.0 */
        snprintf(out + strlen(out), len - strlen(out), ".0");
}

static void write_ids(FILE *fp, const int *ids, int n)
{
    if (n == 0) {
        fprintf(fp, "null");
    } else if (n == 1) {
        fprintf(fp, "%d", ids[0]);
    } else {
        fprintf(fp, "[");
        for (int i = 0; i < n; i++)
            fprintf(fp, "%s%d", i ? ", " : "", ids[i]);
        fprintf(fp, "]");
    }
}

static const char *write_hf_arch(const model_t *m)
{
    if (strcmp(m->arch, "Qwen2ForCausalLM") == 0 ||
        strcmp(m->arch, "MistralForCausalLM") == 0)
        return m->arch;
    return "LlamaForCausalLM";
}

static const char *write_dtype_torch(model_dtype_t dtype)
{
    return dtype == MODEL_DTYPE_F32    ? "float32"
           : dtype == MODEL_DTYPE_BF16 ? "bfloat16"
                                       : "float16";
}

bt_status_t model__write_hf_config(const model_t *m, const char *dir,
                                   model_dtype_t dtype, const char *extra)
{
    const model_config_t *c = &m->cfg;
    const char *arch = write_hf_arch(m);
    const char *type = strcmp(arch, "Qwen2ForCausalLM") == 0     ? "qwen2"
                       : strcmp(arch, "MistralForCausalLM") == 0 ? "mistral"
                                                                 : "llama";
    char path[PATH_MAX + 64], eps[32], theta[32], f1[32], f2[32], f3[32];
    FILE *fp;
    int bos = c->bos_id;

    snprintf(path, sizeof(path), "%s/config.json", dir);
    fp = fopen(path, "w");
    if (fp == NULL)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot create %s: %s", path,
                        strerror(errno));
    write_float(eps, sizeof(eps), c->rms_eps);
    write_float(theta, sizeof(theta), c->rope_theta);
    fprintf(fp, "{\n  \"architectures\": [\"%s\"],\n", arch);
    fprintf(fp, "  \"model_type\": \"%s\",\n", type);
    fprintf(fp, "  \"hidden_act\": \"silu\",\n");
    fprintf(fp, "  \"hidden_size\": %d,\n", c->dim);
    fprintf(fp, "  \"intermediate_size\": %d,\n", c->hidden_dim);
    fprintf(fp, "  \"num_hidden_layers\": %d,\n", c->n_layers);
    fprintf(fp, "  \"num_attention_heads\": %d,\n", c->n_heads);
    fprintf(fp, "  \"num_key_value_heads\": %d,\n", c->n_kv_heads);
    fprintf(fp, "  \"head_dim\": %d,\n", c->head_dim);
    fprintf(fp, "  \"vocab_size\": %d,\n", c->vocab_size);
    fprintf(fp, "  \"max_position_embeddings\": %d,\n", c->max_seq_len);
    fprintf(fp, "  \"rms_norm_eps\": %s,\n", eps);
    fprintf(fp, "  \"rope_theta\": %s,\n", theta);
    if (c->rope_scaling == MODEL_ROPE_SCALING_LINEAR) {
        write_float(f1, sizeof(f1), c->rope_factor);
        fprintf(fp, "  \"rope_scaling\": {\"rope_type\": \"linear\", "
                    "\"factor\": %s},\n", f1);
    } else if (c->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) {
        write_float(f1, sizeof(f1), c->rope_factor);
        write_float(f2, sizeof(f2), c->rope_low_freq_factor);
        write_float(f3, sizeof(f3), c->rope_high_freq_factor);
        fprintf(fp, "  \"rope_scaling\": {\"rope_type\": \"llama3\", "
                    "\"factor\": %s, \"low_freq_factor\": %s, "
                    "\"high_freq_factor\": %s, "
                    "\"original_max_position_embeddings\": %d},\n",
                f1, f2, f3, c->rope_orig_max_pos);
    }
    fprintf(fp, "  \"tie_word_embeddings\": %s,\n",
            c->tied_embeddings ? "true" : "false");
    fprintf(fp, "  \"attention_bias\": %s,\n", c->qkv_bias ? "true" : "false");
    fprintf(fp, "  \"bos_token_id\": ");
    write_ids(fp, &bos, bos >= 0 ? 1 : 0);
    fprintf(fp, ",\n  \"eos_token_id\": ");
    write_ids(fp, c->eos_ids, c->n_eos);
    fprintf(fp, ",\n  \"torch_dtype\": \"%s\"", write_dtype_torch(dtype));
    if (extra != NULL)
        fprintf(fp, ",\n  %s", extra);
    fprintf(fp, "\n}\n");
    if (fclose(fp) != 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", path,
                        strerror(errno));

    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    fp = fopen(path, "w");
    if (fp == NULL)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot create %s: %s", path,
                        strerror(errno));
    fprintf(fp, "{\n  \"bos_token_id\": ");
    write_ids(fp, &bos, bos >= 0 ? 1 : 0);
    fprintf(fp, ",\n  \"eos_token_id\": ");
    write_ids(fp, c->eos_ids, c->n_eos);
    fprintf(fp, "\n}\n");
    if (fclose(fp) != 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", path,
                        strerror(errno));
    return BT_OK;
}

/* Writes the tensors of `list` (sorted here by name) to the safetensors
 * file `path` through `tmp` (renamed on success), q/k rows permuted by
 * `perm`.  Shared by model_write_hf and model_st_write. */
static bt_status_t write_st_list(write_list_t *list_p, const char *path,
                                 const char *tmp, model_dtype_t dtype,
                                 write_perm_t perm, int head_dim)
{
    write_list_t list = *list_p;
    char *hdr = NULL;
    size_t hdr_len = 0, hdr_cap = 0;
    uint64_t off = 0;
    uint8_t len8[8];
    write_out_t w;
    FILE *fp = NULL;
    bt_status_t status = BT_OK;

    memset(&w, 0, sizeof(w));
    qsort(list.e, (size_t)list.n, sizeof(*list.e), write_cmp_entry);

    /* header: {"__metadata__":{"format":"pt"},"name":{...},...} + spaces */
    hdr_cap = 64 + (size_t)list.n * 256;
    hdr = bt_malloc(hdr_cap, "st_header");
    if (hdr == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    hdr_len = (size_t)snprintf(hdr, hdr_cap,
                               "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < list.n; i++) {
        const model_tensor_t *t = list.e[i].t;
        uint64_t bytes = (uint64_t)(t->rows * t->cols) *
                         model_dtype_size(dtype);
        char shape[64];
        if (t->rows == 1)
            snprintf(shape, sizeof(shape), "%lld", (long long)t->cols);
        else
            snprintf(shape, sizeof(shape), "%lld,%lld", (long long)t->rows,
                     (long long)t->cols);
        hdr_len += (size_t)snprintf(hdr + hdr_len, hdr_cap - hdr_len,
                                    ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                    "\"data_offsets\":[%llu,%llu]}",
                                    list.e[i].name, model_dtype_name(dtype),
                                    shape, (unsigned long long)off,
                                    (unsigned long long)(off + bytes));
        off += bytes;
    }
    hdr[hdr_len++] = '}';
    while (hdr_len % 8 != 0)
        hdr[hdr_len++] = ' ';
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hdr_len >> (8 * i));

    fp = fopen(tmp, "wb");
    if (fp == NULL) {
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot create %s: %s", tmp,
                          strerror(errno));
        goto out;
    }
    status = write_init(&w, fp, tmp);
    if (status != BT_OK)
        goto out;
    if ((status = write_bytes(&w, len8, 8)) != BT_OK ||
        (status = write_bytes(&w, hdr, hdr_len)) != BT_OK)
        goto out;
    for (int i = 0; i < list.n; i++) {
        status = write_tensor(&w, list.e[i].t, dtype,
                              write_is_qk(list.e[i].name) ? perm
                                                          : WRITE_PERM_NONE,
                              head_dim);
        if (status != BT_OK)
            goto out;
    }
    status = write_flush(&w);
    if (status != BT_OK)
        goto out;
    if (fclose(fp) != 0) {
        fp = NULL;
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", tmp,
                          strerror(errno));
        goto out;
    }
    fp = NULL;
    if (rename(tmp, path) != 0)
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot rename %s: %s", tmp,
                          strerror(errno));

out:
    if (fp != NULL)
        fclose(fp);
    if (status != BT_OK)
        unlink(tmp);
    write_cleanup(&w);
    bt_free(hdr);
    return status;
}

static bt_status_t write_st(const model_t *m, const char *dir,
                            model_dtype_t dtype)
{
    char path[PATH_MAX + 64], tmp[PATH_MAX + 64];
    write_list_t list = { NULL, 0, 0 };
    write_perm_t perm = m->cfg.rope_layout == MODEL_ROPE_ADJACENT
                            ? WRITE_PERM_ADJ_TO_HALF
                            : WRITE_PERM_NONE;
    bt_status_t status;

    status = model_for_each_tensor(m, write_collect, &list);
    if (status == BT_OK) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        snprintf(tmp, sizeof(tmp), "%s/model.safetensors.tmp", dir);
        status = write_st_list(&list, path, tmp, dtype, perm,
                               m->cfg.head_dim);
    }
    bt_free(list.e);
    return status;
}

bt_status_t model_st_write(const char *path, int n, const char *const *names,
                           const model_tensor_t *tensors, model_dtype_t dtype)
{
    char tmp[PATH_MAX + 64];
    write_list_t list = { NULL, 0, 0 };
    bt_status_t status = BT_OK;

    for (int i = 0; i < n && status == BT_OK; i++)
        status = write_collect(names[i], &tensors[i], &list);
    if (status == BT_OK) {
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        status = write_st_list(&list, path, tmp, dtype, WRITE_PERM_NONE, 0);
    }
    bt_free(list.e);
    return status;
}

bt_status_t model_write_hf(const model_t *model, const char *dir,
                           model_dtype_t dtype)
{
    bt_status_t status;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot create directory %s: %s",
                        dir, strerror(errno));
    status = model__write_hf_config(model, dir, dtype, NULL);
    if (status != BT_OK)
        return status;
    return write_st(model, dir, dtype);
}

// ----------------------------------------------------------------------------
// llama2.c

bt_status_t model_llama2c_check(const model_t *model)
{
    const model_config_t *c = &model->cfg;

    if (c->qkv_bias)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "llama2.c format cannot hold q/k/v biases");
    if (c->rope_scaling != MODEL_ROPE_SCALING_NONE)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "llama2.c format cannot hold rope scaling");
    if (c->rope_theta != 10000.0f)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "llama2.c format fixes rope_theta at 10000 (model "
                        "has %g)", (double)c->rope_theta);
    if (c->rms_eps != 1e-5f)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "llama2.c format fixes rms_norm_eps at 1e-5 (model "
                        "has %g)", (double)c->rms_eps);
    if ((int64_t)c->n_heads * c->head_dim != c->dim)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                        "llama2.c format needs head_dim * n_heads == dim "
                        "(%d * %d != %d)", c->head_dim, c->n_heads, c->dim);
    return BT_OK;
}

bt_status_t model_write_llama2c(const model_t *model, const char *path)
{
    const model_config_t *c = &model->cfg;
    write_perm_t perm = c->rope_layout == MODEL_ROPE_HALF
                            ? WRITE_PERM_HALF_TO_ADJ
                            : WRITE_PERM_NONE;
    const model_dtype_t f32 = MODEL_DTYPE_F32;
    int32_t hdr[7];
    write_out_t w;
    FILE *fp;
    float *tab = NULL;
    int hs = c->head_dim;
    bt_status_t status;

    status = model_llama2c_check(model);
    if (status != BT_OK)
        return status;
    fp = fopen(path, "wb");
    if (fp == NULL)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot create %s: %s", path,
                        strerror(errno));
    status = write_init(&w, fp, path);
    if (status != BT_OK)
        goto out;
    hdr[0] = c->dim;
    hdr[1] = c->hidden_dim;
    hdr[2] = c->n_layers;
    hdr[3] = c->n_heads;
    hdr[4] = c->n_kv_heads;
    hdr[5] = c->tied_embeddings ? c->vocab_size : -c->vocab_size;
    hdr[6] = c->max_seq_len;
    status = write_bytes(&w, hdr, sizeof(hdr));

#define W2C(_t, _perm)                                                      \
    do {                                                                    \
        if (status == BT_OK)                                                \
            status = write_tensor(&w, _t, f32, _perm, hs);                  \
    } while (0)
    W2C(&model->tok_embedding, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].attn_norm, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].wq, perm);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].wk, perm);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].wv, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].wo, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].ffn_norm, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].w_gate, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].w_down, WRITE_PERM_NONE);
    for (int l = 0; l < c->n_layers; l++)
        W2C(&model->layers[l].w_up, WRITE_PERM_NONE);
    W2C(&model->final_norm, WRITE_PERM_NONE);
    if (status != BT_OK)
        goto out;

    /* Legacy RoPE tables (cos then sin), which nothing reads any more. */
    tab = bt_malloc((size_t)hs / 2 * sizeof(float), "write_rope");
    if (tab == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int k = 0; k < 2 && status == BT_OK; k++) {
        for (int t = 0; t < c->max_seq_len && status == BT_OK; t++) {
            for (int i = 0; i < hs / 2; i++) {
                float freq = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hs);
                float x = (float)t * freq;
                tab[i] = k == 0 ? cosf(x) : sinf(x);
            }
            status = write_values(&w, tab, hs / 2, f32);
        }
    }
    if (!c->tied_embeddings)
        W2C(&model->classifier, WRITE_PERM_NONE);
#undef W2C
    if (status == BT_OK)
        status = write_flush(&w);

out:
    bt_free(tab);
    write_cleanup(&w);
    if (fclose(fp) != 0 && status == BT_OK)
        status = BT_ERROR(BT_ERR_IO, "MODEL", "cannot write %s: %s", path,
                          strerror(errno));
    if (status != BT_OK)
        unlink(path);
    return status;
}
