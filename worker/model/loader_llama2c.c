/*
 * loader_llama2c.c - llama2.c "version 0" checkpoints: a header of seven
 * int32 followed by float32 arrays (see ../shared/models/README.md).  The
 * file is mmap'ed and the tensor views point into the mapping.
 */
#include "model_int.h"

#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

#define LLAMA2C_HEADER_BYTES (7 * 4)

/* Element counts of each array in file order. */
typedef struct {
    const char *name; /* llama2.c name, used in error messages */
    int64_t numel;    /* elements (all layers together) */
} llama2c_array_t;

enum {
    L2C_EMB, L2C_RMS_ATT, L2C_WQ, L2C_WK, L2C_WV, L2C_WO, L2C_RMS_FFN,
    L2C_W1, L2C_W2, L2C_W3, L2C_RMS_FINAL, L2C_FREQ_REAL, L2C_FREQ_IMAG,
    L2C_WCLS, L2C_N
};

static void llama2c_arrays(const model_config_t *c, bool shared,
                           llama2c_array_t a[L2C_N])
{
    int64_t L = c->n_layers, dim = c->dim, hs = c->head_dim;
    int64_t qd = (int64_t)c->n_heads * hs, kvd = (int64_t)c->n_kv_heads * hs;

    a[L2C_EMB] = (llama2c_array_t){ "token_embedding", c->vocab_size * dim };
    a[L2C_RMS_ATT] = (llama2c_array_t){ "rms_att", L * dim };
    a[L2C_WQ] = (llama2c_array_t){ "wq", L * qd * dim };
    a[L2C_WK] = (llama2c_array_t){ "wk", L * kvd * dim };
    a[L2C_WV] = (llama2c_array_t){ "wv", L * kvd * dim };
    a[L2C_WO] = (llama2c_array_t){ "wo", L * dim * qd };
    a[L2C_RMS_FFN] = (llama2c_array_t){ "rms_ffn", L * dim };
    a[L2C_W1] = (llama2c_array_t){ "w1", L * c->hidden_dim * dim };
    a[L2C_W2] = (llama2c_array_t){ "w2", L * dim * c->hidden_dim };
    a[L2C_W3] = (llama2c_array_t){ "w3", L * c->hidden_dim * dim };
    a[L2C_RMS_FINAL] = (llama2c_array_t){ "rms_final", dim };
    a[L2C_FREQ_REAL] = (llama2c_array_t){ "freq_cis_real",
                                          (int64_t)c->max_seq_len * hs / 2 };
    a[L2C_FREQ_IMAG] = (llama2c_array_t){ "freq_cis_imag",
                                          (int64_t)c->max_seq_len * hs / 2 };
    a[L2C_WCLS] = (llama2c_array_t){ "wcls",
                                     shared ? 0 : c->vocab_size * dim };
}

bt_status_t model_llama2c_parse(const void *data, size_t size,
                                model_config_t *cfg_p,
                                bool *shared_classifier_p)
{
    static const char *const fields[7] = {
        "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
        "vocab_size", "seq_len",
    };
    static const int64_t max[7] = {
        MODEL_MAX_DIM, MODEL_MAX_DIM, MODEL_MAX_LAYERS, MODEL_MAX_HEADS,
        MODEL_MAX_HEADS, MODEL_MAX_VOCAB, MODEL_MAX_SEQ,
    };
    llama2c_array_t arrays[L2C_N];
    model_config_t cfg;
    int32_t h[7];
    int64_t need = LLAMA2C_HEADER_BYTES;
    bool shared;
    bt_status_t status;

    if (size < LLAMA2C_HEADER_BYTES)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "llama2.c header truncated: file has %zu bytes, "
                        "needs %d", size, LLAMA2C_HEADER_BYTES);
    memcpy(h, data, sizeof(h)); /* little-endian hosts only */
    shared = h[5] > 0;
    if (h[5] < 0 && h[5] != INT32_MIN)
        h[5] = -h[5];
    for (int i = 0; i < 7; i++) {
        if (h[i] <= 0 || h[i] > max[i])
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "llama2.c header: %s = %d is out of range "
                            "[1, %lld]", fields[i], h[i], (long long)max[i]);
    }
    if (h[0] % h[3] != 0)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "llama2.c header: n_heads %d does not divide dim %d",
                        h[3], h[0]);
    if (h[4] > h[3] || h[3] % h[4] != 0)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "llama2.c header: n_kv_heads %d does not divide "
                        "n_heads %d", h[4], h[3]);

    memset(&cfg, 0, sizeof(cfg));
    cfg.dim = h[0];
    cfg.hidden_dim = h[1];
    cfg.n_layers = h[2];
    cfg.n_heads = h[3];
    cfg.n_kv_heads = h[4];
    cfg.head_dim = h[0] / h[3];
    cfg.vocab_size = h[5];
    cfg.max_seq_len = h[6];
    cfg.rope_theta = 10000.0f;
    cfg.rms_eps = 1e-5f;
    cfg.rope_layout = MODEL_ROPE_ADJACENT;
    cfg.rope_scaling = MODEL_ROPE_SCALING_NONE;
    cfg.tied_embeddings = shared;
    cfg.qkv_bias = false;
    cfg.bos_id = 1;
    cfg.eos_ids[0] = 1; /* llama2.c's run.c stops when BOS comes back */
    cfg.n_eos = 1;
    if (cfg.vocab_size < 2)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "llama2.c header: vocab_size %d cannot hold BOS (1)",
                        cfg.vocab_size);
    status = model_config_validate(&cfg);
    if (status != BT_OK)
        return status;

    /* The bounds keep every product below 2^60: no overflow here. */
    llama2c_arrays(&cfg, shared, arrays);
    for (int i = 0; i < L2C_N; i++) {
        int64_t end = need + arrays[i].numel * 4;
        if ((uint64_t)end > size)
            return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                            "%s truncated: file has %zu bytes, needs %lld",
                            arrays[i].name, size, (long long)end);
        need = end;
    }
    if ((uint64_t)need != size)
        return BT_ERROR(BT_ERR_FORMAT, "MODEL",
                        "llama2.c file has %zu bytes, header implies %lld "
                        "(%s classifier)", size, (long long)need,
                        shared ? "shared" : "separate");
    *cfg_p = cfg;
    *shared_classifier_p = shared;
    return BT_OK;
}

static model_tensor_t llama2c_tensor(const float *p, int64_t rows,
                                     int64_t cols)
{
    model_tensor_t t = { p, MODEL_DTYPE_F32, rows, cols };
    return t;
}

bt_status_t model__load_llama2c(const char *path, model_t **model_p)
{
    llama2c_array_t arrays[L2C_N];
    const float *base[L2C_N];
    model_config_t cfg;
    model_t *model = NULL;
    const void *data;
    size_t size;
    const float *p;
    bool shared;
    bt_status_t status;
    int64_t dim, qd, kvd, hid;

    status = model__create(0, &model);
    if (status != BT_OK)
        return status;
    status = model__map_file(model, path, &data, &size);
    if (status != BT_OK)
        goto err_destroy;
    status = model_llama2c_parse(data, size, &cfg, &shared);
    if (status != BT_OK)
        goto err_destroy;
    model->layers = bt_calloc((size_t)cfg.n_layers, sizeof(*model->layers),
                              "model_layers");
    if (model->layers == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    model->cfg = cfg;
    model->format = MODEL_FORMAT_LLAMA2C;
    snprintf(model->arch, sizeof(model->arch), "llama2c");

    llama2c_arrays(&cfg, shared, arrays);
    p = (const float *)((const char *)data + LLAMA2C_HEADER_BYTES);
    for (int i = 0; i < L2C_N; i++) {
        base[i] = p;
        p += arrays[i].numel;
    }
    dim = cfg.dim;
    qd = (int64_t)cfg.n_heads * cfg.head_dim;
    kvd = (int64_t)cfg.n_kv_heads * cfg.head_dim;
    hid = cfg.hidden_dim;
    model->tok_embedding = llama2c_tensor(base[L2C_EMB], cfg.vocab_size, dim);
    for (int l = 0; l < cfg.n_layers; l++) {
        model_layer_t *ly = &model->layers[l];
        ly->attn_norm = llama2c_tensor(base[L2C_RMS_ATT] + l * dim, 1, dim);
        ly->wq = llama2c_tensor(base[L2C_WQ] + l * qd * dim, qd, dim);
        ly->wk = llama2c_tensor(base[L2C_WK] + l * kvd * dim, kvd, dim);
        ly->wv = llama2c_tensor(base[L2C_WV] + l * kvd * dim, kvd, dim);
        ly->wo = llama2c_tensor(base[L2C_WO] + l * dim * qd, dim, qd);
        ly->ffn_norm = llama2c_tensor(base[L2C_RMS_FFN] + l * dim, 1, dim);
        ly->w_gate = llama2c_tensor(base[L2C_W1] + l * hid * dim, hid, dim);
        ly->w_down = llama2c_tensor(base[L2C_W2] + l * dim * hid, dim, hid);
        ly->w_up = llama2c_tensor(base[L2C_W3] + l * hid * dim, hid, dim);
    }
    model->final_norm = llama2c_tensor(base[L2C_RMS_FINAL], 1, dim);
    model->classifier = shared ? model->tok_embedding
                               : llama2c_tensor(base[L2C_WCLS],
                                                cfg.vocab_size, dim);
    *model_p = model;
    return BT_OK;

err_destroy:
    model_destroy(&model);
    return status;
}
