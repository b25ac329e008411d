/*
 * model.c - the model object: loading dispatch, accessors, dtype helpers,
 * config validation and the file mappings every loader shares.
 */
#include "model_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

// ----------------------------------------------------------------------------
// lifetime

bt_status_t model__create(int n_layers, model_t **model_p)
{
    model_t *model;

    BT_ASSERT(n_layers >= 0);
    model = bt_calloc(1, sizeof(*model), "model");
    if (model == NULL)
        return BT_ERR_NO_MEMORY;
    if (n_layers > 0) {
        model->layers = bt_calloc((size_t)n_layers, sizeof(*model->layers),
                                  "model_layers");
        if (model->layers == NULL) {
            bt_free(model);
            return BT_ERR_NO_MEMORY;
        }
    }
    *model_p = model;
    return BT_OK;
}

void model_destroy(model_t **model_p)
{
    model_t *model;

    if (model_p == NULL || *model_p == NULL)
        return;
    model = *model_p;
    for (int i = 0; i < model->n_maps; i++) {
        if (model->maps[i].addr != NULL)
            munmap(model->maps[i].addr, model->maps[i].len);
    }
    bt_free(model->maps);
    for (int i = 0; i < model->n_copies; i++)
        bt_free(model->copies[i]);
    bt_free(model->copies);
    bt_free(model->arena);
    bt_free(model->layers);
    bt_free(model);
    *model_p = NULL;
}

// ---------------------------------------------------------------------------
// Load progress (issue 40)

#define MODEL_PROGRESS_MIN_BYTES (1ull << 30) /* smaller files load fast */
#define MODEL_PROGRESS_CHUNK (64ull << 20)

/* True when reading `size` bytes should show progress: on a terminal
 * for files of 1 GiB and more; BATON_LOAD_PROGRESS=1 forces it (tests,
 * logs), =0 turns it off. */
static bool model_progress_wanted(size_t size)
{
    const char *env = getenv("BATON_LOAD_PROGRESS");

    if (env != NULL && env[0] != '\0')
        return env[0] == '1';
    return size >= MODEL_PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
}

/* Reads the mapping through once, in file order, printing how far it
 * got on one rewritten stderr line.  Why: weights are mmap'ed, so a
 * 16 GB checkpoint's disk time otherwise hides in the first weight
 * upload or forward with no sign of life; read here sequentially (and
 * with read-ahead advice) it shows progress, and the later upload finds
 * the pages in the page cache. */
static void model_read_with_progress(const char *path, const void *addr,
                                     size_t size)
{
    const volatile unsigned char *p = addr;
    uint64_t t0 = bt_time_ns(), last = 0;
    long page = sysconf(_SC_PAGESIZE);
    const char *base = strrchr(path, '/');
    unsigned sum = 0;

    base = base != NULL ? base + 1 : path;
    if (page <= 0)
        page = 4096;
    madvise((void *)addr, size, MADV_SEQUENTIAL);
    for (size_t off = 0; off < size;) {
        size_t end = BT_MIN(size, off + MODEL_PROGRESS_CHUNK);
        uint64_t now;

        madvise((void *)((const char *)addr + (off & ~(size_t)(page - 1))),
                end - (off & ~(size_t)(page - 1)), MADV_WILLNEED);
        for (; off < end; off += (size_t)page)
            sum += p[off];
        off = end;
        now = bt_time_ns();
        if (now - last > 250000000ull || off == size) {
            double s = (double)(now - t0) * 1e-9;
            fprintf(stderr, "\rloading %s: %.1f / %.1f GB (%3.0f%%) %.2f GB/s",
                    base, off / 1e9, size / 1e9, 100.0 * off / size,
                    s > 0 ? off / 1e9 / s : 0.0);
            last = now;
        }
    }
    fprintf(stderr, "\n");
    (void)sum;
    madvise((void *)addr, size, MADV_NORMAL);
}

bt_status_t model__map_file(model_t *model, const char *path,
                            const void **data_p, size_t *size_p)
{
    struct stat st;
    model_map_t *maps;
    void *addr = NULL;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "cannot open %s: %s", path,
                        strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return BT_ERROR(BT_ERR_IO, "MODEL", "%s is not a regular file", path);
    }
    if (st.st_size > 0) {
        addr = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (addr == MAP_FAILED) {
            int err = errno;
            close(fd);
            return BT_ERROR(BT_ERR_IO, "MODEL", "cannot mmap %s: %s", path,
                            strerror(err));
        }
    }
    close(fd);
    if (addr != NULL && model_progress_wanted((size_t)st.st_size))
        model_read_with_progress(path, addr, (size_t)st.st_size);
    maps = bt_realloc(model->maps, sizeof(*maps) * (size_t)(model->n_maps + 1),
                      "model_maps");
    if (maps == NULL) {
        if (addr != NULL)
            munmap(addr, (size_t)st.st_size);
        return BT_ERR_NO_MEMORY;
    }
    model->maps = maps;
    model->maps[model->n_maps].addr = addr;
    model->maps[model->n_maps].len = (size_t)st.st_size;
    model->n_maps++;
    *data_p = addr;
    *size_p = (size_t)st.st_size;
    return BT_OK;
}

bt_status_t model__copy_aligned(model_t *model, const void *src, size_t bytes,
                                const void **copy_p)
{
    void **copies;
    void *copy;

    copies = bt_realloc(model->copies,
                        sizeof(*copies) * (size_t)(model->n_copies + 1),
                        "model_copies");
    if (copies == NULL)
        return BT_ERR_NO_MEMORY;
    model->copies = copies;
    copy = bt_malloc_aligned(bytes > 0 ? bytes : 1, "model_unaligned");
    if (copy == NULL)
        return BT_ERR_NO_MEMORY;
    memcpy(copy, src, bytes);
    model->copies[model->n_copies++] = copy;
    *copy_p = copy;
    return BT_OK;
}

bt_status_t model__alloc_owned(model_t *model, size_t bytes, void **buf_p)
{
    void **copies;
    void *buf;

    copies = bt_realloc(model->copies,
                        sizeof(*copies) * (size_t)(model->n_copies + 1),
                        "model_copies");
    if (copies == NULL)
        return BT_ERR_NO_MEMORY;
    model->copies = copies;
    buf = bt_malloc_aligned(bytes > 0 ? bytes : 1, "model_owned");
    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    memset(buf, 0, bytes > 0 ? bytes : 1);
    model->copies[model->n_copies++] = buf;
    *buf_p = buf;
    return BT_OK;
}

static bool model_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool model_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

bt_status_t model_load(const char *path, model_t **model_p)
{
    return model_load_ex(path, 0, model_p);
}

bool model_is_lazy(const model_t *model)
{
    return model->synth_lazy;
}

bt_status_t model_load_ex(const char *path, unsigned flags,
                          model_t **model_p)
{
    if (path == NULL || model_p == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "model_load: NULL path");
    if (strncmp(path, "synth:", 6) == 0)
        return model__load_synth(path, flags, model_p);
    if (model_is_dir(path) || model_ends_with(path, ".json") ||
        model_ends_with(path, ".safetensors"))
        return model__load_hf(path, model_p);
    return model__load_llama2c(path, model_p);
}

// ----------------------------------------------------------------------------
// accessors

const model_config_t *model_config(const model_t *model)
{
    return &model->cfg;
}

model_format_t model_format(const model_t *model)
{
    return model->format;
}

const char *model_architecture(const model_t *model)
{
    return model->arch;
}

const char *model_format_name(model_format_t format)
{
    switch (format) {
    case MODEL_FORMAT_LLAMA2C:
        return "llama2c";
    case MODEL_FORMAT_HF:
        return "hf";
    case MODEL_FORMAT_SYNTH:
        return "synth";
    }
    return "unknown";
}

const model_tensor_t *model_tok_embedding(const model_t *model)
{
    return &model->tok_embedding;
}

const model_layer_t *model_layer(const model_t *model, int layer)
{
    BT_ASSERT(layer >= 0 && layer < model->cfg.n_layers);
    return &model->layers[layer];
}

const model_tensor_t *model_final_norm(const model_t *model)
{
    return &model->final_norm;
}

const model_tensor_t *model_classifier(const model_t *model)
{
    return &model->classifier;
}

const model_quant_t *model_quant(const model_t *model)
{
    return &model->quant;
}

const model_tensor_t *model_layer_linear(const model_layer_t *layer,
                                         model_linear_t which)
{
    switch (which) {
    case MODEL_LIN_Q:
        return &layer->wq;
    case MODEL_LIN_K:
        return &layer->wk;
    case MODEL_LIN_V:
        return &layer->wv;
    case MODEL_LIN_O:
        return &layer->wo;
    case MODEL_LIN_GATE:
        return &layer->w_gate;
    case MODEL_LIN_UP:
        return &layer->w_up;
    case MODEL_LIN_DOWN:
    case MODEL_N_LINEAR:
        break;
    }
    return &layer->w_down;
}

float model_fp8_in_scale(const model_layer_t *layer, int first, int n)
{
    float s = 0.0f;

    for (int i = first; i < first + n; i++) {
        if (layer->fp8[i].codes == NULL || layer->fp8[i].input_scale == 0.0f)
            return 0.0f;
        s = s > layer->fp8[i].input_scale ? s : layer->fp8[i].input_scale;
    }
    return s;
}

int64_t model__tensor_numel(const model_tensor_t *t)
{
    return t->data == NULL ? 0 : t->rows * t->cols;
}

bt_status_t model_for_each_tensor(const model_t *model, model_tensor_fn fn,
                                   void *arg)
{
    static const char *const names[] = {
        "input_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.q_proj.bias", "self_attn.k_proj.bias",
        "self_attn.v_proj.bias", "self_attn.o_proj.weight",
        "post_attention_layernorm.weight", "mlp.gate_proj.weight",
        "mlp.down_proj.weight", "mlp.up_proj.weight",
    };
    char name[128];
    bt_status_t status;

    status = fn("model.embed_tokens.weight", &model->tok_embedding, arg);
    if (status != BT_OK)
        return status;
    for (int l = 0; l < model->cfg.n_layers; l++) {
        const model_layer_t *ly = &model->layers[l];
        const model_tensor_t *ts[] = {
            &ly->attn_norm, &ly->wq, &ly->wk, &ly->wv, &ly->bq, &ly->bk,
            &ly->bv, &ly->wo, &ly->ffn_norm, &ly->w_gate, &ly->w_down,
            &ly->w_up,
        };
        for (size_t i = 0; i < BT_ARRAY_SIZE(ts); i++) {
            /* absent: no data (lazy synth views: no shape) */
            if (ts[i]->data == NULL &&
                !(model->synth_lazy && ts[i]->rows * ts[i]->cols > 0))
                continue;
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, names[i]);
            status = fn(name, ts[i], arg);
            if (status != BT_OK)
                return status;
        }
    }
    status = fn("model.norm.weight", &model->final_norm, arg);
    if (status != BT_OK)
        return status;
    if (!model->cfg.tied_embeddings)
        status = fn("lm_head.weight", &model->classifier, arg);
    return status;
}

typedef struct {
    int64_t params; /* elements */
    int64_t bytes;  /* bytes as stored */
} model_count_t;

static bt_status_t model_count_fn(const char *name, const model_tensor_t *t,
                                  void *arg)
{
    model_count_t *c = arg;
    (void)name;
    /* every tensor passed here is present (lazy synth views too) */
    c->params += t->rows * t->cols;
    c->bytes += t->rows * t->cols * (int64_t)model_dtype_size(t->dtype);
    return BT_OK;
}

int64_t model_param_count(const model_t *model)
{
    model_count_t c = { 0, 0 };
    model_for_each_tensor(model, model_count_fn, &c);
    return c.params;
}

int64_t model_weight_bytes(const model_t *model)
{
    model_count_t c = { 0, 0 };
    model_for_each_tensor(model, model_count_fn, &c);
    return c.bytes;
}

// ----------------------------------------------------------------------------
// dtypes

size_t model_dtype_size(model_dtype_t dtype)
{
    return dtype == MODEL_DTYPE_F32 ? 4 : 2;
}

const char *model_dtype_name(model_dtype_t dtype)
{
    switch (dtype) {
    case MODEL_DTYPE_F32:
        return "F32";
    case MODEL_DTYPE_F16:
        return "F16";
    case MODEL_DTYPE_BF16:
        return "BF16";
    }
    return "?";
}

float model_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t model_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float model_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    float f;

    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            u = sign | ((uint32_t)(127 - 15 - e) << 23) |
                ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t model_f32_to_f16(float f)
{
    uint32_t u, sign, man;
    int32_t exp;

    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    exp = (int32_t)((u >> 23) & 0xffu);
    man = u & 0x7fffffu;
    if (exp == 0xff) /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    exp = exp - 127 + 15;
    if (exp >= 0x1f) /* overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) { /* subnormal or zero */
        uint32_t shift, half, rest;
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        shift = (uint32_t)(14 - exp);
        half = 1u << (shift - 1);
        rest = man & ((1u << shift) - 1);
        man >>= shift;
        if (rest > half || (rest == half && (man & 1u)))
            man++;
        return (uint16_t)(sign | man);
    }
    {
        uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
        uint32_t rest = man & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++; /* may carry into the exponent: still correct */
        return (uint16_t)h;
    }
}

void model_tensor_to_f32(const model_tensor_t *t, int64_t offset, int64_t n,
                         float *out)
{
    BT_ASSERT(t->data != NULL);
    BT_ASSERT(offset >= 0 && n >= 0 && offset + n <= t->rows * t->cols);
    switch (t->dtype) {
    case MODEL_DTYPE_F32:
        memcpy(out, (const float *)t->data + offset, (size_t)n * sizeof(float));
        break;
    case MODEL_DTYPE_BF16: {
        const uint16_t *src = (const uint16_t *)t->data + offset;
        for (int64_t i = 0; i < n; i++)
            out[i] = model_bf16_to_f32(src[i]);
        break;
    }
    case MODEL_DTYPE_F16: {
        const uint16_t *src = (const uint16_t *)t->data + offset;
        for (int64_t i = 0; i < n; i++)
            out[i] = model_f16_to_f32(src[i]);
        break;
    }
    }
}

// ----------------------------------------------------------------------------
// config validation and RoPE row permutation

static bt_status_t model_check_range(const char *field, int64_t v, int64_t lo,
                                     int64_t hi)
{
    if (v < lo || v > hi)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "config field %s = %lld is out of range [%lld, %lld]",
                        field, (long long)v, (long long)lo, (long long)hi);
    return BT_OK;
}

bt_status_t model_config_validate(const model_config_t *cfg)
{
    bt_status_t status;

#define MODEL_RANGE(_f, _lo, _hi)                                           \
    do {                                                                    \
        status = model_check_range(#_f, cfg->_f, _lo, _hi);                 \
        if (status != BT_OK)                                                \
            return status;                                                  \
    } while (0)

    MODEL_RANGE(dim, 1, MODEL_MAX_DIM);
    MODEL_RANGE(hidden_dim, 1, MODEL_MAX_DIM);
    MODEL_RANGE(n_layers, 1, MODEL_MAX_LAYERS);
    MODEL_RANGE(n_heads, 1, MODEL_MAX_HEADS);
    MODEL_RANGE(n_kv_heads, 1, MODEL_MAX_HEADS);
    MODEL_RANGE(head_dim, 2, MODEL_MAX_HEAD_DIM);
    MODEL_RANGE(vocab_size, 1, MODEL_MAX_VOCAB);
    MODEL_RANGE(max_seq_len, 1, MODEL_MAX_SEQ);
    MODEL_RANGE(n_eos, 0, MODEL_MAX_EOS);
    MODEL_RANGE(bos_id, -1, cfg->vocab_size - 1);
#undef MODEL_RANGE
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "n_kv_heads %d does not divide n_heads %d",
                        cfg->n_kv_heads, cfg->n_heads);
    if (cfg->head_dim % 2 != 0)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "head_dim %d is odd (RoPE rotates pairs)",
                        cfg->head_dim);
    if ((int64_t)cfg->n_heads * cfg->head_dim > 4 * (int64_t)MODEL_MAX_DIM)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "n_heads * head_dim = %lld is too large",
                        (long long)cfg->n_heads * cfg->head_dim);
    for (int i = 0; i < cfg->n_eos; i++) {
        if (cfg->eos_ids[i] < 0 || cfg->eos_ids[i] >= cfg->vocab_size)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "eos id %d is outside the vocabulary (%d)",
                            cfg->eos_ids[i], cfg->vocab_size);
    }
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "rope_theta %g is not > 0",
                        (double)cfg->rope_theta);
    if (!(cfg->rms_eps > 0.0f) || !(cfg->rms_eps < 1.0f))
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "rms_norm_eps %g is not in (0, 1)",
                        (double)cfg->rms_eps);
    if (cfg->rope_layout != MODEL_ROPE_ADJACENT &&
        cfg->rope_layout != MODEL_ROPE_HALF)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "bad rope_layout %d",
                        (int)cfg->rope_layout);
    switch (cfg->rope_scaling) {
    case MODEL_ROPE_SCALING_NONE:
        break;
    case MODEL_ROPE_SCALING_LLAMA3:
        if (!(cfg->rope_low_freq_factor > 0.0f) ||
            !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            !isfinite(cfg->rope_high_freq_factor))
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "llama3 rope scaling needs 0 < low_freq_factor "
                            "(%g) < high_freq_factor (%g)",
                            (double)cfg->rope_low_freq_factor,
                            (double)cfg->rope_high_freq_factor);
        if (cfg->rope_orig_max_pos < 1)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "llama3 rope scaling needs "
                            "original_max_position_embeddings > 0 (got %d)",
                            cfg->rope_orig_max_pos);
        /* fall through */
    case MODEL_ROPE_SCALING_LINEAR:
        if (!(cfg->rope_factor > 0.0f) || !isfinite(cfg->rope_factor))
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "rope scaling factor %g is not > 0",
                            (double)cfg->rope_factor);
        break;
    default:
        return BT_ERROR(BT_ERR_FORMAT, "MODEL", "bad rope_scaling %d",
                        (int)cfg->rope_scaling);
    }
    return BT_OK;
}

int64_t model__rope_row_adj_to_half(int64_t r, int head_dim)
{
    int64_t h = r / head_dim, k = r % head_dim, half = head_dim / 2;
    int64_t j = k / half, i = k % half;
    return h * head_dim + 2 * i + j;
}

int64_t model__rope_row_half_to_adj(int64_t r, int head_dim)
{
    int64_t h = r / head_dim, k = r % head_dim, half = head_dim / 2;
    int64_t i = k / 2, j = k % 2;
    return h * head_dim + j * half + i;
}
