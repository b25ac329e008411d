/*
 * spec_train.c - self-distillation data and the hand-written forward /
 * backward / AdamW of the EAGLE draft head (see spec_train.h).
 *
 * Notation for one text (n = n_tok - 1 training rows, row t reads
 * (f[t], x[t+1]) at RoPE position t and predicts f[t+1]):
 *   X2 = [emb(x); f]          (n, 2d)
 *   H0 = X2 Wfc^T + b         (n, d)
 *   Q, K, V = H0 W{q,k,v}^T, RoPE on Q, K; causal softmax attention A
 *   H1 = H0 + Att Wo^T
 *   N  = rmsnorm(H1) * g;  S = silu(N Wg^T) * (N Wu^T)
 *   O  = H1 + S Wd^T          (n, d) the predicted features
 * Matrices follow the [out, in] convention: Y = X W^T, so
 * dX = dY W and dW += dY^T X.
 */
#include "spec_train.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cpu/cpu_int.h"
#include "spec_int.h"

#define SPEC_TRAIN_MAX_THREADS 64

void spec_train_config_init(spec_train_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_tokens = 32768;
    cfg->seq_len = 0;
    cfg->epochs = 8;
    cfg->batch_seqs = 8;
    cfg->lr = 1e-2f;
    cfg->weight_decay = 0.0f;
    cfg->w_feat = 1.0f;
    cfg->w_tok = 0.1f;
    cfg->noise = 0.1f;
    cfg->temperature = 1.0f;
    cfg->clip = 0.5f;
    cfg->seed = 1;
}

// ----------------------------------------------------------------------------
// data

struct spec_train_data_s {
    int n_texts;
    int *offsets;  /* (n_texts + 1) first token of each text */
    int *tokens;   /* (total) */
    float *feats;  /* (total, dim) target features */
    int dim;
    int total;
    int cap;
};

static bt_status_t data_append(spec_train_data_t *d, const int *tokens,
                               const float *feats, int n)
{
    if (d->total + n > d->cap) {
        int cap = BT_MAX(d->cap * 2, d->total + n);
        int *t = bt_realloc(d->tokens, sizeof(int) * (size_t)cap,
                            "spec_train_data");
        float *f;

        if (t == NULL)
            return BT_ERR_NO_MEMORY;
        d->tokens = t;
        f = bt_realloc(d->feats, sizeof(float) * (size_t)cap * d->dim,
                       "spec_train_data");
        if (f == NULL)
            return BT_ERR_NO_MEMORY;
        d->feats = f;
        d->cap = cap;
    }
    if ((d->n_texts + 2) % 64 == 0 || d->offsets == NULL) {
        int *o = bt_realloc(d->offsets, sizeof(int) *
                                            (size_t)(d->n_texts + 66),
                            "spec_train_data");
        if (o == NULL)
            return BT_ERR_NO_MEMORY;
        d->offsets = o;
    }
    memcpy(d->tokens + d->total, tokens, sizeof(int) * (size_t)n);
    memcpy(d->feats + (size_t)d->total * d->dim, feats,
           sizeof(float) * (size_t)n * d->dim);
    d->offsets[d->n_texts] = d->total;
    d->total += n;
    d->n_texts++;
    d->offsets[d->n_texts] = d->total;
    return BT_OK;
}

static bool data_is_stop(const model_config_t *c, int tok)
{
    if (tok == c->bos_id)
        return true;
    for (int i = 0; i < c->n_eos; i++)
        if (tok == c->eos_ids[i])
            return true;
    return false;
}

/* Features of one finished text: a fresh forward over all its tokens. */
static bt_status_t data_features(engine_t *engine, engine_seq_t *seq,
                                 int n, float *logits, float *hidden,
                                 const model_t *model)
{
    const model_config_t *c = model_config(model);
    const model_tensor_t *fn = model_final_norm(model);
    float *norm_w = bt_malloc(sizeof(float) * (size_t)c->dim, "spec_train");
    backend_seq_t bs;
    backend_batch_t batch;
    int nb;
    bt_status_t status;

    if (norm_w == NULL)
        return BT_ERR_NO_MEMORY;
    model_tensor_to_f32(fn, 0, c->dim, norm_w);
    status = engine_seq_reserve(engine, seq, n);
    if (status != BT_OK)
        goto out;
    memset(&bs, 0, sizeof(bs));
    bs.n_tokens = n;
    bs.ctx_len = 0;
    bs.tokens = engine_seq_tokens(seq);
    bs.block_table = engine_seq_blocks(seq, &nb);
    bs.n_logits = n;
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = 1;
    batch.seqs = &bs;
    status = backend_forward(engine_backend(engine), &batch, logits, hidden);
    if (status != BT_OK)
        goto out;
    for (int i = 0; i < n; i++)
        spec__rmsnorm(hidden + (size_t)i * c->dim,
                      hidden + (size_t)i * c->dim, norm_w, c->dim,
                      c->rms_eps);
out:
    bt_free(norm_w);
    return status;
}

bt_status_t spec_train_data_create(engine_t *engine,
                                   const spec_train_config_t *cfg,
                                   spec_train_data_t **data_p)
{
    const model_t *model = engine_model(engine);
    const model_config_t *c = model_config(model);
    const engine_config_t *ecfg = engine_config(engine);
    int seq_len = cfg->seq_len > 0 ? cfg->seq_len
                                   : BT_MIN(128, engine_max_context(engine));
    int batch = BT_MIN(32, ecfg->backend.max_seqs);
    int bos = c->bos_id >= 0 ? c->bos_id : 1;
    engine_seq_t **seqs = NULL;
    int *sampled = NULL, n_texts = 0;
    bool *done = NULL;
    float *logits = NULL, *hidden = NULL;
    spec_train_data_t *d;
    bt_status_t status = BT_OK;

    seq_len = BT_MIN(seq_len, engine_max_context(engine));
    if (seq_len < 3 || seq_len > ecfg->backend.max_batch_tokens)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC",
                        "training text length %d must be 3..%d", seq_len,
                        ecfg->backend.max_batch_tokens);
    d = bt_calloc(1, sizeof(*d), "spec_train_data");
    seqs = bt_calloc((size_t)batch, sizeof(*seqs), "spec_train");
    sampled = bt_calloc((size_t)batch, sizeof(int), "spec_train");
    done = bt_calloc((size_t)batch, sizeof(bool), "spec_train");
    logits = bt_malloc(sizeof(float) * (size_t)seq_len * c->vocab_size,
                       "spec_train");
    hidden = bt_malloc(sizeof(float) * (size_t)seq_len * c->dim,
                       "spec_train");
    if (d == NULL || seqs == NULL || sampled == NULL || done == NULL ||
        logits == NULL || hidden == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    d->dim = c->dim;

    while (d->total < cfg->n_tokens) {
        int live = 0;

        /* start a batch of texts from BOS */
        for (int i = 0; i < batch; i++) {
            sampler_params_t sp;

            sampler_params_init(&sp);
            sp.temperature = cfg->temperature;
            sp.seed = cfg->seed * 1000003ull + (uint64_t)n_texts++;
            status = engine_seq_create(engine, &bos, 1, &sp, &seqs[i]);
            if (status != BT_OK)
                goto out;
            done[i] = false;
        }
        live = batch;
        while (live > 0) {
            engine_seq_t *step[64];
            int map[64], n_step = 0;

            for (int i = 0; i < batch; i++)
                if (!done[i]) {
                    map[n_step] = i;
                    step[n_step++] = seqs[i];
                }
            status = engine_step(engine, step, n_step, 0, sampled);
            if (status != BT_OK)
                goto out;
            for (int b = 0; b < n_step; b++) {
                int i = map[b];
                engine_seq_t *s = seqs[i];
                int len = engine_seq_len(s);
                bool stop = sampled[b] >= 0 && data_is_stop(c, sampled[b]);

                if (!stop && len < seq_len)
                    continue;
                done[i] = true;
                live--;
                if (stop)
                    len--; /* the stop token is not part of the text */
                if (len >= 3 && d->total < cfg->n_tokens) {
                    status = data_features(engine, s, len, logits, hidden,
                                           model);
                    if (status != BT_OK)
                        goto out;
                    status = data_append(d, engine_seq_tokens(s), hidden,
                                         len);
                    if (status != BT_OK)
                        goto out;
                }
            }
        }
        for (int i = 0; i < batch; i++)
            engine_seq_destroy(engine, &seqs[i]);
    }
    BT_LOG_INFO("SPEC", "training data: %d texts, %d tokens", d->n_texts,
                d->total);
    *data_p = d;
    d = NULL;

out:
    if (seqs != NULL)
        for (int i = 0; i < batch; i++)
            engine_seq_destroy(engine, &seqs[i]);
    spec_train_data_destroy(&d);
    bt_free(seqs);
    bt_free(sampled);
    bt_free(done);
    bt_free(logits);
    bt_free(hidden);
    return status;
}

void spec_train_data_destroy(spec_train_data_t **data_p)
{
    spec_train_data_t *d = *data_p;

    if (d == NULL)
        return;
    bt_free(d->offsets);
    bt_free(d->tokens);
    bt_free(d->feats);
    bt_free(d);
    *data_p = NULL;
}

int spec_train_data_tokens(const spec_train_data_t *data)
{
    return data->total;
}

int spec_train_data_texts(const spec_train_data_t *data)
{
    return data->n_texts;
}

// ----------------------------------------------------------------------------
// forward + backward of one text

/* dX (n, in) [+]= dY (n, out) . W (out, in); wt: scratch (in * out). */
static void mm_dx(float *dx, const float *dy, const float *w, int n, int in,
                  int out, bool acc, float *wt)
{
    spec__transpose(wt, w, in, out);
    spec__matmul(dx, dy, wt, NULL, n, out, in, acc);
}

/* dW (out, in) += dY^T (out, n) . X (n, in); scratch yt (out * n), xt
 * (in * n). */
static void mm_dw(float *dw, const float *dy, const float *x, int n, int in,
                  int out, float *yt, float *xt)
{
    spec__transpose(yt, dy, out, n);
    spec__transpose(xt, x, in, n);
    spec__matmul(dw, yt, xt, NULL, out, n, in, true);
}

static void softmax_row(float *row, int n)
{
    float mx = -FLT_MAX, sum = 0.0f;

    for (int i = 0; i < n; i++)
        mx = BT_MAX(mx, row[i]);
    for (int i = 0; i < n; i++) {
        row[i] = expf(row[i] - mx);
        sum += row[i];
    }
    for (int i = 0; i < n; i++)
        row[i] /= sum;
}

static int argmax_row(const float *row, int n)
{
    int b = 0;

    for (int i = 1; i < n; i++)
        if (row[i] > row[b])
            b = i;
    return b;
}

bt_status_t spec_train_loss(spec_head_t *head, const int *tokens,
                            const float *feats, int n_tok,
                            const float *noise, float w_feat, float w_tok,
                            float *grad, double *loss_p, int *top1_p)
{
    const model_config_t *c = spec_head_config(head);
    const spec_head_weights_t *w = spec_head_weights(head);
    const float *emb = spec_head_embedding(head);
    const float *cls = spec_head_classifier(head);
    const float *inv_freq = spec_head_inv_freq(head);
    size_t n_params;
    float *params = spec_head_params(head, &n_params);
    int n = n_tok - 1, d = c->dim, hd = c->head_dim, H = c->n_heads;
    int qd = H * hd, kvd = c->n_kv_heads * hd, hid = spec_head_hidden_dim(head);
    int V = c->vocab_size, group = H / c->n_kv_heads;
    int wide = BT_MAX(BT_MAX(2 * d, hid), BT_MAX(qd, V));
    float scale = 1.0f / sqrtf((float)hd);
    double loss_f = 0.0, loss_t = 0.0;
    int top1 = 0;
    float *buf, *p;
    float *X2, *H0, *Q, *K, *Vv, *A, *Att, *H1, *rstd, *Nn, *G, *U, *S, *O;
    float *Z, *T, *dO, *dS, *dG, *dU, *dN, *dH1, *dAtt, *dQ, *dK, *dV, *dH0;
    float *wt, *yt, *xt;
    size_t total;

    if (n < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC", "text of %d tokens",
                        n_tok);
    total = (size_t)n * (2 * d + d + qd + 2 * kvd + qd + d + 1 + d +
                         3 * hid + d + 2 * V + d + 3 * hid + d + d + qd +
                         qd + 2 * kvd + d) +
            (size_t)H * n * n + (size_t)wide * wide + 2 * (size_t)wide * n;
    buf = bt_malloc(total * sizeof(float), "spec_train_act");
    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    p = buf;
#define TAKE(_v, _count) do { _v = p; p += (_count); } while (0)
    TAKE(X2, (size_t)n * 2 * d);
    TAKE(H0, (size_t)n * d);
    TAKE(Q, (size_t)n * qd);
    TAKE(K, (size_t)n * kvd);
    TAKE(Vv, (size_t)n * kvd);
    TAKE(Att, (size_t)n * qd);
    TAKE(H1, (size_t)n * d);
    TAKE(rstd, (size_t)n);
    TAKE(Nn, (size_t)n * d);
    TAKE(G, (size_t)n * hid);
    TAKE(U, (size_t)n * hid);
    TAKE(S, (size_t)n * hid);
    TAKE(O, (size_t)n * d);
    TAKE(Z, (size_t)n * V);
    TAKE(T, (size_t)n * V);
    TAKE(dO, (size_t)n * d);
    TAKE(dS, (size_t)n * hid);
    TAKE(dG, (size_t)n * hid);
    TAKE(dU, (size_t)n * hid);
    TAKE(dN, (size_t)n * d);
    TAKE(dH1, (size_t)n * d);
    TAKE(dAtt, (size_t)n * qd);
    TAKE(dQ, (size_t)n * qd);
    TAKE(dK, (size_t)n * kvd);
    TAKE(dV, (size_t)n * kvd);
    TAKE(dH0, (size_t)n * d);
    TAKE(A, (size_t)H * n * n);
    TAKE(wt, (size_t)wide * wide);
    TAKE(yt, (size_t)wide * n);
    TAKE(xt, (size_t)wide * n);
#undef TAKE

    // ---- forward
    for (int t = 0; t < n; t++) {
        memcpy(X2 + (size_t)t * 2 * d, emb + (size_t)tokens[t + 1] * d,
               sizeof(float) * d);
        for (int j = 0; j < d; j++)
            X2[(size_t)t * 2 * d + d + j] =
                feats[(size_t)t * d + j] +
                (noise != NULL ? noise[(size_t)t * d + j] : 0.0f);
    }
    spec__matmul(H0, X2, w->fc_w, w->fc_b, n, 2 * d, d, false);
    spec__matmul(Q, H0, w->wq, NULL, n, d, qd, false);
    spec__matmul(K, H0, w->wk, NULL, n, d, kvd, false);
    spec__matmul(Vv, H0, w->wv, NULL, n, d, kvd, false);
    for (int t = 0; t < n; t++) {
        spec__rope(Q + (size_t)t * qd, H, hd, inv_freq, t, 1.0f);
        spec__rope(K + (size_t)t * kvd, c->n_kv_heads, hd, inv_freq, t,
                   1.0f);
    }
    memset(Att, 0, sizeof(float) * (size_t)n * qd);
    for (int h = 0; h < H; h++) {
        int kh = h / group;

        for (int i = 0; i < n; i++) {
            float *a = A + ((size_t)h * n + i) * n;
            const float *q = Q + (size_t)i * qd + (size_t)h * hd;
            float *o = Att + (size_t)i * qd + (size_t)h * hd;

            for (int j = 0; j <= i; j++) {
                const float *k = K + (size_t)j * kvd + (size_t)kh * hd;
                float s = 0.0f;

                for (int e = 0; e < hd; e++)
                    s += q[e] * k[e];
                a[j] = s * scale;
            }
            softmax_row(a, i + 1);
            for (int j = 0; j <= i; j++) {
                const float *v = Vv + (size_t)j * kvd + (size_t)kh * hd;

                for (int e = 0; e < hd; e++)
                    o[e] += a[j] * v[e];
            }
        }
    }
    memcpy(H1, H0, sizeof(float) * (size_t)n * d);
    spec__matmul(H1, Att, w->wo, NULL, n, qd, d, true);
    for (int t = 0; t < n; t++) {
        const float *x = H1 + (size_t)t * d;
        double ss = 0.0;

        for (int j = 0; j < d; j++)
            ss += (double)x[j] * x[j];
        rstd[t] = 1.0f / sqrtf((float)(ss / d) + c->rms_eps);
        for (int j = 0; j < d; j++)
            Nn[(size_t)t * d + j] = x[j] * rstd[t] * w->post_norm[j];
    }
    spec__matmul(G, Nn, w->w_gate, NULL, n, d, hid, false);
    spec__matmul(U, Nn, w->w_up, NULL, n, d, hid, false);
    for (size_t j = 0; j < (size_t)n * hid; j++)
        S[j] = spec__silu(G[j]) * U[j];
    memcpy(O, H1, sizeof(float) * (size_t)n * d);
    spec__matmul(O, S, w->w_down, NULL, n, hid, d, true);

    // ---- losses and dO
    spec__matmul(Z, O, cls, NULL, n, d, V, false);
    spec__matmul(T, feats + d, cls, NULL, n, d, V, false);
    for (int t = 0; t < n; t++) {
        float *z = Z + (size_t)t * V, *tp = T + (size_t)t * V;
        double ce = 0.0;

        top1 += argmax_row(z, V) == argmax_row(tp, V);
        softmax_row(tp, V);
        softmax_row(z, V);
        for (int v = 0; v < V; v++)
            if (tp[v] > 0.0f)
                ce -= (double)tp[v] * log((double)BT_MAX(z[v], 1e-30f));
        loss_t += ce;
        for (int v = 0; v < V; v++) /* dZ, stored in z */
            z[v] = (z[v] - tp[v]) * w_tok / (float)n;
        for (int j = 0; j < d; j++) {
            float e = O[(size_t)t * d + j] - feats[(size_t)(t + 1) * d + j];
            float ae = fabsf(e);

            loss_f += ae < 1.0f ? 0.5 * (double)e * e : (double)ae - 0.5;
            dO[(size_t)t * d + j] = (ae < 1.0f ? e : (e > 0 ? 1.0f : -1.0f)) *
                                    w_feat / (float)((size_t)n * d);
        }
    }
    loss_f /= (double)n * d;
    loss_t /= n;
    *loss_p = w_feat * loss_f + w_tok * loss_t;
    if (top1_p != NULL)
        *top1_p = top1;
    if (grad == NULL) {
        bt_free(buf);
        return BT_OK;
    }

    // ---- backward
#define G_OF(_ptr) (grad + ((_ptr) - params))
    mm_dx(dO, Z, cls, n, d, V, true, wt);      /* token CE into dO */
    /* feed-forward block */
    memcpy(dH1, dO, sizeof(float) * (size_t)n * d);
    mm_dx(dS, dO, w->w_down, n, hid, d, false, wt);
    mm_dw(G_OF(w->w_down), dO, S, n, hid, d, yt, xt);
    for (size_t j = 0; j < (size_t)n * hid; j++) {
        float sg = 1.0f / (1.0f + expf(-G[j]));
        float silu = G[j] * sg;

        dU[j] = dS[j] * silu;
        dG[j] = dS[j] * U[j] * sg * (1.0f + G[j] * (1.0f - sg));
    }
    mm_dw(G_OF(w->w_gate), dG, Nn, n, d, hid, yt, xt);
    mm_dw(G_OF(w->w_up), dU, Nn, n, d, hid, yt, xt);
    mm_dx(dN, dG, w->w_gate, n, d, hid, false, wt);
    mm_dx(dN, dU, w->w_up, n, d, hid, true, wt);
    for (int t = 0; t < n; t++) { /* rmsnorm */
        const float *x = H1 + (size_t)t * d;
        const float *dy = dN + (size_t)t * d;
        float r = rstd[t];
        double dot = 0.0;
        float *gn = G_OF(w->post_norm);

        for (int j = 0; j < d; j++) {
            gn[j] += dy[j] * x[j] * r;
            dot += (double)dy[j] * w->post_norm[j] * x[j];
        }
        for (int j = 0; j < d; j++)
            dH1[(size_t)t * d + j] += r * w->post_norm[j] * dy[j] -
                                      x[j] * r * r * r * (float)(dot / d);
    }
    /* attention block */
    memcpy(dH0, dH1, sizeof(float) * (size_t)n * d);
    mm_dx(dAtt, dH1, w->wo, n, qd, d, false, wt);
    mm_dw(G_OF(w->wo), dH1, Att, n, qd, d, yt, xt);
    memset(dQ, 0, sizeof(float) * (size_t)n * qd);
    memset(dK, 0, sizeof(float) * (size_t)n * kvd);
    memset(dV, 0, sizeof(float) * (size_t)n * kvd);
    for (int h = 0; h < H; h++) {
        int kh = h / group;

        for (int i = 0; i < n; i++) {
            const float *a = A + ((size_t)h * n + i) * n;
            const float *da = dAtt + (size_t)i * qd + (size_t)h * hd;
            const float *q = Q + (size_t)i * qd + (size_t)h * hd;
            float *dq = dQ + (size_t)i * qd + (size_t)h * hd;
            float ds[4096], sum = 0.0f;

            BT_ASSERT(i < 4096);
            for (int j = 0; j <= i; j++) {
                const float *v = Vv + (size_t)j * kvd + (size_t)kh * hd;
                float *dv = dV + (size_t)j * kvd + (size_t)kh * hd;
                float g = 0.0f;

                for (int e = 0; e < hd; e++) {
                    g += da[e] * v[e];
                    dv[e] += a[j] * da[e];
                }
                ds[j] = g;
                sum += a[j] * g;
            }
            for (int j = 0; j <= i; j++) {
                const float *k = K + (size_t)j * kvd + (size_t)kh * hd;
                float *dk = dK + (size_t)j * kvd + (size_t)kh * hd;
                float g = a[j] * (ds[j] - sum) * scale;

                for (int e = 0; e < hd; e++) {
                    dq[e] += g * k[e];
                    dk[e] += g * q[e];
                }
            }
        }
    }
    for (int t = 0; t < n; t++) { /* undo RoPE */
        spec__rope(dQ + (size_t)t * qd, H, hd, inv_freq, t, -1.0f);
        spec__rope(dK + (size_t)t * kvd, c->n_kv_heads, hd, inv_freq, t,
                   -1.0f);
    }
    mm_dx(dH0, dQ, w->wq, n, d, qd, true, wt);
    mm_dx(dH0, dK, w->wk, n, d, kvd, true, wt);
    mm_dx(dH0, dV, w->wv, n, d, kvd, true, wt);
    mm_dw(G_OF(w->wq), dQ, H0, n, d, qd, yt, xt);
    mm_dw(G_OF(w->wk), dK, H0, n, d, kvd, yt, xt);
    mm_dw(G_OF(w->wv), dV, H0, n, d, kvd, yt, xt);
    /* fusion layer */
    mm_dw(G_OF(w->fc_w), dH0, X2, n, 2 * d, d, yt, xt);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            G_OF(w->fc_b)[j] += dH0[(size_t)t * d + j];
#undef G_OF
    (void)n_params;
    bt_free(buf);
    return BT_OK;
}

// ----------------------------------------------------------------------------
// AdamW loop

/* One optimizer batch split over the pool: thread ith takes texts
 * ith, ith + nth, ... and sums into its own gradient buffer. */
typedef struct {
    spec_head_t *head;
    const spec_train_data_t *data;
    const spec_train_config_t *cfg;
    const int *ids;          /* (n_ids) texts of this batch */
    int n_ids;
    uint64_t salt;           /* noise stream: per step */
    float **grads;           /* (nth) each (n_params) */
    float **noise;           /* (nth) each (max_len, dim) */
    double *loss;            /* (nth) sum of loss * rows */
    long *rows;              /* (nth) */
    long *top1;              /* (nth) */
    bt_status_t *status;     /* (nth) */
} train_job_t;

static void train_task(void *arg, int ith, int nth)
{
    train_job_t *j = arg;
    int dim = spec_head_config(j->head)->dim;
    size_t np;

    (void)spec_head_params(j->head, &np);
    memset(j->grads[ith], 0, np * sizeof(float));
    j->loss[ith] = 0.0;
    j->rows[ith] = 0;
    j->top1[ith] = 0;
    j->status[ith] = BT_OK;
    for (int k = ith; k < j->n_ids; k += nth) {
        int id = j->ids[k];
        int off = j->data->offsets[id];
        int len = j->data->offsets[id + 1] - off;
        uint64_t rng = (j->salt ^ ((uint64_t)id * 0x9e3779b97f4a7c15ull)) |
                       1;
        double loss;
        int top1;
        bt_status_t status;

        for (size_t e = 0; e < (size_t)(len - 1) * dim; e++)
            j->noise[ith][e] = (2.0f * spec__rng_uniform(&rng) - 1.0f) *
                               j->cfg->noise;
        status = spec_train_loss(j->head, j->data->tokens + off,
                                 j->data->feats + (size_t)off * dim, len,
                                 j->cfg->noise > 0 ? j->noise[ith] : NULL,
                                 j->cfg->w_feat, j->cfg->w_tok,
                                 j->grads[ith], &loss, &top1);
        if (status != BT_OK) {
            j->status[ith] = status;
            return;
        }
        j->loss[ith] += loss * (len - 1);
        j->rows[ith] += len - 1;
        j->top1[ith] += top1;
    }
}

bt_status_t spec_train(spec_head_t *head, const spec_train_data_t *data,
                       const spec_train_config_t *cfg,
                       spec_train_report_t *rep)
{
    size_t np;
    float *params = spec_head_params(head, &np);
    int dim = spec_head_config(head)->dim;
    int n_texts = data->n_texts;
    int bsz = BT_MAX(1, cfg->batch_seqs);
    int steps_per_epoch = BT_DIV_UP(n_texts, bsz);
    int total_steps = steps_per_epoch * cfg->epochs, step = 0;
    int max_len = 0;
    float *grad = NULL, *m = NULL, *v = NULL;
    float *grads[SPEC_TRAIN_MAX_THREADS] = { NULL };
    float *noises[SPEC_TRAIN_MAX_THREADS] = { NULL };
    double tl[SPEC_TRAIN_MAX_THREADS];
    long tr[SPEC_TRAIN_MAX_THREADS], tt[SPEC_TRAIN_MAX_THREADS];
    bt_status_t st[SPEC_TRAIN_MAX_THREADS];
    cpu_pool_t *pool = NULL;
    train_job_t job;
    int nth;
    int *order = NULL;
    uint64_t rng = cfg->seed * 0x9e3779b97f4a7c15ull + 99;
    uint64_t t0 = bt_time_ns();
    spec_train_report_t r;
    bt_status_t status = BT_OK;

    memset(&r, 0, sizeof(r));
    if (n_texts == 0 || cfg->epochs < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "SPEC", "nothing to train on");
    for (int i = 0; i < n_texts; i++)
        max_len = BT_MAX(max_len, data->offsets[i + 1] - data->offsets[i]);
    status = cpu__pool_create(cfg->n_threads, &pool);
    if (status != BT_OK)
        return status;
    nth = BT_MIN(BT_MIN(cpu__pool_size(pool), SPEC_TRAIN_MAX_THREADS), bsz);
    grad = bt_malloc(np * sizeof(float), "spec_train");
    m = bt_calloc(np, sizeof(float), "spec_train");
    v = bt_calloc(np, sizeof(float), "spec_train");
    order = bt_malloc(sizeof(int) * (size_t)n_texts, "spec_train");
    if (grad == NULL || m == NULL || v == NULL || order == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int t = 0; t < nth; t++) {
        grads[t] = bt_malloc(np * sizeof(float), "spec_train");
        noises[t] = bt_malloc(sizeof(float) * (size_t)max_len * dim,
                              "spec_train");
        if (grads[t] == NULL || noises[t] == NULL) {
            status = BT_ERR_NO_MEMORY;
            goto out;
        }
    }
    job = (train_job_t){ head, data, cfg, NULL, 0, 0, grads, noises, tl,
                         tr, tt, st };
    for (int i = 0; i < n_texts; i++)
        order[i] = i;

    for (int ep = 0; ep < cfg->epochs; ep++) {
        double ep_loss = 0.0;
        long ep_rows = 0, ep_top1 = 0;

        for (int i = n_texts - 1; i > 0; i--) { /* shuffle */
            int j = (int)(spec__rng_next(&rng) % (uint64_t)(i + 1));
            int tmp = order[i];

            order[i] = order[j];
            order[j] = tmp;
        }
        for (int b0 = 0; b0 < n_texts; b0 += bsz) {
            int nb = BT_MIN(bsz, n_texts - b0);
            double norm = 0.0;
            float lr, clip_scale = 1.0f;
            float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
            float bc1, bc2;

            job.ids = order + b0;
            job.n_ids = nb;
            job.salt = cfg->seed * 0x2545f4914f6cdd1dull +
                       (uint64_t)step * 0x9e3779b97f4a7c15ull;
            cpu__pool_run(pool, nth, train_task, &job);
            memset(grad, 0, np * sizeof(float));
            for (int t = 0; t < nth; t++) {
                if (st[t] != BT_OK) {
                    status = st[t];
                    goto out;
                }
                for (size_t j = 0; j < np; j++)
                    grad[j] += grads[t][j];
                ep_loss += tl[t];
                ep_rows += tr[t];
                ep_top1 += tt[t];
            }
            for (size_t j = 0; j < np; j++) {
                grad[j] /= (float)nb;
                norm += (double)grad[j] * grad[j];
            }
            norm = sqrt(norm);
            if (cfg->clip > 0 && norm > cfg->clip)
                clip_scale = cfg->clip / (float)norm;
            /* linear warm-up over 5% of steps, then linear decay to 10% */
            step++;
            {
                int warm = BT_MAX(1, total_steps / 20);
                float frac = step <= warm
                    ? (float)step / warm
                    : 1.0f - 0.9f * (float)(step - warm) /
                                 (float)BT_MAX(1, total_steps - warm);
                lr = cfg->lr * frac;
            }
            bc1 = 1.0f - powf(b1, (float)step);
            bc2 = 1.0f - powf(b2, (float)step);
            for (size_t j = 0; j < np; j++) {
                float g = grad[j] * clip_scale;

                m[j] = b1 * m[j] + (1.0f - b1) * g;
                v[j] = b2 * v[j] + (1.0f - b2) * g * g;
                params[j] -= lr * ((m[j] / bc1) / (sqrtf(v[j] / bc2) + eps) +
                                   cfg->weight_decay * params[j]);
            }
        }
        ep_loss /= (double)BT_MAX(1, ep_rows);
        if (ep == 0)
            r.first_loss = ep_loss;
        r.last_loss = ep_loss;
        r.last_top1 = (double)ep_top1 / (double)BT_MAX(1, ep_rows);
        if (cfg->verbose)
            BT_LOG_INFO("SPEC", "epoch:%d loss:%.5f top1:%.3f s:%.1f", ep + 1,
                        ep_loss, r.last_top1,
                        (double)(bt_time_ns() - t0) * 1e-9);
    }
    r.seconds = (double)(bt_time_ns() - t0) * 1e-9;
    if (rep != NULL)
        *rep = r;

out:
    bt_free(grad);
    bt_free(m);
    bt_free(v);
    for (int t = 0; t < SPEC_TRAIN_MAX_THREADS; t++) {
        bt_free(grads[t]);
        bt_free(noises[t]);
    }
    bt_free(order);
    cpu__pool_destroy(&pool);
    return status;
}
