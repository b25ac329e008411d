/*
 * test_quantize_fp8.c - `baton model quantize --fp8` end to end, and the
 * FP8 accuracy of the cpu reference (docs/PERFORMANCE.md, "FP8 accuracy"):
 *   1. the real binary quantizes aidreams260K.bin (llama2.c) per channel
 *      and per tensor, calibrated on ../shared/docs/STYLE.md with KV scales,
 *      its KV scales alone (--kv-only), and stories260K-hf (a Hugging Face
 *      dir) without calibration;
 *   2. each checkpoint loads as compressed-tensors FP8 (scheme, strategy,
 *      static/dynamic, KV scales) and its dequantized weights are within
 *      E4M3 rounding of the original's; the KV-only one loads dense, its
 *      weights the original's bf16 and its KV scales the channel one's;
 *   3. `baton run --precision fp8 --kv-dtype fp8` generates from it;
 *   4. accuracy against bf16: teacher-forced top-1 over the golden
 *      positions, and perplexity of the held text ../shared/docs/DESIGN.md
 *      (not the calibration text) in windows of the model's context,
 *      for every variant, printed as the table PERFORMANCE.md carries and
 *      held at the measured levels with a small margin (the tiny models
 *      cannot reach 97% top-1: see PERFORMANCE.md for why).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_golden.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/model.h"
#include "model/tokenizer.h"

#define N_BLOCKS 64

static char g_tmp[256];

static void run_ok(const char *cmd)
{
    int rc = system(cmd);

    if (rc != 0)
        BT_TEST_FAIL("command failed (%d): %s", rc, cmd);
}

/* Mean negative log-likelihood (nats/token) of ids in windows of `ctx`
 * tokens (each window BOS + ctx - 1 text tokens, teacher-forced). */
static double mean_nll(backend_t *be, int vocab, const int *ids, int n,
                       int ctx)
{
    int *win = malloc(sizeof(int) * (size_t)ctx);
    int *table = malloc(sizeof(int) * N_BLOCKS);
    float *logits = malloc(sizeof(float) * (size_t)vocab * ctx);
    double nll = 0.0;
    long count = 0;

    BT_CHECK(win && table && logits);
    for (int i = 0; i < N_BLOCKS; i++)
        table[i] = bt_golden_block(i, N_BLOCKS);
    for (int s = 0; s + 1 < n; s += ctx - 1) {
        int w = 1;
        backend_seq_t seq;
        backend_batch_t batch;

        win[0] = 1;
        while (w < ctx && s + w - 1 < n)
            win[w] = ids[s + w - 1], w++;
        seq = (backend_seq_t){ .n_tokens = w, .ctx_len = 0, .tokens = win,
                               .block_table = table, .n_logits = w };
        batch = (backend_batch_t){ .n_seqs = 1, .seqs = &seq };
        BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
        for (int i = 0; i + 1 < w; i++) {
            const float *lg = logits + (size_t)i * vocab;
            double mx = lg[0], sum = 0.0;

            for (int v = 1; v < vocab; v++)
                mx = fmax(mx, lg[v]);
            for (int v = 0; v < vocab; v++)
                sum += exp(lg[v] - mx);
            nll += -(lg[win[i + 1]] - mx - log(sum));
            count++;
        }
    }
    free(win);
    free(table);
    free(logits);
    return nll / (double)count;
}

typedef struct {
    const char *label;
    const char *model;          /* path */
    backend_precision_t prec;
    backend_kv_dtype_t kv;
} variant_t;

typedef struct {
    double top1;                /* % agreement with bf16 */
    double ppl;                 /* held-text perplexity (aidreams only) */
    double gppl;                /* perplexity of the golden continuations */
} result_t;

/* Summed negative log-likelihood of ids[i + 1] under the logits of
 * position i, for i in [from, n - 1), teacher-forced in one prompt. */
static double seq_nll(backend_t *be, int vocab, const int *ids, int n,
                      int from, long *count_p)
{
    int *table = malloc(sizeof(int) * N_BLOCKS);
    float *logits = malloc(sizeof(float) * (size_t)vocab * n);
    backend_seq_t seq = { .n_tokens = n, .ctx_len = 0, .tokens = ids,
                          .n_logits = n };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
    double nll = 0.0;

    BT_CHECK(table && logits);
    for (int i = 0; i < N_BLOCKS; i++)
        table[i] = bt_golden_block(i, N_BLOCKS);
    seq.block_table = table;
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    for (int i = from; i + 1 < n; i++) {
        const float *lg = logits + (size_t)i * vocab;
        double mx = lg[0], sum = 0.0;

        for (int v = 1; v < vocab; v++)
            mx = fmax(mx, lg[v]);
        for (int v = 0; v < vocab; v++)
            sum += exp(lg[v] - mx);
        nll += -(lg[ids[i + 1]] - mx - log(sum));
        (*count_p)++;
    }
    free(table);
    free(logits);
    return nll;
}

/* Teacher-forced argmax of every golden position of `model_name` lines
 * and, when ids != NULL, the perplexity of ids. */
static result_t evaluate(const variant_t *v, const char *golden_model,
                         const bt_golden_t *g, int lines, int **ref,
                         const int *ids, int n_ids)
{
    model_t *m = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    result_t r = { 0, 0, 0 };
    long same = 0, total = 0, g_count = 0;
    double g_nll = 0.0;
    int vocab;

    BT_ASSERT_OK(model_load(v->model, &m));
    vocab = model_config(m)->vocab_size;
    backend_config_init(&cfg);
    cfg.n_kv_blocks = N_BLOCKS;
    cfg.block_size = 8;
    cfg.max_batch_tokens = 512;
    cfg.n_threads = 2;
    cfg.precision = v->prec;
    cfg.kv_dtype = v->kv;
    BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
    for (int l = 0; l < lines; l++) {
        int n = g[l].n_prompt + g[l].n_want;
        int *seq = malloc(sizeof(int) * (size_t)n);
        int *out = malloc(sizeof(int) * (size_t)n);

        if (strcmp(g[l].model, golden_model) != 0) {
            free(seq);
            free(out);
            continue;
        }
        BT_CHECK(seq && out);
        memcpy(seq, g[l].prompt, sizeof(int) * (size_t)g[l].n_prompt);
        memcpy(seq + g[l].n_prompt, g[l].want,
               sizeof(int) * (size_t)g[l].n_want);
        bt_golden_teacher_argmax(be, vocab, seq, n, n, N_BLOCKS, out);
        g_nll += seq_nll(be, vocab, seq, n, g[l].n_prompt - 1, &g_count);
        if (ref[l] == NULL) { /* the first variant is the reference */
            ref[l] = out;
            out = NULL;
            same += n;
        } else {
            for (int i = 0; i < n; i++)
                same += out[i] == ref[l][i];
        }
        total += n;
        free(seq);
        free(out);
    }
    r.top1 = 100.0 * (double)same / (double)total;
    r.gppl = exp(g_nll / (double)g_count);
    if (ids != NULL)
        r.ppl = exp(mean_nll(be, vocab, ids, n_ids,
                             model_config(m)->max_seq_len));
    backend_destroy(&be);
    model_destroy(&m);
    return r;
}

/* The loaded checkpoint is what the command said it wrote, and its
 * dequantized v_proj / down_proj are the original's within E4M3
 * rounding (half a step of 3 mantissa bits, or of the subnormal grid). */
static void check_checkpoint(const char *dir, const char *orig,
                             bool per_channel, bool static_act, bool kv)
{
    model_t *q = NULL, *o = NULL;
    const model_quant_t *mq;

    BT_ASSERT_OK(model_load(dir, &q));
    BT_ASSERT_OK(model_load(orig, &o));
    mq = model_quant(q);
    BT_CHECK(mq->fp8);
    BT_ASSERT_STREQ(mq->scheme, "compressed-tensors");
    BT_ASSERT_EQ(mq->per_channel, per_channel);
    BT_ASSERT_EQ(mq->static_act, static_act);
    BT_ASSERT_EQ(mq->kv_scales, kv);
    BT_CHECK(!model_quant(o)->fp8);
    for (int l = 0; l < model_config(q)->n_layers; l++) {
        const model_layer_t *ql = model_layer(q, l);
        const model_layer_t *ol = model_layer(o, l);
        model_linear_t which[2] = { MODEL_LIN_V, MODEL_LIN_DOWN };

        BT_CHECK((ql->k_scale != NULL) == kv);
        for (int k = 0; k < MODEL_N_LINEAR; k++) {
            const model_fp8_t *f = &ql->fp8[k];

            BT_CHECK(f->codes != NULL);
            BT_ASSERT_EQ(f->n_w_scale,
                         per_channel ? model_layer_linear(ql, k)->rows : 1);
            BT_CHECK(static_act ? f->input_scale > 0 : f->input_scale == 0);
        }
        for (int k = 0; k < 2; k++) {
            const model_tensor_t *qt = model_layer_linear(ql, which[k]);
            const model_tensor_t *ot = model_layer_linear(ol, which[k]);
            const model_fp8_t *f = &ql->fp8[which[k]];
            int64_t n = qt->rows * qt->cols;
            float *a = malloc(sizeof(float) * (size_t)n);
            float *b = malloc(sizeof(float) * (size_t)n);

            BT_CHECK(a && b);
            model_tensor_to_f32(qt, 0, n, a);
            model_tensor_to_f32(ot, 0, n, b);
            for (int64_t i = 0; i < n; i++) {
                float s = f->w_scale[f->n_w_scale == 1 ? 0 : i / qt->cols];
                double tol = fabs(b[i]) / 16.0 * 1.0001 +
                             s / 1024.0 * 1.0001;

                if (!(fabs(a[i] - b[i]) <= tol))
                    BT_TEST_FAIL("%s layer %d linear %d elem %lld: %g vs "
                                 "original %g", dir, l, which[k],
                                 (long long)i, (double)a[i], (double)b[i]);
            }
            free(a);
            free(b);
        }
    }
    model_destroy(&q);
    model_destroy(&o);
}

/* The --kv-only checkpoint: plain weights, exactly the original's in
 * bf16, and the KV scales of the FP8 checkpoint calibrated on the same
 * text (fp8_dir). */
static void check_kv_only(const char *dir, const char *orig,
                          const char *fp8_dir)
{
    model_t *q = NULL, *o = NULL, *f = NULL;
    const model_quant_t *mq;

    BT_ASSERT_OK(model_load(dir, &q));
    BT_ASSERT_OK(model_load(orig, &o));
    BT_ASSERT_OK(model_load(fp8_dir, &f));
    mq = model_quant(q);
    BT_CHECK(!mq->fp8);
    BT_CHECK(mq->kv_scales);
    BT_ASSERT_STREQ(mq->scheme, "compressed-tensors");
    for (int l = 0; l < model_config(q)->n_layers; l++) {
        const model_layer_t *ql = model_layer(q, l);
        const model_layer_t *ol = model_layer(o, l);
        const model_layer_t *fl = model_layer(f, l);
        int nkv = model_config(q)->n_kv_heads;

        BT_CHECK(ql->k_scale != NULL && ql->v_scale != NULL);
        for (int h = 0; h < nkv; h++) {
            BT_ASSERT_EQ(ql->k_scale[h], fl->k_scale[h]);
            BT_ASSERT_EQ(ql->v_scale[h], fl->v_scale[h]);
        }
        for (int k = 0; k < MODEL_N_LINEAR; k++) {
            const model_tensor_t *qt = model_layer_linear(ql, k);
            const model_tensor_t *ot = model_layer_linear(ol, k);
            int64_t n = qt->rows * qt->cols;
            float *a, *b;

            BT_CHECK(ql->fp8[k].codes == NULL);
            if (k == MODEL_LIN_Q || k == MODEL_LIN_K)
                continue; /* rows in the other RoPE layout (llama2.c) */
            a = malloc(sizeof(float) * (size_t)n);
            b = malloc(sizeof(float) * (size_t)n);
            BT_CHECK(a && b);
            BT_ASSERT_EQ(qt->rows, ot->rows);
            model_tensor_to_f32(qt, 0, n, a);
            model_tensor_to_f32(ot, 0, n, b);
            for (int64_t i = 0; i < n; i++)
                if (a[i] != model_bf16_to_f32(model_f32_to_bf16(b[i])))
                    BT_TEST_FAIL("%s layer %d linear %d elem %lld: %g, not "
                                 "the original's bf16 (%g)", dir, l, k,
                                 (long long)i, (double)a[i], (double)b[i]);
            free(a);
            free(b);
        }
    }
    model_destroy(&f);
    model_destroy(&q);
    model_destroy(&o);
}

int main(void)
{
    const char *bin = BT_BIN_DIR "/baton";
    char ai[512], aitok[512], st[512], ch[300], te[300], sd[300], kvo[300];
    char cmd[4096];
    bt_golden_t *g;
    int lines, n_ids, **ref_ai, **ref_st;
    int *ids;
    tok_t *tok = NULL;
    char *text;
    size_t len;
    size_t before;

    snprintf(g_tmp, sizeof(g_tmp), "/tmp/bt_quant_XXXXXX");
    BT_CHECK(mkdtemp(g_tmp) != NULL);
    snprintf(ai, sizeof(ai), "%s/models/aidreams260K.bin",
             bt_golden_shared_dir());
    snprintf(aitok, sizeof(aitok), "%s/models/aidreams-tok512.bin",
             bt_golden_shared_dir());
    snprintf(st, sizeof(st), "%s/models/stories260K-hf",
             bt_golden_shared_dir());
    snprintf(ch, sizeof(ch), "%s/channel", g_tmp);
    snprintf(te, sizeof(te), "%s/tensor", g_tmp);
    snprintf(sd, sizeof(sd), "%s/stories", g_tmp);
    snprintf(kvo, sizeof(kvo), "%s/kv_only", g_tmp);

    /* 1. the command */
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --calib "
             "%s/docs/STYLE.md --tokenizer %s --kv-scales --out %s %s",
             bin, bt_golden_shared_dir(), aitok, ch, ai);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --per-tensor "
             "--percentile 99.99 --calib %s/docs/STYLE.md --tokenizer "
             "%s --kv-scales=tensor --out %s %s", bin, bt_golden_shared_dir(),
             aitok, te, ai);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --out %s %s", bin,
             sd, st);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --kv-only --calib "
             "%s/docs/STYLE.md --tokenizer %s --out %s %s", bin,
             bt_golden_shared_dir(), aitok, kvo, ai);
    run_ok(cmd);
    /* bad usage fails closed */
    snprintf(cmd, sizeof(cmd), "%s model quantize --out %s/x %s "
             ">/dev/null 2>&1", bin, g_tmp, ai);
    BT_CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --kv-scales --out "
             "%s/x %s >/dev/null 2>&1", bin, g_tmp, ai);
    BT_CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof(cmd), "%s model quantize --fp8 --kv-only --out "
             "%s/x %s >/dev/null 2>&1", bin, g_tmp, ai);
    BT_CHECK(system(cmd) != 0);

    before = bt_alloc_live_count();
    /* 2. what was written */
    check_checkpoint(ch, ai, true, true, true);
    check_checkpoint(te, ai, false, true, true);
    check_checkpoint(sd, st, true, false, false);
    check_kv_only(kvo, ai, ch);

    /* 3. generate from it */
    snprintf(cmd, sizeof(cmd), "%s run --model %s --tokenizer %s --device "
             "cpu --precision fp8 --kv-dtype fp8 --max-tokens 24 --prompt "
             "'The river' > %s/gen.txt 2>/dev/null && test -s %s/gen.txt",
             bin, ch, aitok, g_tmp, g_tmp);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s run --model %s --device cpu --precision "
             "fp8 --kv-dtype fp8 --ids --max-tokens 16 --prompt-ids '1 2 3' "
             "> %s/gen2.txt 2>/dev/null && test -s %s/gen2.txt", bin, sd,
             g_tmp, g_tmp);
    run_ok(cmd);

    /* 4. accuracy */
    lines = bt_golden_read(&g);
    ref_ai = calloc((size_t)lines, sizeof(*ref_ai));
    ref_st = calloc((size_t)lines, sizeof(*ref_st));
    BT_CHECK(ref_ai && ref_st);
    BT_ASSERT_OK(tok_load(aitok, 512, &tok));
    snprintf(cmd, sizeof(cmd), "%s/docs/DESIGN.md", bt_golden_shared_dir());
    BT_ASSERT_OK(bt_read_file(cmd, 1 << 22, &text, &len));
    BT_ASSERT_OK(tok_encode(tok, text, len, false, &ids, &n_ids));
    bt_free(text);
    tok_destroy(&tok);
    {
        const variant_t va[] = {
            { "bf16 (reference)", ai, BACKEND_PRECISION_BF16,
              BACKEND_KV_DTYPE_AUTO },
            { "f32", ai, BACKEND_PRECISION_F32, BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel, dynamic act", ai, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel, static act", ch, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel, static act, fp8 KV", ch, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_FP8 },
            { "fp8 tensor, static act", te, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_AUTO },
            { "fp8 tensor, static act, fp8 KV", te, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_FP8 },
            { "bf16, fp8 KV (calibrated, --kv-only)", kvo,
              BACKEND_PRECISION_BF16, BACKEND_KV_DTYPE_FP8 },
            { "bf16, fp8 KV (scale 1)", ai, BACKEND_PRECISION_BF16,
              BACKEND_KV_DTYPE_FP8 },
        };
        const variant_t vs[] = {
            { "bf16 (reference)", st, BACKEND_PRECISION_BF16,
              BACKEND_KV_DTYPE_AUTO },
            { "f32", st, BACKEND_PRECISION_F32, BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel, dynamic act", sd, BACKEND_PRECISION_FP8,
              BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel weights only (bf16 act)", sd,
              BACKEND_PRECISION_BF16, BACKEND_KV_DTYPE_AUTO },
            { "fp8 channel, dynamic act, fp8 KV (scale 1)", sd,
              BACKEND_PRECISION_FP8, BACKEND_KV_DTYPE_FP8 },
        };
        /* held levels: the measured figures (PERFORMANCE.md) less a small
         * margin: top-1 % at least, perplexity increases % at most.
         * aidreams holds the bar (>= 97% top-1 per channel, <= 2%
         * perplexity); stories260K cannot (FP8 rounding moves it far more
         * than bf16 does, PERFORMANCE.md), so its measured level is held
         * so that it cannot get worse unnoticed. */
        const double ai_top1[] = { 100, 99, 97, 96.5, 96.5, 94.5, 94.5, 98,
                                   98.5 };
        const double ai_gppl[] = { 0, 2, 2, 2, 2, 2, 2, 2, 2 };
        const double ai_tppl[] = { 0, 2, 2, 2, 2, 2, 2, 2, 2 };
        const double st_top1[] = { 100, 93, 62, 70, 61 };
        const double st_gppl[] = { 0, 2, 80, 35, 100 };
        double g0 = 0, t0 = 0;
        bool ok = true;

        printf("aidreams260K: %d held-text tokens (../shared/docs/DESIGN.md)\n",
               n_ids);
        printf("| model | variant | top-1 vs bf16 | golden ppl | vs bf16 | "
               "held-text ppl | vs bf16 |\n");
        for (size_t i = 0; i < BT_ARRAY_SIZE(va); i++) {
            result_t r = evaluate(&va[i], "aidreams260K.bin", g, lines,
                                  ref_ai, ids, n_ids);
            double gi, ti;

            if (i == 0) {
                g0 = r.gppl;
                t0 = r.ppl;
            }
            gi = 100.0 * (r.gppl / g0 - 1.0);
            ti = 100.0 * (r.ppl / t0 - 1.0);
            printf("| aidreams260K | %s | %.2f%% | %.4f | %+.2f%% | %.2f | "
                   "%+.2f%% |\n", va[i].label, r.top1, r.gppl, gi, r.ppl,
                   ti);
            if (r.top1 < ai_top1[i] || gi > ai_gppl[i] || ti > ai_tppl[i]) {
                fprintf(stderr, "FAIL: aidreams %s below the held level "
                        "(top-1 >= %.0f%%, golden ppl +<= %.0f%%, held-text "
                        "ppl +<= %.0f%%)\n", va[i].label, ai_top1[i],
                        ai_gppl[i], ai_tppl[i]);
                ok = false;
            }
        }
        for (size_t i = 0; i < BT_ARRAY_SIZE(vs); i++) {
            result_t r = evaluate(&vs[i], "stories260K.bin", g, lines,
                                  ref_st, NULL, 0);
            double gi;

            if (i == 0)
                g0 = r.gppl;
            gi = 100.0 * (r.gppl / g0 - 1.0);
            printf("| stories260K-hf | %s | %.2f%% | %.4f | %+.2f%% | - | - "
                   "|\n", vs[i].label, r.top1, r.gppl, gi);
            if (r.top1 < st_top1[i] || gi > st_gppl[i]) {
                fprintf(stderr, "FAIL: stories %s below the held level "
                        "(top-1 >= %.0f%%, golden ppl +<= %.0f%%)\n",
                        vs[i].label, st_top1[i], st_gppl[i]);
                ok = false;
            }
        }
        BT_CHECK(ok);
    }
    for (int l = 0; l < lines; l++) {
        free(ref_ai[l]);
        free(ref_st[l]);
    }
    free(ref_ai);
    free(ref_st);
    bt_free(ids);
    bt_golden_free(g, lines);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_tmp);
    run_ok(cmd);
    BT_TEST_PASS("baton model quantize --fp8");
    return 0;
}
