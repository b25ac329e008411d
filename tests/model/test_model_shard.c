/*
 * test_model_shard.c - tensor-parallel sharding without a GPU:
 *   - model_shard_check / model_shard_plan: argument validation with
 *     clear messages, every head / feed-forward row / vocab row owned by
 *     exactly one rank (vocab padded when it does not divide);
 *   - the synth generator element by element (model_synth_value, lazy
 *     models, model_slice_to_f32) equals the host fill bit for bit, so a
 *     device or a shard generating its own slice sees the same weights;
 *   - a forward pass computed shard by shard (each rank's q/k/v heads, its
 *     o-projection columns, its gate/up rows and down columns, partial o
 *     and down outputs summed over ranks in rank order, vocab-sharded
 *     logits) equals the unsharded one for tp = 1, 2, 4 on aidreams260K
 *     and stories260K (4 KV heads), and the CPU backend's logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"
#include "model/model_shard.h"
#include "model/model_synth.h"

#define MAX_SEQ 48
#define TOL 1e-5

// ---------------------------------------------------------------------
// validation and coverage

static model_config_t cfg_of(int nh, int nkv, int hidden, int vocab)
{
    model_config_t c;

    memset(&c, 0, sizeof(c));
    c.dim = nh * 16;
    c.hidden_dim = hidden;
    c.n_layers = 1;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    c.head_dim = 16;
    c.vocab_size = vocab;
    return c;
}

static void test_validation(void)
{
    model_config_t c = cfg_of(8, 4, 172, 512);
    model_shard_t sh;

    BT_ASSERT_EQ(model_shard_check(&c, 0), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(model_shard_check(&c, -1), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(model_shard_check(&c, 65), BT_ERR_INVALID_ARG);
    BT_ASSERT_OK(model_shard_check(&c, 1));
    BT_ASSERT_OK(model_shard_check(&c, 2));
    BT_ASSERT_OK(model_shard_check(&c, 4));
    BT_ASSERT_EQ(model_shard_check(&c, 8), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "KV heads") != NULL);
    BT_ASSERT_EQ(model_shard_check(&c, 3), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "query heads") != NULL);
    c = cfg_of(8, 8, 100, 512);
    BT_ASSERT_EQ(model_shard_check(&c, 8), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "feed-forward") != NULL);
    c = cfg_of(8, 8, 64, 4);
    BT_ASSERT_EQ(model_shard_check(&c, 8), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "vocabulary") != NULL);
    c = cfg_of(8, 4, 172, 512);
    BT_ASSERT_EQ(model_shard_plan(&c, 2, 2, &sh), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(model_shard_plan(&c, 2, -1, &sh), BT_ERR_INVALID_ARG);
    BT_TEST_PASS("shard validation");
}

static void test_coverage(void)
{
    /* vocab 1001 does not divide by 4: 251, 251, 251, 248 */
    const int tps[] = { 1, 2, 4, 8 };
    model_config_t c = cfg_of(16, 8, 344, 1001);

    for (size_t k = 0; k < sizeof(tps) / sizeof(tps[0]); k++) {
        int tp = tps[k];
        int heads = 0, kv = 0, hid = 0, voc = 0;

        for (int r = 0; r < tp; r++) {
            model_shard_t sh;
            model_tensor_t wq = { NULL, MODEL_DTYPE_F32, 256, 256 };
            model_tensor_t wo = { NULL, MODEL_DTYPE_F32, 256, 256 };
            model_slice_t s;

            BT_ASSERT_OK(model_shard_plan(&c, tp, r, &sh));
            BT_ASSERT_EQ(sh.head0, heads);
            BT_ASSERT_EQ(sh.kv_head0, kv);
            BT_ASSERT_EQ(sh.hidden0, hid);
            BT_ASSERT_EQ(sh.vocab0, voc);
            BT_ASSERT_EQ(sh.n_heads / sh.n_kv_heads, 2); /* GQA kept */
            BT_ASSERT_EQ(sh.vocab_shard, (1001 + tp - 1) / tp);
            BT_CHECK(sh.n_vocab <= sh.vocab_shard && sh.n_vocab > 0);
            heads += sh.n_heads;
            kv += sh.n_kv_heads;
            hid += sh.n_hidden;
            voc += sh.n_vocab;
            s = model_shard_slice(&sh, &c, &wq, MODEL_PART_WQ);
            BT_ASSERT_EQ(s.row0, sh.head0 * 16);
            BT_ASSERT_EQ(s.rows, sh.n_heads * 16);
            BT_ASSERT_EQ(s.cols, 256);
            s = model_shard_slice(&sh, &c, &wo, MODEL_PART_WO);
            BT_ASSERT_EQ(s.col0, sh.head0 * 16);
            BT_ASSERT_EQ(s.rows, 256);
        }
        BT_ASSERT_EQ(heads, 16);
        BT_ASSERT_EQ(kv, 8);
        BT_ASSERT_EQ(hid, 344);
        BT_ASSERT_EQ(voc, 1001);
    }
    BT_TEST_PASS("shard coverage (heads, kv heads, ffn rows, padded vocab)");
}

// ---------------------------------------------------------------------
// the synth generator element by element

static void same_tensor(const model_t *ma, const model_tensor_t *a,
                        const model_t *mb, const model_tensor_t *b)
{
    model_slice_t s = { 0, a->rows, 0, a->cols };
    size_t n = (size_t)(a->rows * a->cols);
    float *va = malloc(n * sizeof(float)), *vb = malloc(n * sizeof(float));
    model_synth_src_t src;

    BT_ASSERT_EQ(a->rows, b->rows);
    BT_ASSERT_EQ(a->cols, b->cols);
    BT_ASSERT_EQ(a->dtype, b->dtype);
    model_tensor_to_f32(a, 0, (int64_t)n, va);
    model_slice_to_f32(mb, b, &s, vb);
    BT_CHECK(memcmp(va, vb, n * sizeof(float)) == 0);
    /* and straight from the generator */
    BT_CHECK(model_synth_tensor(mb, b, &src));
    model_synth_to_f32(&src, b->dtype, 0, (int64_t)n, vb);
    BT_CHECK(memcmp(va, vb, n * sizeof(float)) == 0);
    free(va);
    free(vb);
}

static void test_synth_generator(const char *shape, int dtype)
{
    model_t *m = NULL, *lz = NULL;
    model_config_t c;
    const char *arch;
    model_dtype_t dt;

    BT_ASSERT_OK(model_synth_create(shape, 7, dtype, &m));
    dt = model_tok_embedding(m)->dtype;
    BT_ASSERT_OK(model_synth_shape_config(shape, &c, &arch));
    BT_ASSERT_OK(model_synth_from_cfg_lazy(&c, arch, 7, dt, &lz));
    BT_CHECK(model_is_lazy(lz));
    BT_CHECK(!model_is_lazy(m));
    BT_CHECK(model_tok_embedding(lz)->data == NULL);
    BT_ASSERT_EQ(model_param_count(lz), model_param_count(m));
    BT_ASSERT_EQ(model_weight_bytes(lz), model_weight_bytes(m));
    same_tensor(m, model_tok_embedding(m), lz, model_tok_embedding(lz));
    same_tensor(m, model_final_norm(m), lz, model_final_norm(lz));
    same_tensor(m, model_classifier(m), lz, model_classifier(lz));
    for (int l = 0; l < c.n_layers; l++) {
        const model_layer_t *a = model_layer(m, l), *b = model_layer(lz, l);
        const model_tensor_t *ta[] = { &a->attn_norm, &a->wq, &a->wk, &a->wv,
                                       &a->wo, &a->ffn_norm, &a->w_gate,
                                       &a->w_down, &a->w_up, &a->bq, &a->bk,
                                       &a->bv };
        const model_tensor_t *tb[] = { &b->attn_norm, &b->wq, &b->wk, &b->wv,
                                       &b->wo, &b->ffn_norm, &b->w_gate,
                                       &b->w_down, &b->w_up, &b->bq, &b->bk,
                                       &b->bv };
        for (size_t i = 0; i < sizeof(ta) / sizeof(ta[0]); i++) {
            if (ta[i]->data == NULL) {
                BT_ASSERT_EQ(tb[i]->rows * tb[i]->cols, 0);
                continue;
            }
            same_tensor(m, ta[i], lz, tb[i]);
        }
    }
    /* model_load_ex: the spec form (the shape's default dtype) */
    if (dtype == MODEL_SYNTH_DTYPE_DEFAULT) {
        char spec[64];
        model_t *l2 = NULL;

        snprintf(spec, sizeof(spec), "synth:%s:7", shape);
        BT_ASSERT_OK(model_load_ex(spec, MODEL_LOAD_SYNTH_LAZY, &l2));
        BT_CHECK(model_is_lazy(l2));
        same_tensor(m, &model_layer(m, 0)->w_down, l2,
                    &model_layer(l2, 0)->w_down);
        model_destroy(&l2);
    }
    model_destroy(&lz);
    model_destroy(&m);
    fprintf(stderr, "PASS synth generator by element: %s %s\n", shape,
            model_dtype_name(dt));
}

// ---------------------------------------------------------------------
// a forward pass shard by shard

typedef struct {
    model_shard_t sh;
    int qd, kvd;                      /* this rank's q and kv widths */
    float **wq, **wk, **wv, **bq, **bk, **bv, **wo, **wg, **wu, **wd;
    float *cls;                       /* (n_vocab, dim) */
    float *kc, *vc;                   /* (L, MAX_SEQ, kvd) */
} rank_w_t;

typedef struct {
    const model_t *m;
    model_config_t c;
    int tp;
    float *emb, *final_norm;          /* replicated */
    float **attn_norm, **ffn_norm;
    rank_w_t *r;                      /* (tp) */
} sharded_t;

static float *slice_f32(const model_t *m, const model_tensor_t *t,
                        const model_shard_t *sh, model_part_t part)
{
    model_slice_t s;
    float *out;

    if (t->data == NULL && t->rows * t->cols == 0)
        return NULL;
    s = model_shard_slice(sh, model_config(m), t, part);
    out = malloc((size_t)(s.rows * s.cols) * sizeof(float));
    model_slice_to_f32(m, t, &s, out);
    return out;
}

static void sharded_init(sharded_t *S, const model_t *m, int tp)
{
    const model_config_t *c = model_config(m);
    model_shard_t whole;
    int L = c->n_layers;

    memset(S, 0, sizeof(*S));
    S->m = m;
    S->c = *c;
    S->tp = tp;
    BT_ASSERT_OK(model_shard_plan(c, 1, 0, &whole));
    S->emb = slice_f32(m, model_tok_embedding(m), &whole, MODEL_PART_WHOLE);
    S->final_norm = slice_f32(m, model_final_norm(m), &whole,
                              MODEL_PART_WHOLE);
    S->attn_norm = calloc((size_t)L, sizeof(float *));
    S->ffn_norm = calloc((size_t)L, sizeof(float *));
    for (int l = 0; l < L; l++) {
        S->attn_norm[l] = slice_f32(m, &model_layer(m, l)->attn_norm, &whole,
                                    MODEL_PART_WHOLE);
        S->ffn_norm[l] = slice_f32(m, &model_layer(m, l)->ffn_norm, &whole,
                                   MODEL_PART_WHOLE);
    }
    S->r = calloc((size_t)tp, sizeof(*S->r));
    for (int k = 0; k < tp; k++) {
        rank_w_t *R = &S->r[k];
        float ***lists[] = { &R->wq, &R->wk, &R->wv, &R->bq, &R->bk, &R->bv,
                             &R->wo, &R->wg, &R->wu, &R->wd };

        BT_ASSERT_OK(model_shard_plan(c, tp, k, &R->sh));
        R->qd = R->sh.n_heads * c->head_dim;
        R->kvd = R->sh.n_kv_heads * c->head_dim;
        for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
            *lists[i] = calloc((size_t)L, sizeof(float *));
        for (int l = 0; l < L; l++) {
            const model_layer_t *ml = model_layer(m, l);

            R->wq[l] = slice_f32(m, &ml->wq, &R->sh, MODEL_PART_WQ);
            R->wk[l] = slice_f32(m, &ml->wk, &R->sh, MODEL_PART_WK);
            R->wv[l] = slice_f32(m, &ml->wv, &R->sh, MODEL_PART_WV);
            R->bq[l] = slice_f32(m, &ml->bq, &R->sh, MODEL_PART_BQ);
            R->bk[l] = slice_f32(m, &ml->bk, &R->sh, MODEL_PART_BK);
            R->bv[l] = slice_f32(m, &ml->bv, &R->sh, MODEL_PART_BV);
            R->wo[l] = slice_f32(m, &ml->wo, &R->sh, MODEL_PART_WO);
            R->wg[l] = slice_f32(m, &ml->w_gate, &R->sh, MODEL_PART_GATE);
            R->wu[l] = slice_f32(m, &ml->w_up, &R->sh, MODEL_PART_UP);
            R->wd[l] = slice_f32(m, &ml->w_down, &R->sh, MODEL_PART_DOWN);
        }
        R->cls = slice_f32(m, model_classifier(m), &R->sh, MODEL_PART_CLS);
        R->kc = calloc((size_t)L * MAX_SEQ * R->kvd, sizeof(float));
        R->vc = calloc((size_t)L * MAX_SEQ * R->kvd, sizeof(float));
    }
}

static void sharded_free(sharded_t *S)
{
    int L = S->c.n_layers;

    for (int k = 0; k < S->tp; k++) {
        rank_w_t *R = &S->r[k];
        float **lists[] = { R->wq, R->wk, R->wv, R->bq, R->bk, R->bv, R->wo,
                            R->wg, R->wu, R->wd };

        for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
            for (int l = 0; l < L; l++)
                free(lists[i][l]);
            free(lists[i]);
        }
        free(R->cls);
        free(R->kc);
        free(R->vc);
    }
    for (int l = 0; l < L; l++) {
        free(S->attn_norm[l]);
        free(S->ffn_norm[l]);
    }
    free(S->attn_norm);
    free(S->ffn_norm);
    free(S->emb);
    free(S->final_norm);
    free(S->r);
}

static void rmsnorm(float *o, const float *x, const float *w, int n,
                    float eps)
{
    float ss = 0.0f;

    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* out (d) = W (d, n) . x (n) [+ b] */
static void matvec(float *out, const float *w, const float *x, int n, int d,
                   const float *b)
{
    for (int i = 0; i < d; i++) {
        float v = 0.0f;

        for (int j = 0; j < n; j++)
            v += w[(size_t)i * n + j] * x[j];
        out[i] = v + (b ? b[i] : 0.0f);
    }
}

static void rope(float *vec, int n_heads, int hs, int pos, float theta,
                 model_rope_layout_t layout)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * hs;

        for (int i = 0; i < hs / 2; i++) {
            float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
            float fcr = cosf(pos * freq), fci = sinf(pos * freq);
            int a = layout == MODEL_ROPE_ADJACENT ? 2 * i : i;
            int b = layout == MODEL_ROPE_ADJACENT ? 2 * i + 1 : i + hs / 2;
            float v0 = v[a], v1 = v[b];

            v[a] = v0 * fcr - v1 * fci;
            v[b] = v0 * fci + v1 * fcr;
        }
    }
}

/* One token at `pos`; logits (vocab) gathered from every rank's slice. */
static void sharded_forward(sharded_t *S, int token, int pos, float *logits)
{
    const model_config_t *c = &S->c;
    int dim = c->dim, hs = c->head_dim, L = c->n_layers;
    float x[1024], xn[1024], part[MODEL_SHARD_MAX_TP][1024];
    float q[1024], k[1024], v[1024], att[1024], sc[MAX_SEQ];
    float g[2048], u[2048];

    BT_CHECK(dim <= 1024 && c->n_heads * hs <= 1024 && c->hidden_dim <= 2048);
    memcpy(x, S->emb + (size_t)token * dim, sizeof(float) * dim);
    for (int l = 0; l < L; l++) {
        rmsnorm(xn, x, S->attn_norm[l], dim, c->rms_eps);
        for (int r = 0; r < S->tp; r++) {
            rank_w_t *R = &S->r[r];
            int kv_mul = R->sh.n_heads / R->sh.n_kv_heads;
            float *kc = R->kc + ((size_t)l * MAX_SEQ) * R->kvd;
            float *vc = R->vc + ((size_t)l * MAX_SEQ) * R->kvd;

            matvec(q, R->wq[l], xn, dim, R->qd, R->bq[l]);
            matvec(k, R->wk[l], xn, dim, R->kvd, R->bk[l]);
            matvec(v, R->wv[l], xn, dim, R->kvd, R->bv[l]);
            rope(q, R->sh.n_heads, hs, pos, c->rope_theta, c->rope_layout);
            rope(k, R->sh.n_kv_heads, hs, pos, c->rope_theta,
                 c->rope_layout);
            memcpy(kc + (size_t)pos * R->kvd, k, sizeof(float) * R->kvd);
            memcpy(vc + (size_t)pos * R->kvd, v, sizeof(float) * R->kvd);
            for (int h = 0; h < R->sh.n_heads; h++) {
                const float *qh = q + h * hs;
                int kh = h / kv_mul; /* local KV head */
                float mx = -INFINITY, sum = 0.0f;

                for (int t = 0; t <= pos; t++) {
                    const float *kt = kc + (size_t)t * R->kvd + kh * hs;
                    float s = 0.0f;

                    for (int i = 0; i < hs; i++)
                        s += qh[i] * kt[i];
                    sc[t] = s / sqrtf((float)hs);
                    mx = fmaxf(mx, sc[t]);
                }
                for (int t = 0; t <= pos; t++) {
                    sc[t] = expf(sc[t] - mx);
                    sum += sc[t];
                }
                for (int i = 0; i < hs; i++) {
                    float a = 0.0f;

                    for (int t = 0; t <= pos; t++)
                        a += sc[t] / sum *
                             vc[(size_t)t * R->kvd + kh * hs + i];
                    att[h * hs + i] = a;
                }
            }
            matvec(part[r], R->wo[l], att, R->qd, dim, NULL);
        }
        for (int r = 0; r < S->tp; r++) /* the all-reduce, rank order */
            for (int i = 0; i < dim; i++)
                x[i] += part[r][i];
        rmsnorm(xn, x, S->ffn_norm[l], dim, c->rms_eps);
        for (int r = 0; r < S->tp; r++) {
            rank_w_t *R = &S->r[r];
            int nh = R->sh.n_hidden;

            matvec(g, R->wg[l], xn, dim, nh, NULL);
            matvec(u, R->wu[l], xn, dim, nh, NULL);
            for (int i = 0; i < nh; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            matvec(part[r], R->wd[l], g, nh, dim, NULL);
        }
        for (int r = 0; r < S->tp; r++)
            for (int i = 0; i < dim; i++)
                x[i] += part[r][i];
    }
    rmsnorm(xn, x, S->final_norm, dim, c->rms_eps);
    for (int r = 0; r < S->tp; r++) {
        rank_w_t *R = &S->r[r];

        matvec(logits + R->sh.vocab0, R->cls, xn, dim, R->sh.n_vocab, NULL);
    }
}

static int argmax(const float *v, int n)
{
    int best = 0;

    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Largest |a - b| of a row relative to the row's largest |b| (logits
 * are compared at the scale that decides sampling). */
static double max_rel(const float *a, const float *b, size_t n_rows,
                      size_t vocab)
{
    double worst = 0;

    for (size_t r = 0; r < n_rows; r++) {
        const float *ar = a + r * vocab, *br = b + r * vocab;
        double scale = 1.0, d = 0.0;

        for (size_t i = 0; i < vocab; i++)
            scale = fmax(scale, fabs((double)br[i]));
        for (size_t i = 0; i < vocab; i++)
            d = fmax(d, fabs((double)ar[i] - br[i]));
        worst = fmax(worst, d / scale);
    }
    return worst;
}

static void test_sharded_forward(const char *file, int lazy_synth)
{
    static const int prompt[] = { 1, 403, 407, 261, 378, 288, 259, 446,
                                  299, 325, 313, 270, 263, 341, 2, 99 };
    const int n = (int)(sizeof(prompt) / sizeof(prompt[0]));
    const int tps[] = { 1, 2, 4 };
    char path[512];
    model_t *m = NULL;
    const model_config_t *c;
    float *ref, *got;
    backend_t *be = NULL;
    backend_config_t bc;
    backend_seq_t seq;
    backend_batch_t batch;
    int blocks[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    size_t vocab;

    if (lazy_synth) {
        snprintf(path, sizeof(path), "%s", file);
        BT_ASSERT_OK(model_load_ex(path, MODEL_LOAD_SYNTH_LAZY, &m));
    } else {
        snprintf(path, sizeof(path), "%s/models/%s", BT_SHARED_DIR, file);
        BT_ASSERT_OK(model_load(path, &m));
    }
    c = model_config(m);
    vocab = (size_t)c->vocab_size;
    ref = calloc((size_t)n * vocab, sizeof(float));
    got = calloc((size_t)n * vocab, sizeof(float));

    /* tp = 1 through the same code is the reference */
    for (size_t k = 0; k < sizeof(tps) / sizeof(tps[0]); k++) {
        sharded_t S;
        double worst;

        if (model_shard_check(c, tps[k]) != BT_OK)
            continue;
        sharded_init(&S, m, tps[k]);
        for (int i = 0; i < n; i++)
            sharded_forward(&S, prompt[i], i,
                            (k == 0 ? ref : got) + (size_t)i * vocab);
        sharded_free(&S);
        if (k == 0)
            continue;
        worst = max_rel(got, ref, (size_t)n, vocab);
        for (int i = 0; i < n; i++)
            BT_ASSERT_EQ(argmax(got + i * vocab, (int)vocab),
                         argmax(ref + i * vocab, (int)vocab));
        if (worst > TOL)
            BT_TEST_FAIL("%s tp=%d: logits differ by %.3g (rel)", file,
                         tps[k], worst);
        fprintf(stderr, "PASS sharded forward %s tp=%d vs tp=1: max rel "
                "diff %.2e\n", file, tps[k], worst);
    }

    /* and the unsharded CPU backend (lazy synth models have no host
     * weights for it) */
    if (!lazy_synth) {
        backend_config_init(&bc);
        bc.n_kv_blocks = 8;
        bc.block_size = 16;
        bc.n_threads = 1;
        BT_ASSERT_OK(backend_create("cpu", m, &bc, &be));
        memset(&seq, 0, sizeof(seq));
        seq.n_tokens = n;
        seq.tokens = prompt;
        seq.block_table = blocks;
        seq.n_logits = n;
        memset(&batch, 0, sizeof(batch));
        batch.n_seqs = 1;
        batch.seqs = &seq;
        BT_ASSERT_OK(backend_forward(be, &batch, got, NULL));
        {
            double worst = max_rel(got, ref, (size_t)n, vocab);
            for (int i = 0; i < n; i++)
                BT_ASSERT_EQ(argmax(got + i * vocab, (int)vocab),
                             argmax(ref + i * vocab, (int)vocab));
            if (worst > TOL)
                BT_TEST_FAIL("%s: sharded tp=1 vs cpu backend %.3g", file,
                             worst);
            fprintf(stderr, "PASS sharded forward %s vs cpu backend: max "
                    "rel diff %.2e\n", file, worst);
        }
        backend_destroy(&be);
    }
    free(ref);
    free(got);
    model_destroy(&m);
}

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    test_validation();
    test_coverage();
    test_synth_generator("tiny", MODEL_SYNTH_DTYPE_DEFAULT);
    test_synth_generator("tiny-qwen2", MODEL_SYNTH_DTYPE_DEFAULT);
    test_synth_generator("tiny-gqa", MODEL_DTYPE_BF16);
    test_synth_generator("tiny", MODEL_DTYPE_F16);
    test_sharded_forward("aidreams260K.bin", 0);
    test_sharded_forward("stories260K.bin", 0);
    /* q/k/v biases, tied classifier, generated shard by shard */
    test_sharded_forward("synth:tiny-qwen2:3", 1);
    return 0;
}
