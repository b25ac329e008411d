/* test_cpu_ops.c - worker/cpu ops against naive double-precision
 * references written here: matmul (every tile shape, tails, strides,
 * bias, accumulate, row ranges), RMSNorm, RoPE (both layouts, linear and
 * Llama 3 scaling), SwiGLU, paged attention (shuffled blocks, masks),
 * the all-heads decode attention (every tile shape, portable, AVX2 and
 * AVX-512VL kernels), the thread pool, and the FP8 GEMM of precision
 * fp8 (activation quantization, packed matmul over E4M3 values, scaled
 * epilogue) against cpu__fp8_gemm_ref from codes.
 *
 * Tolerance (abs + rel, llm.c style): |got - ref| <= 1e-6 + 1e-5 * scale,
 * where scale is the sum of |terms| of a reduction (matmul, attention) or
 * |ref| for elementwise ops. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "bt_alloc.h"
#include "bt_fp8.h"
#include "bt_test.h"
#include "bt_util.h"
#include "cpu/cpu_int.h"

static unsigned long long rng_state = 88172645463325252ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void fill(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
}

#define CHECK_CLOSE(_got, _ref, _scale, ...)                                \
    do {                                                                    \
        double _g = (_got), _r = (_ref);                                    \
        if (!(fabs(_g - _r) <= 1e-6 + 1e-5 * (_scale))) {                   \
            fprintf(stderr, __VA_ARGS__);                                   \
            BT_TEST_FAIL("got %.9g want %.9g (scale %g)", _g, _r,           \
                         (double)(_scale));                                 \
        }                                                                   \
    } while (0)

// ----------------------------------------------------------------------------

/* Pass 0: cpu__matmul, pass 1: cpu__matmul_ref, pass 2:
 * cpu__matmul_packed over [n0 rounded down to a panel, n1). */
static void check_matmul(int n_tok, int k, int n_out, int n0_in, int n1,
                         bool bias_on, bool acc)
{
    int ldx = k + 3, ldo = n_out + 5, ldw = k + (n_out % 3);
    float *x = malloc(sizeof(float) * n_tok * ldx);
    float *w = malloc(sizeof(float) * n_out * ldw);
    float *wp = bt_malloc_aligned(sizeof(float) * cpu__pack_size(n_out, k),
                                  "test");
    float *b = malloc(sizeof(float) * n_out);
    float *out = malloc(sizeof(float) * n_tok * ldo);
    float *out0 = malloc(sizeof(float) * n_tok * ldo);

    fill(x, (size_t)n_tok * ldx);
    fill(w, (size_t)n_out * ldw);
    fill(b, n_out);
    fill(out0, (size_t)n_tok * ldo);
    cpu__pack(wp, w, ldw, n_out, k);
    for (int pass = 0; pass < 3; pass++) {
        int n0 = pass == 2 ? n0_in - n0_in % CPU_PACK_NR : n0_in;

        memcpy(out, out0, sizeof(float) * n_tok * ldo);
        if (pass == 0)
            cpu__matmul(out, ldo, x, ldx, w, ldw, bias_on ? b : NULL, n_tok,
                        k, n0, n1, acc);
        else if (pass == 1)
            cpu__matmul_ref(out, ldo, x, ldx, w, ldw, bias_on ? b : NULL,
                            n_tok, k, n0, n1, acc);
        else
            cpu__matmul_packed(out, ldo, x, ldx, wp, n_out,
                               bias_on ? b : NULL, n_tok, k, n0, n1, acc);
        for (int t = 0; t < n_tok; t++) {
            for (int n = 0; n < ldo; n++) {
                double ref = out0[t * ldo + n], scale = fabs(ref);

                if (n >= n0 && n < n1) {
                    double s = bias_on ? b[n] : 0.0;

                    scale = bias_on ? fabs(b[n]) : 0.0;
                    for (int j = 0; j < k; j++) {
                        s += (double)x[t * ldx + j] * w[n * ldw + j];
                        scale += fabs((double)x[t * ldx + j] * w[n * ldw + j]);
                    }
                    if (acc) {
                        scale += fabs(ref);
                        ref += s;
                    } else {
                        ref = s;
                    }
                }
                CHECK_CLOSE(out[t * ldo + n], ref, scale,
                            "matmul pass %d T=%d K=%d N=%d [%d,%d) bias %d "
                            "acc %d at t=%d n=%d\n", pass, n_tok, k, n_out,
                            n0, n1, bias_on, acc, t, n);
            }
        }
    }
    free(x); free(w); free(b); free(out); free(out0);
    bt_free(wp);
}

/* The packed kernel gives a token the same bits whatever its batch: one
 * token alone, and the same token in batches of every height. */
static void test_matmul_packed_batch_invariant(void)
{
    enum { K = 172, N = 344, T = 33 };
    float *x = malloc(sizeof(float) * T * K);
    float *w = malloc(sizeof(float) * N * K);
    float *wp = bt_malloc_aligned(sizeof(float) * cpu__pack_size(N, K),
                                  "test");
    float *one = malloc(sizeof(float) * N);
    float *all = malloc(sizeof(float) * T * N);

    fill(x, (size_t)T * K);
    fill(w, (size_t)N * K);
    cpu__pack(wp, w, K, N, K);
    for (int n_tok = 1; n_tok <= T; n_tok++) {
        cpu__matmul_packed(all, N, x, K, wp, N, NULL, n_tok, K, 0, N, false);
        for (int t = 0; t < n_tok; t++) {
            cpu__matmul_packed(one, N, x + (size_t)t * K, K, wp, N, NULL, 1,
                               K, 0, N, false);
            BT_CHECK(memcmp(one, all + (size_t)t * N, sizeof(float) * N) ==
                     0);
        }
    }
    free(x); free(w); free(one); free(all);
    bt_free(wp);
    BT_TEST_PASS("matmul packed batch invariant");
}

static void test_matmul(void)
{
    static const int toks[] = { 1, 2, 3, 4, 5, 7, 8, 13, 32, 33 };
    static const int ks[] = { 1, 5, 8, 16, 64, 172, 173 };
    static const int ns[] = { 1, 3, 4, 7, 8, 9, 17, 33, 64, 97, 172 };
    int cases = 0;

    for (size_t a = 0; a < BT_ARRAY_SIZE(toks); a++)
        for (size_t b = 0; b < BT_ARRAY_SIZE(ks); b++)
            for (size_t c = 0; c < BT_ARRAY_SIZE(ns); c++) {
                int n = ns[c];

                check_matmul(toks[a], ks[b], n, 0, n, (a + c) % 2, false);
                check_matmul(toks[a], ks[b], n, n / 3, n - n / 4, c % 2,
                             true);
                cases += 2;
            }
    fprintf(stderr, "matmul: %d shapes (avx2 kernel: %s)\n", cases,
            cpu__have_avx2() ? "yes" : "no");
    BT_TEST_PASS("matmul");
}

// ----------------------------------------------------------------------------

static void test_rmsnorm_embed_swiglu(void)
{
    static const int dims[] = { 1, 7, 64, 100, 4096 };

    for (size_t d = 0; d < BT_ARRAY_SIZE(dims); d++) {
        int dim = dims[d];
        float *x = malloc(sizeof(float) * dim), *w = malloc(sizeof(float) *
                                                           dim);
        float *o = malloc(sizeof(float) * dim);
        double ss = 0;

        fill(x, dim);
        fill(w, dim);
        for (int j = 0; j < dim; j++)
            ss += (double)x[j] * x[j];
        cpu__rmsnorm(o, x, w, dim, 1e-5f);
        for (int j = 0; j < dim; j++) {
            double ref = w[j] * x[j] / sqrt(ss / dim + 1e-5);

            CHECK_CLOSE(o[j], ref, fabs(ref), "rmsnorm dim %d j %d\n", dim,
                        j);
        }
        cpu__rmsnorm(x, x, w, dim, 1e-5f); /* in place */
        for (int j = 0; j < dim; j++)
            BT_ASSERT_NEAR(x[j], o[j], 0);
        free(x); free(w); free(o);
    }

    {
        float table[4 * 3], out[3];

        fill(table, 12);
        cpu__embed(out, table, 3, 2);
        for (int j = 0; j < 3; j++)
            BT_ASSERT_NEAR(out[j], table[6 + j], 0);
    }

    {
        enum { N = 257 };
        float gu[2 * N], out[N], tmp[N];

        fill(gu, 2 * N);
        for (int i = 0; i < 2 * N; i++)
            gu[i] *= 8.0f;
        gu[0] = 200.0f; /* exp(-200) underflows */
        gu[2] = -200.0f; /* exp(200) is clamped */
        cpu__swiglu(out, gu, N, tmp);
        for (int i = 0; i < N; i++) {
            double g = gu[2 * i], ref = g / (1.0 + exp(-g)) * gu[2 * i + 1];

            CHECK_CLOSE(out[i], ref, fabs(ref), "swiglu %d\n", i);
        }
    }
    BT_TEST_PASS("rmsnorm_embed_swiglu");
}

// ----------------------------------------------------------------------------

/* transformers' _compute_llama3_parameters, in double. */
static double llama3_freq(double f, double factor, double low, double high,
                          double old_len)
{
    double wavelen = 2 * M_PI / f;
    double low_wl = old_len / low, high_wl = old_len / high;

    if (wavelen < high_wl)
        return f;
    if (wavelen > low_wl)
        return f / factor;
    double smooth = (old_len / wavelen - low) / (high - low);
    return (1 - smooth) * f / factor + smooth * f;
}

static void test_rope(void)
{
    model_config_t c;
    enum { HD = 128, NH = 3 };
    float inv[HD / 2], cs[HD / 2], sn[HD / 2];
    float v[NH * HD], orig[NH * HD];

    memset(&c, 0, sizeof(c));
    c.head_dim = HD;
    c.rope_theta = 500000.0f;
    for (int scaling = 0; scaling < 3; scaling++) {
        c.rope_scaling = (model_rope_scaling_t)scaling;
        c.rope_factor = 8.0f;
        c.rope_low_freq_factor = 1.0f;
        c.rope_high_freq_factor = 4.0f;
        c.rope_orig_max_pos = 8192;
        cpu__rope_inv_freq(&c, inv);
        for (int i = 0; i < HD / 2; i++) {
            double f = 1.0 / pow(500000.0, 2.0 * i / HD);

            if (scaling == MODEL_ROPE_SCALING_LINEAR)
                f /= 8.0;
            else if (scaling == MODEL_ROPE_SCALING_LLAMA3)
                f = llama3_freq(f, 8.0, 1.0, 4.0, 8192.0);
            CHECK_CLOSE(inv[i], f, 10 * f, "inv_freq scaling %d i %d\n",
                        scaling, i);
        }
        if (scaling == MODEL_ROPE_SCALING_LLAMA3) {
            /* highest frequency kept, lowest divided by the factor */
            BT_ASSERT_NEAR(inv[0], 1.0, 0);
            BT_ASSERT_NEAR(inv[HD / 2 - 1] * 8.0,
                           1.0 / pow(500000.0, (HD - 2.0) / HD), 1e-9);
        }
        for (int layout = 0; layout < 2; layout++) {
            int pos = 37 + 1000 * scaling;

            fill(orig, NH * HD);
            memcpy(v, orig, sizeof(v));
            cpu__rope_cos_sin(pos, inv, HD / 2, cs, sn);
            cpu__rope_apply(v, NH, HD, (model_rope_layout_t)layout, cs, sn);
            for (int h = 0; h < NH; h++) {
                for (int i = 0; i < HD / 2; i++) {
                    int a = layout == 0 ? 2 * i : i;
                    int b = layout == 0 ? 2 * i + 1 : i + HD / 2;
                    /* the angle is a float product, as in llama2.c and
                     * transformers; only cos/sin are checked here */
                    double ang = (float)pos * inv[i];
                    double x0 = orig[h * HD + a], x1 = orig[h * HD + b];
                    double r0 = x0 * cos(ang) - x1 * sin(ang);
                    double r1 = x0 * sin(ang) + x1 * cos(ang);

                    CHECK_CLOSE(v[h * HD + a], r0, 1.0, "rope %d/%d\n",
                                scaling, layout);
                    CHECK_CLOSE(v[h * HD + b], r1, 1.0, "rope %d/%d\n",
                                scaling, layout);
                }
            }
        }
    }
    BT_TEST_PASS("rope");
}

// ----------------------------------------------------------------------------

/* Attention of new tokens [i0, i0 + n_q) of a sequence with ctx_len
 * cached slots and n_new new ones, over a shuffled block table, for the
 * `group` query heads of every KV head, against double precision. */
static void check_attention(int bs, int n_kv, int group, int hd, int ctx_len,
                            int n_new, int i0, int n_q, bool use_mask,
                            bool adjacent)
{
    int n_slots = ctx_len + n_new;
    int n_blocks_seq = (n_slots + bs - 1) / bs;
    int n_blocks = n_blocks_seq + 3;
    int kv_row = n_kv * hd, q_row = n_kv * group * hd + 5;
    float *kc = malloc(sizeof(float) * n_blocks * bs * kv_row);
    float *vc = malloc(sizeof(float) * n_blocks * bs * kv_row);
    float *q = malloc(sizeof(float) * n_q * q_row);
    float *out = malloc(sizeof(float) * n_q * q_row);
    float *scratch = malloc(sizeof(float) * n_q * n_slots);
    double *p = malloc(sizeof(double) * n_slots);
    int *table = malloc(sizeof(int) * n_blocks_seq);
    uint8_t *mask = malloc((size_t)n_new * n_new);
    cpu_attn_seq_t s;

    fill(kc, (size_t)n_blocks * bs * kv_row);
    fill(vc, (size_t)n_blocks * bs * kv_row);
    fill(q, (size_t)n_q * q_row);
    for (int i = 0; i < n_q * q_row; i++)
        q[i] *= 3.0f;
    /* adjacent ids (one contiguous run) or a shuffled table */
    for (int i = 0; i < n_blocks_seq; i++)
        table[i] = adjacent ? i + 1 : n_blocks - 1 - i;
    for (int i = n_blocks_seq - 1; i > 0 && !adjacent; i--) {
        int j = (int)((rng_state >> 16) % (unsigned)(i + 1)), t;

        frand();
        t = table[i]; table[i] = table[j]; table[j] = t;
    }
    for (int i = 0; i < n_new * n_new; i++) {
        mask[i] = (rng_state >> 20) & 1;
        frand();
    }
    if (use_mask && n_new > 2)
        memset(mask + 2 * n_new, 0, n_new); /* row 2 sees only the cache */
    s = (cpu_attn_seq_t){ kc, vc, table, bs, kv_row, hd, ctx_len, n_new,
                          use_mask ? mask : NULL };

    for (int kvh = 0; kvh < n_kv; kvh++) {
        size_t head0 = (size_t)kvh * group * hd;

        memset(out, 0, sizeof(float) * n_q * q_row);
        cpu__attention(out + head0, q_row, q + head0, q_row, &s, kvh, group,
                       i0, n_q, scratch);
        for (int r = 0; r < n_q; r++) {
            for (int hh = 0; hh < group; hh++) {
                const float *qv = q + (size_t)r * q_row + head0 + hh * hd;
                int i = i0 + r;
                double max = -INFINITY, sum = 0;

                for (int slot = 0; slot < n_slots; slot++) {
                    int j = slot - ctx_len;
                    bool vis = slot < ctx_len ||
                               (use_mask ? mask[i * n_new + j] != 0 : j <= i);
                    const float *k = kc + ((size_t)table[slot / bs] * bs +
                                           slot % bs) * kv_row + kvh * hd;
                    double d = 0;

                    for (int t = 0; t < hd; t++)
                        d += (double)qv[t] * k[t];
                    p[slot] = vis ? d / sqrt(hd) : -INFINITY;
                    if (p[slot] > max)
                        max = p[slot];
                }
                for (int slot = 0; slot < n_slots; slot++) {
                    p[slot] = p[slot] == -INFINITY ? 0 : exp(p[slot] - max);
                    sum += p[slot];
                }
                for (int t = 0; t < hd; t++) {
                    double ref = 0;

                    for (int slot = 0; slot < n_slots; slot++)
                        ref += p[slot] / (sum > 0 ? sum : 1) *
                               vc[((size_t)table[slot / bs] * bs + slot % bs) *
                                  kv_row + kvh * hd + t];
                    CHECK_CLOSE(out[(size_t)r * q_row + head0 + hh * hd + t],
                                ref, 1.0,
                                "attention bs %d ctx %d new %d [%d,+%d) "
                                "mask %d group %d adjacent %d\n", bs,
                                ctx_len, n_new, i0, n_q, use_mask, group,
                                adjacent);
                }
            }
        }
    }
    free(kc); free(vc); free(q); free(out); free(scratch); free(p);
    free(table); free(mask);
}

/* cpu__attention_decode: the last of n_new new tokens of a sequence
 * with ctx_len cached slots (shuffled blocks), all n_kv * group heads at
 * once, against double precision; a canary after the output. */
static void check_attention_decode(int bs, int n_kv, int group, int hd,
                                   int ctx_len, int n_new)
{
    int n_slots = ctx_len + n_new;
    int n_blocks_seq = (n_slots + bs - 1) / bs;
    int n_blocks = n_blocks_seq + 2;
    int kv_row = n_kv * hd, q_dim = n_kv * group * hd;
    float *kc = malloc(sizeof(float) * n_blocks * bs * kv_row);
    float *vc = malloc(sizeof(float) * n_blocks * bs * kv_row);
    float *q = malloc(sizeof(float) * q_dim);
    float *out = malloc(sizeof(float) * (q_dim + 1));
    float *scratch = malloc(sizeof(float) *
                            CPU_ATTN_DECODE_SCRATCH(n_slots));
    double *p = malloc(sizeof(double) * n_slots);
    int *table = malloc(sizeof(int) * n_blocks_seq);
    cpu_attn_seq_t s;

    fill(kc, (size_t)n_blocks * bs * kv_row);
    fill(vc, (size_t)n_blocks * bs * kv_row);
    fill(q, (size_t)q_dim);
    for (int i = 0; i < q_dim; i++)
        q[i] *= 3.0f;
    for (int i = 0; i < n_blocks_seq; i++)
        table[i] = i + 2;
    for (int i = n_blocks_seq - 1; i > 0 && (hd + ctx_len) % 2 == 0; i--) {
        int j = (int)((rng_state >> 16) % (unsigned)(i + 1)), t;

        frand();
        t = table[i]; table[i] = table[j]; table[j] = t;
    }
    s = (cpu_attn_seq_t){ kc, vc, table, bs, kv_row, hd, ctx_len, n_new,
                          NULL };
    out[q_dim] = 12345.0f;
    cpu__attention_decode(out, q, &s, n_kv, group, scratch);
    BT_CHECK(out[q_dim] == 12345.0f);
    for (int h = 0; h < n_kv * group; h++) {
        const float *qv = q + (size_t)h * hd;
        int kvh = h / group;
        double max = -INFINITY, sum = 0;

        for (int slot = 0; slot < n_slots; slot++) {
            size_t row = ((size_t)table[slot / bs] * bs + slot % bs) *
                         kv_row + (size_t)kvh * hd;
            double d = 0;

            for (int t = 0; t < hd; t++)
                d += (double)qv[t] * kc[row + t];
            p[slot] = d / sqrt(hd);
            max = p[slot] > max ? p[slot] : max;
        }
        for (int slot = 0; slot < n_slots; slot++) {
            p[slot] = exp(p[slot] - max);
            sum += p[slot];
        }
        for (int t = 0; t < hd; t++) {
            double ref = 0;

            for (int slot = 0; slot < n_slots; slot++)
                ref += p[slot] / sum *
                       vc[((size_t)table[slot / bs] * bs + slot % bs) *
                          kv_row + (size_t)kvh * hd + t];
            CHECK_CLOSE(out[(size_t)h * hd + t], ref, 1.0,
                        "attention decode bs %d kv %d group %d hd %d ctx "
                        "%d new %d head %d\n", bs, n_kv, group, hd,
                        ctx_len, n_new, h);
        }
    }
    free(kc); free(vc); free(q); free(out); free(scratch); free(p);
    free(table);
}

static void test_attention_decode(void)
{
    /* head_dim x (kv heads, group): 4/8-lane tiles, partial tiles (2 or 6
     * heads of 16), one-lane tiles of 64 and 128 columns, and 24 (the
     * per-head fallback) */
    static const int shapes[][3] = {
        { 16, 4, 1 }, { 16, 2, 2 }, { 16, 2, 4 }, { 16, 2, 1 }, { 16, 3, 2 },
        { 8, 4, 2 }, { 8, 8, 1 }, { 8, 1, 3 }, { 32, 2, 1 }, { 32, 1, 2 },
        { 64, 2, 2 }, { 128, 1, 2 }, { 24, 2, 1 } };
    static const int bss[] = { 1, 3, 16 };
    static const int ctxs[] = { 0, 1, 6, 15, 16, 17, 80, 95 };
    int cases = 0;

    for (size_t a = 0; a < BT_ARRAY_SIZE(shapes); a++)
        for (size_t b = 0; b < BT_ARRAY_SIZE(bss); b++)
            for (size_t c = 0; c < BT_ARRAY_SIZE(ctxs); c++) {
                check_attention_decode(bss[b], shapes[a][1], shapes[a][2],
                                       shapes[a][0], ctxs[c],
                                       1 + (int)(c % 3));
                cases++;
            }
    fprintf(stderr, "attention decode: %d cases\n", cases);
    BT_TEST_PASS("attention decode");
}

static void test_attention(void)
{
    static const int bss[] = { 1, 3, 16 };
    static const int ctxs[] = { 0, 1, 15, 16, 17, 50 };
    static const int news[] = { 1, 2, 7, 20 };
    int cases = 0;

    for (size_t a = 0; a < BT_ARRAY_SIZE(bss); a++)
        for (size_t b = 0; b < BT_ARRAY_SIZE(ctxs); b++)
            for (size_t c = 0; c < BT_ARRAY_SIZE(news); c++)
                for (int m = 0; m < 4; m++) {
                    int n = news[c];
                    int i0 = (m & 2) ? n / 3 : 0;
                    int n_q = (m & 2) ? n - n / 3 - (n > 3) : n;

                    check_attention(bss[a], 2, 1 + (int)(c % 3),
                                    a == 1 ? 16 : 8, ctxs[b], n, i0, n_q,
                                    m & 1, (b + c) % 2);
                    cases++;
                }
    check_attention(16, 1, 4, 128, 300, 5, 0, 5, false, false);
    check_attention(16, 2, 2, 64, 40, 33, 16, 16, false, true);
    /* decode-shaped: one query, the last new token, wide heads */
    check_attention(16, 2, 1, 128, 300, 1, 0, 1, false, false);
    check_attention(16, 2, 2, 64, 77, 1, 0, 1, false, true);
    check_attention(16, 2, 1, 24, 45, 3, 2, 1, false, false);
    check_attention(3, 2, 1, 16, 45, 3, 2, 1, false, false);
    fprintf(stderr, "attention: %d cases\n", cases + 6);
    BT_TEST_PASS("attention");
}

static void test_exp(void)
{
    enum { N = 4001 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    double max_rel = 0;

    for (int i = 0; i < N; i++)
        x[i] = -100.0f + 190.0f * (float)i / (N - 1);
    x[7] = -INFINITY;
    memcpy(y, x, sizeof(float) * N);
    cpu__exp_inplace(y, N);
    BT_ASSERT_NEAR(y[7], 0.0, 0);
    for (int i = 0; i < N; i++) {
        double ref = exp((double)x[i]);

        if (i == 7 || x[i] < -87.0f || x[i] > 88.0f)
            continue;
        if (fabs(y[i] - ref) / ref > max_rel)
            max_rel = fabs(y[i] - ref) / ref;
    }
    fprintf(stderr, "exp: max relative error %.3g\n", max_rel);
    BT_CHECK(max_rel < 4e-7);
    free(x);
    free(y);
    BT_TEST_PASS("exp");
}

// ----------------------------------------------------------------------------

typedef struct {
    atomic_int calls[8];
    atomic_long sum;
} pool_probe_t;

static void pool_task(void *arg, int ith, int nth)
{
    pool_probe_t *p = arg;

    atomic_fetch_add(&p->calls[ith], 1);
    atomic_fetch_add(&p->sum, (long)nth * 100 + ith);
}

static void test_pool(void)
{
    for (int size = 1; size <= 4; size++) {
        cpu_pool_t *pool = NULL;
        pool_probe_t probe;
        long want = 0;

        BT_ASSERT_OK(cpu__pool_create(size, &pool));
        BT_ASSERT_EQ(cpu__pool_size(pool), size);
        memset(&probe, 0, sizeof(probe));
        for (int iter = 0; iter < 3000; iter++) {
            int nth = 1 + iter % 5; /* sometimes more than the pool */
            int eff = nth > size ? size : nth;

            cpu__pool_run(pool, nth, pool_task, &probe);
            for (int i = 0; i < eff; i++)
                want += (long)eff * 100 + i;
        }
        BT_ASSERT_EQ(atomic_load(&probe.sum), want);
        cpu__pool_destroy(&pool);
        BT_CHECK(pool == NULL);
    }
    {
        cpu_pool_t *pool = NULL;

        BT_ASSERT_OK(cpu__pool_create(0, &pool)); /* all cores */
        BT_CHECK(cpu__pool_size(pool) >= 1);
        cpu__pool_destroy(&pool);
    }
    BT_TEST_PASS("pool");
}

/* The fp8 GEMM as the backend runs it against the reference from codes:
 * dynamic and static input scales (the static one small enough that some
 * inputs saturate at 448), per-row and per-tensor weight scales, store
 * and accumulate, shapes with panel tails. */
static void test_fp8_gemm(void)
{
    const int shapes[][3] = { { 1, 16, 16 }, { 5, 37, 19 }, { 9, 64, 40 } };

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int nt = shapes[si][0], k = shapes[si][1], no = shapes[si][2];
        float *x = bt_malloc_aligned(sizeof(float) * nt * k, "t");
        float *w = bt_malloc_aligned(sizeof(float) * no * k, "t");
        float *wp = bt_malloc_aligned(sizeof(float) * cpu__pack_size(no, k),
                                      "t");
        float *xq = bt_malloc_aligned(sizeof(float) * nt * k, "t");
        float *acc = bt_malloc_aligned(sizeof(float) * nt * no, "t");
        float *out = bt_malloc_aligned(sizeof(float) * nt * no, "t");
        float *ref = bt_malloc_aligned(sizeof(float) * nt * no, "t");
        float *xs = bt_malloc_aligned(sizeof(float) * nt, "t");
        float *ws = bt_malloc_aligned(sizeof(float) * no, "t");
        uint8_t *wc = bt_malloc(no * k, "t"), *xc = bt_malloc(nt * k, "t");

        BT_CHECK(x && w && wp && xq && acc && out && ref && xs && ws && wc &&
                 xc);
        fill(x, (size_t)nt * k);
        for (int i = 0; i < no * k; i++)
            w[i] = frand() * (1.0f + (float)(i % 7));
        for (int variant = 0; variant < 4; variant++) {
            bool per_tensor = variant & 1, stat = variant & 2;
            float in_scale = stat ? 1.0f / 600.0f : 0.0f; /* |x| < 1 */

            for (int n = 0; n < no; n++) {
                float amax = 0.0f;

                for (int j = 0; j < k; j++)
                    amax = fmaxf(amax, fabsf(w[n * k + j]));
                ws[n] = bt_fp8_scale(per_tensor ? 7.0f : amax);
                for (int j = 0; j < k; j++) {
                    wc[n * k + j] = bt_f32_to_e4m3(w[n * k + j] / ws[n]);
                    w[n * k + j] = bt_e4m3_to_f32(wc[n * k + j]);
                }
            }
            cpu__pack(wp, w, k, no, k);
            cpu__fp8_quant_rows(xq, xs, x, k, nt, k, in_scale);
            for (int t = 0; t < nt; t++)
                for (int j = 0; j < k; j++) {
                    xc[t * k + j] = bt_f32_to_e4m3(x[t * k + j] / xs[t]);
                    BT_ASSERT_NEAR(xq[t * k + j],
                                   bt_e4m3_to_f32(xc[t * k + j]), 0);
                    if (stat && fabsf(x[t * k + j]) > 448.0f * in_scale)
                        BT_ASSERT_NEAR(fabsf(xq[t * k + j]), 448.0, 0);
                }
            cpu__fp8_gemm_ref(ref, xc, xs, wc, ws, per_tensor ? 1 : no, nt,
                              k, no);
            cpu__matmul_packed(acc, no, xq, k, wp, no, NULL, nt, k, 0, no,
                               false);
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                for (int i = 0; i < nt * no; i++)
                    out[i] = accumulate ? 1.0f : 0.0f;
                cpu__fp8_epilogue(out, no, acc, no, xs, ws, NULL, nt, 0, no,
                                  accumulate);
                for (int t = 0; t < nt; t++)
                    for (int n = 0; n < no; n++) {
                        double scale = 0.0;

                        for (int j = 0; j < k; j++)
                            scale += fabs(xq[t * k + j] * w[n * k + j]);
                        scale *= xs[t] * ws[n];
                        CHECK_CLOSE(out[t * no + n] - (accumulate ? 1.0f : 0),
                                    ref[t * no + n], scale + accumulate,
                                    "fp8 gemm %dx%dx%d v%d t%d n%d: %g vs "
                                    "%g\n", nt, k, no, variant, t, n,
                                    (double)out[t * no + n],
                                    (double)ref[t * no + n]);
                    }
            }
            fill(x, (size_t)nt * k); /* restore w's source for the next */
            for (int i = 0; i < no * k; i++)
                w[i] = frand() * (1.0f + (float)(i % 7));
        }
        bt_free(x);
        bt_free(w);
        bt_free(wp);
        bt_free(xq);
        bt_free(acc);
        bt_free(out);
        bt_free(ref);
        bt_free(xs);
        bt_free(ws);
        bt_free(wc);
        bt_free(xc);
    }
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    test_fp8_gemm();

    test_matmul();
    test_matmul_packed_batch_invariant();
    cpu__matmul_force_portable(true);
    test_matmul();
    test_matmul_packed_batch_invariant();
    test_attention(); /* the portable softmax and P V */
    test_attention_decode(); /* the per-head fallback */
    cpu__matmul_force_portable(false);
    cpu__attention_force_avx2(true);
    test_attention_decode(); /* AVX2 kernels without AVX-512VL */
    cpu__attention_force_avx2(false);
    test_attention_decode();
    test_rmsnorm_embed_swiglu();
    test_rope();
    test_exp();
    test_attention();
    test_pool();
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
