/*
 * spec_head.c - the EAGLE draft head: weights, safetensors load/save and
 * the inference forward pass over its own contiguous KV cache (see
 * spec_head.h).
 */
#include "spec_head.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cpu/cpu_int.h"
#include "model/model_synth.h"
#include "model/model_write.h"
#include "model/safetensors.h"
#include "spec_int.h"

#define SPEC_HEAD_MAX_HALF 512 /* head_dim <= 1024 (head_alloc) */

const char *const spec__tensor_names[SPEC_HEAD_N_TENSORS] = {
    "fc.weight",
    "fc.bias",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
};

struct spec_head_s {
    model_config_t cfg;       /* the target's shape */
    int hidden_dim;           /* the head's feed-forward width */
    int q_dim;                /* n_heads * head_dim */
    int kv_dim;               /* n_kv_heads * head_dim */
    float *params;            /* (n_params) every own weight, flat */
    size_t n_params;
    int64_t shape[SPEC_HEAD_N_TENSORS][2]; /* rows, cols of each tensor */
    float *views[SPEC_HEAD_N_TENSORS];     /* into params, name order */
    spec_head_weights_t w;    /* the same views by role */
    const float *emb;         /* (vocab, dim) target embedding */
    const float *cls;         /* (vocab, dim) target classifier */
    const float *final_norm;  /* (dim) target final norm */
    float *owned[3];          /* converted copies of the three above */
    float *inv_freq;          /* (head_dim / 2) */

    /* The inference matrices packed for cpu__matmul_packed (the CPU
     * backend's register-blocked kernels; the plain cpu__matmul did most
     * of a host draft level): rebuilt by the first forward after
     * spec_head_weights / spec_head_params handed out writable views. */
    float *pk;                /* one allocation for all of them */
    bool pk_valid;
    const float *pk_fc, *pk_qkv, *pk_wo, *pk_gu, *pk_down, *pk_cls;
    /* pk_qkv: [wq; wk; wv] stacked, one product for all three; pk_gu:
     * gate and up rows interleaved (gate 0, up 0, gate 1, ...), the
     * layout cpu__swiglu reads, as the CPU backend fuses w1/w3 */

    /* scratch, grown on demand to scr_rows rows */
    int scr_rows;
    float *x2;                /* (rows, 2 * dim) fc input */
    float *h;                 /* (rows, dim) residual stream */
    float *xn;                /* (rows, dim) normed */
    float *qkv;               /* (rows, q_dim + 2 * kv_dim) */
    float *att;               /* (rows, q_dim) */
    float *gu;                /* (rows, 2 * hidden) gate/up interleaved */
    float *act;               /* (rows, hidden) SwiGLU output */
    float *tmp;               /* (rows, hidden) cpu__swiglu scratch */
    float *scores;            /* attention scratch (scores_cap floats) */
    size_t scores_cap;
    uint8_t *amask;           /* (n_tree, n_tree) mask for cpu__attention */
    size_t amask_cap;
};

// ----------------------------------------------------------------------------
// shared helpers (spec_int.h)

void spec__matmul(float *out, const float *x, const float *w,
                  const float *bias, int n, int k, int n_out,
                  bool accumulate)
{
    cpu__matmul(out, n_out, x, k, w, k, bias, n, k, 0, n_out, accumulate);
}

void spec__transpose(float *out, const float *in, int rows, int cols)
{
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++)
            out[(size_t)r * cols + c] = in[(size_t)c * rows + r];
}

void spec__rmsnorm(float *out, const float *x, const float *weight, int dim,
                   float eps)
{
    cpu__rmsnorm(out, x, weight, dim, eps);
}

void spec__rope(float *vec, int n_heads, int head_dim, const float *inv_freq,
                int pos, float sign)
{
    int half = head_dim / 2;
    float cs[SPEC_HEAD_MAX_HALF], sn[SPEC_HEAD_MAX_HALF];

    BT_ASSERT(half <= SPEC_HEAD_MAX_HALF);
    cpu__rope_cos_sin(pos, inv_freq, half, cs, sn);
    if (sign < 0)
        for (int i = 0; i < half; i++)
            sn[i] = -sn[i];
    cpu__rope_apply(vec, n_heads, head_dim, MODEL_ROPE_HALF, cs, sn);
}

// ----------------------------------------------------------------------------
// create / load / save

/* A float32 copy or view of a target tensor (generated when the target
 * is a lazy synthesized model, whose views have no host data). */
static bt_status_t head_f32(spec_head_t *head, const model_t *target,
                            const model_tensor_t *t, int slot,
                            const float **out_p)
{
    int64_t n = t->rows * t->cols;
    model_synth_src_t src;

    if (t->data == NULL && !model_synth_tensor(target, t, &src))
        return BT_ERROR(BT_ERR_UNSUPPORTED, "SPEC",
                        "the target's tables are not in host memory");
    if (t->data != NULL && t->dtype == MODEL_DTYPE_F32) {
        *out_p = t->data;
        return BT_OK;
    }
    head->owned[slot] = bt_malloc_aligned((size_t)n * sizeof(float),
                                          "spec_head");
    if (head->owned[slot] == NULL)
        return BT_ERR_NO_MEMORY;
    if (t->data == NULL)
        model_synth_to_f32(&src, t->dtype, 0, n, head->owned[slot]);
    else
        model_tensor_to_f32(t, 0, n, head->owned[slot]);
    *out_p = head->owned[slot];
    return BT_OK;
}

/* Allocates the head for `target` with zeroed weights of feed-forward
 * width hidden_dim. */
static bt_status_t head_alloc(const model_t *target, int hidden_dim,
                              spec_head_t **head_p)
{
    const model_config_t *c = model_config(target);
    spec_head_t *head;
    size_t off = 0;
    bt_status_t status;

    if (c->head_dim % 2 != 0 || c->head_dim > 1024)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "SPEC",
                        "head_dim %d not supported by the draft head",
                        c->head_dim);
    head = bt_calloc(1, sizeof(*head), "spec_head");
    if (head == NULL)
        return BT_ERR_NO_MEMORY;
    head->cfg = *c;
    head->hidden_dim = hidden_dim;
    head->q_dim = c->n_heads * c->head_dim;
    head->kv_dim = c->n_kv_heads * c->head_dim;
    {
        int64_t shapes[SPEC_HEAD_N_TENSORS][2] = {
            { c->dim, 2 * c->dim }, { 1, c->dim },
            { head->q_dim, c->dim }, { head->kv_dim, c->dim },
            { head->kv_dim, c->dim }, { c->dim, head->q_dim },
            { 1, c->dim }, { hidden_dim, c->dim }, { hidden_dim, c->dim },
            { c->dim, hidden_dim },
        };
        memcpy(head->shape, shapes, sizeof(shapes));
    }
    for (int i = 0; i < SPEC_HEAD_N_TENSORS; i++)
        head->n_params += (size_t)(head->shape[i][0] * head->shape[i][1]);
    head->params = bt_calloc(head->n_params, sizeof(float), "spec_head");
    head->inv_freq = bt_malloc(sizeof(float) * (size_t)(c->head_dim / 2 + 1),
                               "spec_head");
    if (head->params == NULL || head->inv_freq == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    for (int i = 0; i < SPEC_HEAD_N_TENSORS; i++) {
        head->views[i] = head->params + off;
        off += (size_t)(head->shape[i][0] * head->shape[i][1]);
    }
    head->w = (spec_head_weights_t){
        head->views[0], head->views[1], head->views[2], head->views[3],
        head->views[4], head->views[5], head->views[6], head->views[7],
        head->views[8], head->views[9],
    };
    cpu__rope_inv_freq(c, head->inv_freq);
    if ((status = head_f32(head, target, model_tok_embedding(target), 0,
                           &head->emb)) != BT_OK ||
        (status = head_f32(head, target, model_classifier(target), 1,
                           &head->cls)) != BT_OK ||
        (status = head_f32(head, target, model_final_norm(target), 2,
                           &head->final_norm)) != BT_OK)
        goto err_destroy;
    *head_p = head;
    return BT_OK;

err_destroy:
    spec_head_destroy(&head);
    return status;
}

bt_status_t spec_head_create(const model_t *target, int hidden_dim,
                             uint64_t seed, spec_head_t **head_p)
{
    spec_head_t *head = NULL;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 0x1234567ull;
    int dim = model_config(target)->dim;
    bt_status_t status;

    if (hidden_dim <= 0)
        hidden_dim = model_config(target)->hidden_dim;
    status = head_alloc(target, hidden_dim, &head);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < SPEC_HEAD_N_TENSORS; i++) {
        int64_t n = head->shape[i][0] * head->shape[i][1];
        float bound = 1.0f / sqrtf((float)head->shape[i][1]);

        if (i == 0 || i == 1)
            continue; /* fc: pass-through below */
        if (i == 6) { /* norm weight */
            for (int64_t j = 0; j < n; j++)
                head->views[i][j] = 1.0f;
            continue;
        }
        for (int64_t j = 0; j < n; j++)
            head->views[i][j] = (2.0f * spec__rng_uniform(&rng) - 1.0f) *
                                bound;
    }
    for (int r = 0; r < dim; r++)
        head->w.fc_w[(size_t)r * 2 * dim + dim + r] = 1.0f;
    *head_p = head;
    return BT_OK;
}

bt_status_t spec_head_load(const model_t *target, const char *path,
                           spec_head_t **head_p)
{
    char *buf = NULL;
    size_t size = 0;
    model_st_file_t st;
    const model_st_tensor_t *gate;
    spec_head_t *head = NULL;
    bt_status_t status;

    memset(&st, 0, sizeof(st));
    status = bt_read_file(path, (size_t)1 << 34, &buf, &size);
    if (status != BT_OK)
        return status;
    status = model_st_parse(buf, size, path, &st);
    if (status != BT_OK)
        goto out;
    gate = model_st_find(&st, spec__tensor_names[7]);
    if (gate == NULL || gate->ndim != 2) {
        status = BT_ERROR(BT_ERR_FORMAT, "SPEC", "%s: no 2-d tensor %s",
                          path, spec__tensor_names[7]);
        goto out;
    }
    status = head_alloc(target, (int)gate->shape[0], &head);
    if (status != BT_OK)
        goto out;
    for (int i = 0; i < SPEC_HEAD_N_TENSORS; i++) {
        const model_st_tensor_t *t = model_st_find(&st,
                                                   spec__tensor_names[i]);
        int64_t rows = head->shape[i][0], cols = head->shape[i][1];
        bool vec = rows == 1;
        model_tensor_t view;

        if (t == NULL && i == 1)
            continue; /* no fc bias: zeros */
        if (t == NULL || !t->dtype_ok ||
            (vec ? (t->ndim != 1 || t->shape[0] != cols)
                 : (t->ndim != 2 || t->shape[0] != rows ||
                    t->shape[1] != cols))) {
            status = BT_ERROR(BT_ERR_FORMAT, "SPEC",
                              "%s: tensor %s is missing or not (%lld, %lld) "
                              "F32/F16/BF16 as the target needs", path,
                              spec__tensor_names[i], (long long)rows,
                              (long long)cols);
            goto out;
        }
        view = (model_tensor_t){ t->data, t->dtype, rows, cols };
        /* data may be unaligned: convert element by element */
        if (t->dtype == MODEL_DTYPE_F32)
            memcpy(head->views[i], t->data,
                   (size_t)(rows * cols) * sizeof(float));
        else
            model_tensor_to_f32(&view, 0, rows * cols, head->views[i]);
    }
    BT_LOG_INFO("SPEC", "draft head %s: dim %d, ffn %d, %zu parameters",
                path, head->cfg.dim, head->hidden_dim, head->n_params);
    *head_p = head;
    head = NULL;

out:
    spec_head_destroy(&head);
    model_st_cleanup(&st);
    bt_free(buf);
    return status;
}

bt_status_t spec_head_save(const spec_head_t *head, const char *path)
{
    model_tensor_t t[SPEC_HEAD_N_TENSORS];

    for (int i = 0; i < SPEC_HEAD_N_TENSORS; i++)
        t[i] = (model_tensor_t){ head->views[i], MODEL_DTYPE_F32,
                                 head->shape[i][0], head->shape[i][1] };
    return model_st_write(path, SPEC_HEAD_N_TENSORS, spec__tensor_names, t,
                          MODEL_DTYPE_F32);
}

void spec_head_destroy(spec_head_t **head_p)
{
    spec_head_t *head = *head_p;

    if (head == NULL)
        return;
    for (int i = 0; i < 3; i++)
        bt_free(head->owned[i]);
    bt_free(head->params);
    bt_free(head->pk);
    bt_free(head->inv_freq);
    bt_free(head->x2);
    bt_free(head->h);
    bt_free(head->xn);
    bt_free(head->qkv);
    bt_free(head->att);
    bt_free(head->gu);
    bt_free(head->act);
    bt_free(head->tmp);
    bt_free(head->scores);
    bt_free(head->amask);
    bt_free(head);
    *head_p = NULL;
}

const model_config_t *spec_head_config(const spec_head_t *head)
{
    return &head->cfg;
}

int spec_head_hidden_dim(const spec_head_t *head)
{
    return head->hidden_dim;
}

const spec_head_weights_t *spec_head_weights(spec_head_t *head)
{
    head->pk_valid = false; /* the caller may write through the views */
    return &head->w;
}

float *spec_head_params(spec_head_t *head, size_t *n_p)
{
    head->pk_valid = false;
    *n_p = head->n_params;
    return head->params;
}

const float *spec_head_embedding(const spec_head_t *head)
{
    return head->emb;
}

const float *spec_head_classifier(const spec_head_t *head)
{
    return head->cls;
}

const float *spec_head_inv_freq(const spec_head_t *head)
{
    return head->inv_freq;
}

const float *spec_head_final_norm(const spec_head_t *head)
{
    return head->final_norm;
}

void spec_head_feature(const spec_head_t *head, const float *hidden, int n,
                       float *out)
{
    int dim = head->cfg.dim;

    for (int i = 0; i < n; i++)
        cpu__rmsnorm(out + (size_t)i * dim, hidden + (size_t)i * dim,
                     head->final_norm, dim, head->cfg.rms_eps);
}

void spec_head_logits(const spec_head_t *head, const float *feat, int n,
                      float *logits)
{
    const int dim = head->cfg.dim, vocab = head->cfg.vocab_size;

    if (head->pk_valid && head->pk_cls != NULL)
        cpu__matmul_packed(logits, vocab, feat, dim, head->pk_cls, vocab,
                           NULL, n, dim, 0, vocab, false);
    else
        spec__matmul(logits, feat, head->cls, NULL, n, dim, vocab, false);
}

// ----------------------------------------------------------------------------
// KV cache and forward

bt_status_t spec_head_kv_init(const spec_head_t *head, int cap,
                              spec_head_kv_t *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->k = bt_calloc((size_t)cap * (size_t)head->kv_dim, sizeof(float),
                      "spec_kv");
    kv->v = bt_calloc((size_t)cap * (size_t)head->kv_dim, sizeof(float),
                      "spec_kv");
    if (kv->k == NULL || kv->v == NULL) {
        spec_head_kv_cleanup(kv);
        return BT_ERR_NO_MEMORY;
    }
    kv->cap = cap;
    return BT_OK;
}

void spec_head_kv_cleanup(spec_head_kv_t *kv)
{
    bt_free(kv->k);
    bt_free(kv->v);
    memset(kv, 0, sizeof(*kv));
}

static bool head_grow(float **p, size_t n)
{
    float *q = bt_realloc(*p, n * sizeof(float), "spec_scratch");

    if (q == NULL)
        return false;
    *p = q;
    return true;
}

static bt_status_t head_scratch(spec_head_t *head, int rows, int cap)
{
    size_t r = (size_t)rows;
    int dim = head->cfg.dim;

    if (rows > head->scr_rows) {
        if (!head_grow(&head->x2, r * 2 * dim) ||
            !head_grow(&head->h, r * dim) || !head_grow(&head->xn, r * dim) ||
            !head_grow(&head->qkv, r * (head->q_dim + 2 * head->kv_dim)) ||
            !head_grow(&head->att, r * head->q_dim) ||
            !head_grow(&head->gu, r * 2 * head->hidden_dim) ||
            !head_grow(&head->act, r * head->hidden_dim) ||
            !head_grow(&head->tmp, r * head->hidden_dim))
            return BT_ERR_NO_MEMORY;
        head->scr_rows = rows;
    }
    {   /* cpu__attention: rows x slots; its decode path: its own size */
        size_t need = BT_MAX(r * (size_t)cap,
                             CPU_ATTN_DECODE_SCRATCH((size_t)cap));

        if (need > head->scores_cap) {
            if (!head_grow(&head->scores, need))
                return BT_ERR_NO_MEMORY;
            head->scores_cap = need;
        }
    }
    return BT_OK;
}

#define HEAD_PACK_CLS_MAX ((size_t)16 << 20) /* floats: 64 MB */

/* (Re)packs the inference matrices when the weights may have changed.
 * The fused ones are first assembled row by row in a temporary. */
static bt_status_t head_pack(spec_head_t *head)
{
    const model_config_t *c = &head->cfg;
    const spec_head_weights_t *w = &head->w;
    const int dim = c->dim, hid = head->hidden_dim;
    const int qkv = head->q_dim + 2 * head->kv_dim;
    float *tmp;
    struct {
        const float *src;
        int rows, cols;
        const float **dst;
    } m[] = {
        {w->fc_w, dim, 2 * dim, &head->pk_fc},
        {NULL, qkv, dim, &head->pk_qkv},
        {w->wo, dim, head->q_dim, &head->pk_wo},
        {NULL, 2 * hid, dim, &head->pk_gu},
        {w->w_down, dim, hid, &head->pk_down},
        {head->cls, c->vocab_size, dim, &head->pk_cls},
    };
    /* the target's classifier is packed only when small (a large
     * vocabulary would double its host copy; such heads draft on the
     * GPU anyway, spec.c) */
    const bool cls = (size_t)c->vocab_size * (size_t)dim <= HEAD_PACK_CLS_MAX;
    const int n_m = (int)(sizeof(m) / sizeof(m[0])) - (cls ? 0 : 1);
    size_t total = 0, off = 0;

    if (head->pk_valid)
        return BT_OK;
    for (int i = 0; i < n_m; i++)
        total += cpu__pack_size(m[i].rows, m[i].cols);
    if (head->pk == NULL) {
        head->pk = bt_malloc_aligned(total * sizeof(float), "spec_head_pk");
        if (head->pk == NULL)
            return BT_ERR_NO_MEMORY;
    }
    tmp = bt_malloc((size_t)BT_MAX(qkv, 2 * hid) * dim * sizeof(float),
                    "spec_head_pk");
    if (tmp == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < n_m; i++) {
        const float *src = m[i].src;
        size_t row = sizeof(float) * (size_t)dim;

        if (m[i].dst == &head->pk_qkv) {
            memcpy(tmp, w->wq, row * head->q_dim);
            memcpy(tmp + (size_t)head->q_dim * dim, w->wk,
                   row * head->kv_dim);
            memcpy(tmp + (size_t)(head->q_dim + head->kv_dim) * dim, w->wv,
                   row * head->kv_dim);
            src = tmp;
        } else if (m[i].dst == &head->pk_gu) {
            for (int j = 0; j < hid; j++) {
                memcpy(tmp + (size_t)(2 * j) * dim,
                       w->w_gate + (size_t)j * dim, row);
                memcpy(tmp + (size_t)(2 * j + 1) * dim,
                       w->w_up + (size_t)j * dim, row);
            }
            src = tmp;
        }
        cpu__pack(head->pk + off, src, m[i].cols, m[i].rows, m[i].cols);
        *m[i].dst = head->pk + off;
        off += cpu__pack_size(m[i].rows, m[i].cols);
    }
    bt_free(tmp);
    if (!cls)
        head->pk_cls = NULL;
    head->pk_valid = true;
    return BT_OK;
}

/* out (n, n_out) [+]= x (n, k) . packed (n_out, k)^T [+ bias]. */
static void head_mm(float *out, int ldo, const float *x, int k,
                    const float *wp, int n_out, const float *bias, int n,
                    bool acc)
{
    cpu__matmul_packed(out, ldo, x, k, wp, n_out, bias, n, k, 0, n_out, acc);
}

bt_status_t spec_head_forward(spec_head_t *head, spec_head_kv_t *kv, int n,
                              const float *feat, const int *tokens,
                              const int *pos, int ctx, int base,
                              const uint8_t *mask, float *out_feat,
                              float *logits)
{
    const spec_head_part_t part = { kv, n, ctx, base, mask };

    return spec_head_forward_parts(head, 1, &part, feat, tokens, pos,
                                   out_feat, logits);
}

/* The CPU backend's attention for one part's rows (q and att at the
 * part's first row): the head's cache seen as one block, slots [0, ctx)
 * cached, [ctx, base + n) the "new" tokens of which these rows are the
 * last n (i0 = base - ctx); row i sees new token j <= i0 + i (and, with
 * a mask, only where mask[i][j]). */
static bt_status_t head_attend(spec_head_t *head, const spec_head_part_t *p,
                               const float *q, int ldq, float *att)
{
    const model_config_t *c = &head->cfg;
    const int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    const int n = p->n, i0 = p->base - p->ctx, n_tree = i0 + n, zero = 0;
    cpu_attn_seq_t as;

    memset(&as, 0, sizeof(as));
    as.k_layer = p->kv->k;
    as.v_layer = p->kv->v;
    as.block_table = &zero;
    as.block_size = p->kv->cap;
    as.kv_row = head->kv_dim;
    as.head_dim = hd;
    as.ctx_len = p->ctx;
    as.n_new = n_tree;
    if (p->mask != NULL) {
        size_t mb = (size_t)n_tree * n_tree;

        if (mb > head->amask_cap) {
            uint8_t *m = bt_realloc(head->amask, mb, "spec_head");

            if (m == NULL)
                return BT_ERR_NO_MEMORY;
            head->amask = m;
            head->amask_cap = mb;
        }
        memset(head->amask, 0, mb);
        for (int i = 0; i < n; i++)
            for (int j = 0; j <= i0 + i; j++)
                head->amask[(size_t)(i0 + i) * n_tree + j] =
                    p->mask[(size_t)i * n_tree + j] != 0;
        as.mask = head->amask;
    }
    if (n == 1 && p->mask == NULL) {
        cpu__attention_decode(att, q, &as, c->n_kv_heads, group,
                              head->scores);
    } else {
        for (int kvh = 0; kvh < c->n_kv_heads; kvh++)
            cpu__attention(att + (size_t)kvh * group * hd, head->q_dim,
                           q + (size_t)kvh * group * hd, ldq, &as, kvh,
                           group, i0, n, head->scores);
    }
    return BT_OK;
}

bt_status_t spec_head_forward_parts(spec_head_t *head, int n_parts,
                                    const spec_head_part_t *parts,
                                    const float *feat, const int *tokens,
                                    const int *pos, float *out_feat,
                                    float *logits)
{
    const model_config_t *c = &head->cfg;
    const spec_head_weights_t *w = &head->w;
    int dim = c->dim, hd = c->head_dim, hid = head->hidden_dim;
    const int qkv = head->q_dim + 2 * head->kv_dim;
    int n = 0, cap = 1;
    bt_status_t status;

    for (int p = 0; p < n_parts; p++) {
        const spec_head_part_t *pt = &parts[p];

        if (pt->n <= 0 || pt->ctx < 0 || pt->base < pt->ctx ||
            pt->base + pt->n > pt->kv->cap)
            return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                            "draft forward of %d rows at slot %d (ctx %d) "
                            "exceeds its cache of %d", pt->n, pt->base,
                            pt->ctx, pt->kv->cap);
        n += pt->n;
        cap = BT_MAX(cap, pt->base + pt->n);
    }
    if (n == 0)
        return BT_OK;
    status = head_scratch(head, n, cap);
    if (status == BT_OK)
        status = head_pack(head);
    if (status != BT_OK)
        return status;

    /* fc over [embedding; feature] */
    for (int i = 0; i < n; i++) {
        BT_ASSERT(tokens[i] >= 0 && tokens[i] < c->vocab_size);
        memcpy(head->x2 + (size_t)i * 2 * dim,
               head->emb + (size_t)tokens[i] * dim, sizeof(float) * dim);
        memcpy(head->x2 + (size_t)i * 2 * dim + dim, feat + (size_t)i * dim,
               sizeof(float) * dim);
    }
    head_mm(head->h, dim, head->x2, 2 * dim, head->pk_fc, dim, w->fc_b, n,
            false);

    /* attention (layer 0: no input norm): Q, K and V of all rows in one
     * product; each row's K and V then go to its part's cache slots
     * base .. base + n - 1, and RoPE rotates Q and K from one cos/sin
     * table per row */
    head_mm(head->qkv, qkv, head->h, dim, head->pk_qkv, qkv, NULL, n,
            false);
    for (int p = 0, r = 0; p < n_parts; p++) {
        const spec_head_part_t *pt = &parts[p];

        for (int i = 0; i < pt->n; i++, r++) {
            float *row = head->qkv + (size_t)r * qkv;
            float *k = pt->kv->k + (size_t)(pt->base + i) * head->kv_dim;
            float cs[SPEC_HEAD_MAX_HALF], sn[SPEC_HEAD_MAX_HALF];

            memcpy(k, row + head->q_dim, sizeof(float) * head->kv_dim);
            memcpy(pt->kv->v + (size_t)(pt->base + i) * head->kv_dim,
                   row + head->q_dim + head->kv_dim,
                   sizeof(float) * head->kv_dim);
            cpu__rope_cos_sin(pos[r], head->inv_freq, hd / 2, cs, sn);
            cpu__rope_apply(row, c->n_heads, hd, MODEL_ROPE_HALF, cs, sn);
            cpu__rope_apply(k, c->n_kv_heads, hd, MODEL_ROPE_HALF, cs, sn);
        }
    }
    for (int p = 0, r = 0; p < n_parts; r += parts[p].n, p++) {
        status = head_attend(head, &parts[p], head->qkv + (size_t)r * qkv,
                             qkv, head->att + (size_t)r * head->q_dim);
        if (status != BT_OK)
            return status;
    }
    head_mm(head->h, dim, head->att, head->q_dim, head->pk_wo, dim, NULL, n,
            true);

    /* feed-forward */
    for (int i = 0; i < n; i++)
        spec__rmsnorm(head->xn + (size_t)i * dim, head->h + (size_t)i * dim,
                      w->post_norm, dim, c->rms_eps);
    head_mm(head->gu, 2 * hid, head->xn, dim, head->pk_gu, 2 * hid, NULL, n,
            false);
    cpu__swiglu(head->act, head->gu, n * hid, head->tmp);
    head_mm(head->h, dim, head->act, hid, head->pk_down, dim, NULL, n,
            true);

    memcpy(out_feat, head->h, sizeof(float) * (size_t)n * dim);
    if (logits != NULL)
        spec_head_logits(head, out_feat, n, logits);
    return BT_OK;
}
