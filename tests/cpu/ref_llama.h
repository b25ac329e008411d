/*
 * ref_llama.h - an independent, naive single-sequence float32 Llama
 * forward pass for tests, written after llama2.c's run.c: contiguous KV
 * cache (layer, pos, kv_dim), one token per call, scalar loops in the
 * obvious order.  Supports both RoPE layouts, GQA and q/k/v biases (no
 * rope scaling).  Weights are converted with model_tensor_to_f32 from the
 * model's own views; nothing here is shared with worker/cpu/.
 */
#ifndef BT_TESTS_CPU_REF_LLAMA_H
#define BT_TESTS_CPU_REF_LLAMA_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct {
    model_config_t c;
    float *emb, *final_norm, *cls;      /* (vocab, dim), (dim), (vocab, dim) */
    float **attn_norm, **ffn_norm;      /* (L)(dim) */
    float **wq, **wk, **wv, **wo;       /* (L)(out, in) */
    float **bq, **bk, **bv;             /* (L)(out) or NULL */
    float **w1, **w2, **w3;             /* (L) gate, down, up */
    float *key_cache, *value_cache;     /* (L, max_seq, kv_dim) */
    float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits;
    int max_seq;
} ref_llama_t;

static float *ref_conv(const model_tensor_t *t)
{
    float *out;

    if (t->data == NULL)
        return NULL;
    out = malloc((size_t)(t->rows * t->cols) * sizeof(float));
    model_tensor_to_f32(t, 0, t->rows * t->cols, out);
    return out;
}

static float **ref_layers(int n)
{
    return calloc((size_t)n, sizeof(float *));
}

static void ref_llama_init(ref_llama_t *r, const model_t *m, int max_seq)
{
    const model_config_t *c = model_config(m);
    int L = c->n_layers, kv_dim = c->n_kv_heads * c->head_dim;
    int q_dim = c->n_heads * c->head_dim;

    memset(r, 0, sizeof(*r));
    r->c = *c;
    r->max_seq = max_seq;
    r->emb = ref_conv(model_tok_embedding(m));
    r->final_norm = ref_conv(model_final_norm(m));
    r->cls = ref_conv(model_classifier(m));
    r->attn_norm = ref_layers(L); r->ffn_norm = ref_layers(L);
    r->wq = ref_layers(L); r->wk = ref_layers(L); r->wv = ref_layers(L);
    r->wo = ref_layers(L); r->bq = ref_layers(L); r->bk = ref_layers(L);
    r->bv = ref_layers(L); r->w1 = ref_layers(L); r->w2 = ref_layers(L);
    r->w3 = ref_layers(L);
    for (int l = 0; l < L; l++) {
        const model_layer_t *ml = model_layer(m, l);

        r->attn_norm[l] = ref_conv(&ml->attn_norm);
        r->ffn_norm[l] = ref_conv(&ml->ffn_norm);
        r->wq[l] = ref_conv(&ml->wq);
        r->wk[l] = ref_conv(&ml->wk);
        r->wv[l] = ref_conv(&ml->wv);
        r->wo[l] = ref_conv(&ml->wo);
        r->bq[l] = ref_conv(&ml->bq);
        r->bk[l] = ref_conv(&ml->bk);
        r->bv[l] = ref_conv(&ml->bv);
        r->w1[l] = ref_conv(&ml->w_gate);
        r->w2[l] = ref_conv(&ml->w_down);
        r->w3[l] = ref_conv(&ml->w_up);
    }
    r->key_cache = calloc((size_t)L * max_seq * kv_dim, sizeof(float));
    r->value_cache = calloc((size_t)L * max_seq * kv_dim, sizeof(float));
    r->x = calloc((size_t)c->dim, sizeof(float));
    r->xb = calloc((size_t)(c->dim > q_dim ? c->dim : q_dim), sizeof(float));
    r->xb2 = calloc((size_t)c->dim, sizeof(float));
    r->hb = calloc((size_t)c->hidden_dim, sizeof(float));
    r->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
    r->q = calloc((size_t)q_dim, sizeof(float));
    r->k = calloc((size_t)kv_dim, sizeof(float));
    r->v = calloc((size_t)kv_dim, sizeof(float));
    r->att = calloc((size_t)c->n_heads * max_seq, sizeof(float));
    r->logits = calloc((size_t)c->vocab_size, sizeof(float));
}

static void ref_llama_free(ref_llama_t *r)
{
    int L = r->c.n_layers;
    float **lists[] = { r->attn_norm, r->ffn_norm, r->wq, r->wk, r->wv,
                        r->wo, r->bq, r->bk, r->bv, r->w1, r->w2, r->w3 };

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        for (int l = 0; l < L; l++)
            free(lists[i][l]);
        free(lists[i]);
    }
    if (r->cls != r->emb)
        free(r->cls);
    free(r->emb); free(r->final_norm);
    free(r->key_cache); free(r->value_cache);
    free(r->x); free(r->xb); free(r->xb2); free(r->hb); free(r->hb2);
    free(r->q); free(r->k); free(r->v); free(r->att); free(r->logits);
}

static void ref_rmsnorm(float *o, const float *x, const float *w, int n,
                        float eps)
{
    float ss = 0.0f;

    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

static void ref_matmul(float *xout, const float *x, const float *w, int n,
                       int d)
{
    for (int i = 0; i < d; i++) {
        float val = 0.0f;

        for (int j = 0; j < n; j++)
            val += w[i * n + j] * x[j];
        xout[i] = val;
    }
}

static void ref_softmax(float *x, int size)
{
    float max_val = x[0], sum = 0.0f;

    for (int i = 1; i < size; i++)
        if (x[i] > max_val)
            max_val = x[i];
    for (int i = 0; i < size; i++) {
        x[i] = expf(x[i] - max_val);
        sum += x[i];
    }
    for (int i = 0; i < size; i++)
        x[i] /= sum;
}

static void ref_rope(float *vec, int n, int hs, int pos, float theta,
                     model_rope_layout_t layout)
{
    for (int h = 0; h < n / hs; h++) {
        float *v = vec + h * hs;

        for (int i = 0; i < hs / 2; i++) {
            float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
            float val = pos * freq;
            float fcr = cosf(val), fci = sinf(val);
            int a = layout == MODEL_ROPE_ADJACENT ? 2 * i : i;
            int b = layout == MODEL_ROPE_ADJACENT ? 2 * i + 1 : i + hs / 2;
            float v0 = v[a], v1 = v[b];

            v[a] = v0 * fcr - v1 * fci;
            v[b] = v0 * fci + v1 * fcr;
        }
    }
}

/* Runs token at pos (all earlier positions must have been run); returns
 * the logits (vocab); *hidden_out, when not NULL, receives the residual
 * stream before the final norm (dim). */
static float *ref_llama_forward(ref_llama_t *r, int token, int pos,
                                float *hidden_out)
{
    const model_config_t *c = &r->c;
    int dim = c->dim, hs = c->head_dim, kv_dim = c->n_kv_heads * hs;
    int q_dim = c->n_heads * hs, kv_mul = c->n_heads / c->n_kv_heads;

    memcpy(r->x, r->emb + (size_t)token * dim, dim * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        float *kc = r->key_cache + ((size_t)l * r->max_seq + pos) * kv_dim;
        float *vc = r->value_cache + ((size_t)l * r->max_seq + pos) * kv_dim;

        ref_rmsnorm(r->xb, r->x, r->attn_norm[l], dim, c->rms_eps);
        ref_matmul(r->q, r->xb, r->wq[l], dim, q_dim);
        ref_matmul(r->k, r->xb, r->wk[l], dim, kv_dim);
        ref_matmul(r->v, r->xb, r->wv[l], dim, kv_dim);
        for (int i = 0; r->bq[l] && i < q_dim; i++)
            r->q[i] += r->bq[l][i];
        for (int i = 0; r->bk[l] && i < kv_dim; i++)
            r->k[i] += r->bk[l][i];
        for (int i = 0; r->bv[l] && i < kv_dim; i++)
            r->v[i] += r->bv[l][i];
        ref_rope(r->q, q_dim, hs, pos, c->rope_theta, c->rope_layout);
        ref_rope(r->k, kv_dim, hs, pos, c->rope_theta, c->rope_layout);
        memcpy(kc, r->k, kv_dim * sizeof(float));
        memcpy(vc, r->v, kv_dim * sizeof(float));
        for (int h = 0; h < c->n_heads; h++) {
            float *q = r->q + h * hs, *att = r->att + h * r->max_seq;
            float *xb = r->xb + h * hs;

            for (int t = 0; t <= pos; t++) {
                const float *k = r->key_cache +
                    ((size_t)l * r->max_seq + t) * kv_dim + (h / kv_mul) * hs;
                float score = 0.0f;

                for (int i = 0; i < hs; i++)
                    score += q[i] * k[i];
                att[t] = score / sqrtf((float)hs);
            }
            ref_softmax(att, pos + 1);
            memset(xb, 0, hs * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *v = r->value_cache +
                    ((size_t)l * r->max_seq + t) * kv_dim + (h / kv_mul) * hs;

                for (int i = 0; i < hs; i++)
                    xb[i] += att[t] * v[i];
            }
        }
        ref_matmul(r->xb2, r->xb, r->wo[l], q_dim, dim);
        for (int i = 0; i < dim; i++)
            r->x[i] += r->xb2[i];
        ref_rmsnorm(r->xb, r->x, r->ffn_norm[l], dim, c->rms_eps);
        ref_matmul(r->hb, r->xb, r->w1[l], dim, c->hidden_dim);
        ref_matmul(r->hb2, r->xb, r->w3[l], dim, c->hidden_dim);
        for (int i = 0; i < c->hidden_dim; i++) {
            float val = r->hb[i];

            val *= (1.0f / (1.0f + expf(-val)));
            r->hb[i] = val * r->hb2[i];
        }
        ref_matmul(r->xb, r->hb, r->w2[l], c->hidden_dim, dim);
        for (int i = 0; i < dim; i++)
            r->x[i] += r->xb[i];
    }
    if (hidden_out != NULL)
        memcpy(hidden_out, r->x, dim * sizeof(float));
    ref_rmsnorm(r->x, r->x, r->final_norm, dim, c->rms_eps);
    ref_matmul(r->logits, r->x, r->cls, dim, c->vocab_size);
    return r->logits;
}

#endif /* BT_TESTS_CPU_REF_LLAMA_H */
