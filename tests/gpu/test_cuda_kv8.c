/*
 * test_cuda_kv8.c - the CUDA backend's FP8 (E4M3) KV cache kernels
 * against the cpu backend's --kv-dtype fp8 (worker/cpu/cpu_backend.c
 * cpu_store_kv8 / cpu_gather_kv8), op by op (needs a GPU; run by `make
 * gpu-test` and tests/gpu/run_gpu_fp8.sh, never by ctest):
 *   1. rope_kv with d_kv_scale writes the cpu's codes, bit for bit:
 *      code = bt_f32_to_e4m3(bf16(value) * (1 / scale)) per KV head.
 *      V over every bf16 bit pattern (NaN: any NaN code, the sign of a
 *      NaN is not kept by bf16 rounding) at three scales; K and V of
 *      random rows (with bias, large values that saturate, both RoPE
 *      layouts) at position 0, where the rotation is exact; K at random
 *      positions within one code of the host's rotation (the device's
 *      sincosf and FMA contraction may move the f32 value by an ulp);
 *      the vector kernel (head sizes 64, 128) and the scalar one (24).
 *   2. cuda_attn_decode on FP8 codes, both kernels it picks (the tensor-
 *      core one, then the general one under BT_ATTN_TC=0), against a
 *      double-precision reference
 *      over the dequantized values (code * scale), relative L2 error
 *      < 1e-2 (the bf16 kernel tests' bound): decode tokens at context
 *      1 .. 4100 with the planner's split and with forced short splits
 *      (many splits + combine), a prompt chunk after a cached prefix
 *      (causal) and a masked tree; head sizes 64 and 128, GQA groups 1,
 *      4 and 7;
 *   2b. the fused RoPE (the decode kernel rotating q and writing the new
 *      K / V codes itself) against cuda_rope_kv + the decode kernel:
 *      codes within one step in at most 1 of 1,000 (FMA contraction),
 *      nothing else written, outputs within 1e-3, d_q never read;
 *   3. cuda_attn_prefill (the tiled prefill: fa2wqv with FP8 KV at head
 *      64/128, the shared-memory kernel at other sizes) on the same prompt chunk (two 64-query tiles) after the
 *      cached prefix and the masked tree, same reference and bound;
 *   4. the FP8 pool through the backend (stories260K, bf16 + --kv-dtype
 *      fp8): the layout says one byte an element, the host tier's block
 *      is half the bf16 one, a forward's blocks saved / loaded elsewhere /
 *      copied (backend_kv_copy_block, backend_kv_copy_slots) / saved
 *      again are identical; the codes are within one step of the cpu's
 *      --kv-dtype fp8 pool for the same prompt in >= 95% of places (the
 *      two backends' bf16 K/V differ where their f32 sums round
 *      differently: the identical share is printed); f32 and tp > 1 with
 *      --kv-dtype fp8 are refused.
 *   5. the widened prefill (cuda_attn_prefill_widen_ok: head 128, an
 *      even query group; the pages a prefill reads widened to bf16 and
 *      read by the TMA ping-pong kernel, cuda_forward.c
 *      cuda_prefill_widened) through the backend on synth:tiny-h128:
 *      the last token's logits of a prompt prefilled as one chunk and
 *      as a cached prefix plus a chunk, against the same prompt fed a
 *      token a step (the decode kernel, which reads the codes):
 *      relative L2 < 2e-2 (the same codes, the sums in another order).
 * Prints one PASS/FAIL line per check; exits non-zero on any failure.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "bt_fp8.h"
#include "bt_golden.h"
#include "cuda/kernels/attn_decode.h"
#include "cuda/cuda_switches.h"
#include "cuda/kernels/attn_prefill.h"
#include "cuda/kernels/rope_kv.h"
#include "gpu_test_util.h"

static int g_fail;
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

#define OK(_e)                                                              \
    do {                                                                    \
        if ((_e) != BT_OK) {                                                \
            printf("FAIL %s\n", #_e);                                       \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static uint32_t urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

/* uniform in [-1, 1) */
static float frand(void)
{
    return (float)(urand() >> 8) / 8388608.0f - 1.0f;
}

static bool e4m3_nan(uint8_t c)
{
    return (c & 0x7Fu) == 0x7Fu;
}

static void *dev_up(const void *h, size_t bytes)
{
    void *d = NULL;

    CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes)
        CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void report(bool ok, const char *fmt, const char *what, long bad,
                   long n)
{
    printf("%s ", ok ? "PASS" : "FAIL");
    printf(fmt, what, bad, n);
    printf("\n");
    g_fail += !ok;
}

// ---------------------------------------------------------------------
// 1. rope_kv's codes

typedef struct {
    int nt, nh, nkv, hd, rope_half;
    bool bias;
    const char *name;
} rope_case_t;

/* The host's RoPE of pair (x0, x1) at pos (double angles: within an ulp
 * of the device's f32 sincosf). */
static void host_rot(float x0, float x1, double ang, float *y0, float *y1)
{
    double c = cos(ang), s = sin(ang);

    *y0 = (float)((double)x0 * c - (double)x1 * s);
    *y1 = (float)((double)x0 * s + (double)x1 * c);
}

/* mode 0: random rows at random positions (K within one code, V exact);
 * 1: the same rows at position 0 (K and V exact);
 * 2: V = every bf16 pattern (needs nt * nkv * hd == 65536), exact. */
static void rope_case(const rope_case_t *rc, int mode, float scale_all)
{
    const int nt = rc->nt, hd = rc->hd, half = hd / 2;
    const int qkv_dim = (rc->nh + 2 * rc->nkv) * hd;
    const int kv_dim = rc->nkv * hd;
    uint16_t *qkv = malloc(sizeof(uint16_t) * (size_t)nt * qkv_dim);
    uint16_t *bias = malloc(sizeof(uint16_t) * qkv_dim);
    float *inv_freq = malloc(sizeof(float) * half);
    float *scale = malloc(sizeof(float) * 2 * rc->nkv);
    int *pos = malloc(sizeof(int) * nt), *slot = malloc(sizeof(int) * nt);
    size_t cache_n = (size_t)(nt + 3) * kv_dim;
    uint8_t *kc = malloc(cache_n), *vc = malloc(cache_n);
    long bad_k = 0, bad_v = 0, off_k = 0, n_k = 0, n_v = 0;
    char what[200];

    for (size_t i = 0; i < (size_t)nt * qkv_dim; i++) {
        /* a few rows of large values, so that some codes saturate */
        float mag = (i / qkv_dim) % 7 == 3 ? 900.0f : 6.0f;
        qkv[i] = bf16_of(frand() * mag);
    }
    if (mode == 2)
        for (int t = 0; t < nt; t++)
            for (int e = 0; e < kv_dim; e++)
                qkv[(size_t)t * qkv_dim + (rc->nh + rc->nkv) * hd + e] =
                    (uint16_t)(t * kv_dim + e);
    for (int i = 0; i < qkv_dim; i++)
        bias[i] = bf16_of(frand() * 0.5f);
    for (int i = 0; i < half; i++)
        inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    for (int h = 0; h < 2 * rc->nkv; h++)
        scale[h] = scale_all > 0 ? scale_all
                                 : 0.005f + 1.5f * (float)(urand() % 1000) /
                                                1000.0f;
    for (int t = 0; t < nt; t++) {
        pos[t] = mode == 0 ? (int)(urand() % 4096) : 0;
        /* one token unwritten (not in mode 2: every pattern counts) */
        slot[t] = t == nt / 2 && mode != 2 ? -1 : nt + 2 - t;
    }

    void *d_qkv = dev_up(qkv, sizeof(uint16_t) * (size_t)nt * qkv_dim);
    void *d_bias = rc->bias ? dev_up(bias, sizeof(uint16_t) * qkv_dim)
                            : NULL;
    float *d_inv = dev_up(inv_freq, sizeof(float) * half);
    float *d_scale = dev_up(scale, sizeof(float) * 2 * rc->nkv);
    int *d_pos = dev_up(pos, sizeof(int) * nt);
    int *d_slot = dev_up(slot, sizeof(int) * nt);
    void *d_q = NULL, *d_k = NULL, *d_v = NULL;
    CK(cudaMalloc(&d_q, sizeof(uint16_t) * (size_t)nt * rc->nh * hd));
    CK(cudaMalloc(&d_k, cache_n));
    CK(cudaMalloc(&d_v, cache_n));
    CK(cudaMemset(d_k, 0x55, cache_n));
    CK(cudaMemset(d_v, 0x55, cache_n));

    cuda_rope_kv_args_t a;
    memset(&a, 0, sizeof(a));
    a.n_tokens = nt;
    a.n_heads = rc->nh;
    a.n_kv_heads = rc->nkv;
    a.head_dim = hd;
    a.rope_half = rc->rope_half;
    a.d_qkv = d_qkv;
    a.d_bias = d_bias;
    a.d_inv_freq = d_inv;
    a.d_pos = d_pos;
    a.d_slot = d_slot;
    a.d_q = d_q;
    a.d_k_cache = d_k;
    a.d_v_cache = d_v;
    a.d_kv_scale = d_scale;
    OK(cuda_rope_kv(&a, CUDA_DT_BF16, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(kc, d_k, cache_n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc, d_v, cache_n, cudaMemcpyDeviceToHost));

    for (int t = 0; t < nt; t++) {
        const uint16_t *row = qkv + (size_t)t * qkv_dim;
        if (slot[t] < 0)
            continue;
        for (int h = 0; h < rc->nkv; h++) {
            int c0 = (rc->nh + h) * hd;
            float kinv = 1.0f / scale[h];
            float vinv = 1.0f / scale[rc->nkv + h];
            const uint8_t *kg = kc + (size_t)slot[t] * kv_dim + h * hd;
            const uint8_t *vg = vc + (size_t)slot[t] * kv_dim + h * hd;
            int cv = (rc->nh + rc->nkv + h) * hd;

            for (int i = 0; i < half; i++) {
                int e0 = rc->rope_half ? i : 2 * i;
                int e1 = rc->rope_half ? i + half : 2 * i + 1;
                float x0 = f32_of_bf16(row[c0 + e0]);
                float x1 = f32_of_bf16(row[c0 + e1]);
                float y0, y1;

                if (rc->bias) {
                    x0 += f32_of_bf16(bias[c0 + e0]);
                    x1 += f32_of_bf16(bias[c0 + e1]);
                }
                /* the angle as the device rounds it (f32 product) */
                host_rot(x0, x1, (double)((float)pos[t] * inv_freq[i]),
                         &y0, &y1);
                if (pos[t] == 0)
                    y0 = x0, y1 = x1;
                for (int j = 0; j < 2; j++) {
                    int e = j ? e1 : e0;
                    float y = f32_of_bf16(bf16_of(j ? y1 : y0));
                    uint8_t want = bt_f32_to_e4m3(y * kinv);
                    uint8_t got = kg[e];
                    n_k++;
                    if (got == want)
                        continue;
                    /* one code apart, same sign: a rounding boundary;
                     * or zeros of either sign (a value within an ulp of
                     * 0 may take either sign) */
                    if (pos[t] != 0 &&
                        (((got & 0x80) == (want & 0x80) &&
                          abs((int)(got & 0x7F) - (int)(want & 0x7F)) ==
                              1) ||
                         ((got & 0x7F) == 0 && (want & 0x7F) == 0))) {
                        off_k++;
                        continue;
                    }
                    if (bad_k++ < 5)
                        printf("  K t %d head %d e %d pos %d: code 0x%02x, "
                               "want 0x%02x (value %g, scale %g)\n", t, h,
                               e, pos[t], got, want, y, scale[h]);
                }
            }
            for (int e = 0; e < hd; e++) {
                float x = f32_of_bf16(row[cv + e]);
                if (rc->bias)
                    x += f32_of_bf16(bias[cv + e]);
                /* bf16(x): exact for a bf16 x with no bias */
                uint8_t want = isnan(x) ? BT_FP8_E4M3_NAN
                                        : bt_f32_to_e4m3(
                                              f32_of_bf16(bf16_of(x)) *
                                              vinv);
                uint8_t got = vg[e];
                n_v++;
                if (got == want || (e4m3_nan(got) && e4m3_nan(want)))
                    continue;
                if (bad_v++ < 5)
                    printf("  V t %d head %d e %d: code 0x%02x, want 0x%02x "
                           "(value %g, scale %g)\n", t, h, e, got, want, x,
                           scale[rc->nkv + h]);
            }
        }
    }
    /* the unwritten token's slot and the spare slots keep their bytes */
    for (size_t i = 0; i < (size_t)3 * kv_dim; i++) {
        bad_k += kc[i] != 0x55;
        bad_v += vc[i] != 0x55;
    }
    if (mode != 2) {
        const size_t o = (size_t)(nt + 2 - nt / 2) * kv_dim;
        for (size_t i = 0; i < (size_t)kv_dim; i++) {
            bad_k += kc[o + i] != 0x55;
            bad_v += vc[o + i] != 0x55;
        }
    }
    snprintf(what, sizeof(what), "%s, %s%s", rc->name,
             mode == 0 ? "random positions" : mode == 1 ? "position 0"
                                                        : "every bf16 V",
             scale_all > 0 ? (scale_all == 1.0f ? ", scale 1" : ", scale "
                                                                "const")
                           : ", random scales");
    if (mode != 2)
        report(bad_k == 0, "rope_kv fp8 K codes == cpu's (%s): %ld of %ld "
               "differ", what, bad_k, n_k);
    report(bad_v == 0, "rope_kv fp8 V codes == cpu's (%s): %ld of %ld "
           "differ", what, bad_v, n_v);
    if (mode == 0)
        printf("INFO rope_kv fp8 K (%s): %ld of %ld codes one step from "
               "the host's f64 rotation (an f32 ulp at a rounding "
               "boundary)\n", what, off_k, n_k);

    cudaFree(d_qkv);
    cudaFree(d_bias);
    cudaFree(d_inv);
    cudaFree(d_scale);
    cudaFree(d_pos);
    cudaFree(d_slot);
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    free(qkv);
    free(bias);
    free(inv_freq);
    free(scale);
    free(pos);
    free(slot);
    free(kc);
    free(vc);
}

static void test_rope(void)
{
    static const rope_case_t cases[] = {
        { 64, 32, 8, 128, 1, true, "hd 128 half, bias" },
        { 64, 32, 8, 128, 0, false, "hd 128 interleaved" },
        { 48, 8, 2, 64, 1, false, "hd 64 half" },
        { 40, 4, 1, 64, 0, true, "hd 64 interleaved, bias" },
        /* half of 24 is no whole 16-byte chunk: the scalar kernel */
        { 32, 4, 2, 24, 1, true, "hd 24 half, bias (scalar kernel)" },
    };

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        rope_case(&cases[c], 0, 0);
        rope_case(&cases[c], 1, 0);
    }
    /* V: every bf16 bit pattern (64 tokens x 8 heads x 128) */
    {
        const rope_case_t all = { 64, 8, 8, 128, 1, false, "hd 128" };
        rope_case(&all, 2, 1.0f);
        rope_case(&all, 2, 0.037f);
        rope_case(&all, 2, 3.5f);
    }
}

// ---------------------------------------------------------------------
// 2. decode attention over FP8 codes

typedef struct {
    int nh, nkv, hd;
    const char *name;
} attn_case_t;

#define BS 16  /* tokens per block */

/* One batch: per token kv_len, ctx, mask (offset into masks or -1);
 * the sequence layout of the tokens is given by seq_of[t]. */
typedef struct {
    int n;             /* tokens */
    int kv_len[160], ctx[160], mask_off[160], seq[160];
} batch_t;

/* A shuffled block table: blocks 0..n-1 in random order. */
static int *shuffled_blocks(int n)
{
    int *perm = malloc(sizeof(int) * n);

    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(urand() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    return perm;
}

/* n random K and V codes: no NaN, magnitudes up to 448 in places, most
 * keys moderate so that the softmax is not one-hot. */
static void random_kv_codes(uint8_t *kc, uint8_t *vc, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t k = (uint8_t)urand(), v = (uint8_t)urand();
        kc[i] = e4m3_nan(k) ? (uint8_t)(k & 0xF7) : k;
        vc[i] = e4m3_nan(v) ? (uint8_t)(v & 0xF7) : v;
        if ((kc[i] & 0x78) > 0x48)
            kc[i] = (uint8_t)(kc[i] & 0xC7);
    }
}

/* The decode kernel's arguments over FP8 caches of pool_blocks blocks
 * (per-token arrays on the device; d_q, d_k_cache, d_v_cache and d_out
 * left for the caller). */
static cuda_attn_args_t kv8_attn_args(const attn_case_t *ac, int pool_blocks,
                                      float *d_scale, int *d_bt,
                                      uint8_t *d_masks, int *d_kvl,
                                      int *d_bto, int *d_ctx, int *d_mo)
{
    cuda_attn_args_t a;

    memset(&a, 0, sizeof(a));
    a.n_heads = ac->nh;
    a.n_kv_heads = ac->nkv;
    a.head_dim = ac->hd;
    a.block_size = BS;
    a.scale = 1.0f / sqrtf((float)ac->hd);
    a.kv_slots = (long long)pool_blocks * BS;
    a.d_kv_scale = d_scale;
    a.d_block_tables = d_bt;
    a.d_masks = d_masks;
    a.d_kv_len = d_kvl;
    a.d_bt_off = d_bto;
    a.d_ctx_len = d_ctx;
    a.d_mask_off = d_mo;
    return a;
}

/* force_split: > 0 the decode kernel with splits of that many keys, 0
 * with the planner's split, < 0 the tiled prefill kernel (the tokens of
 * a sequence contiguous in the batch). */
static const char *g_kernel = ""; /* the decode kernel under test */

static void attn_run(const attn_case_t *ac, const batch_t *bt_,
                     const int *seq_len, int n_seqs, const uint8_t *masks,
                     size_t mask_bytes, int force_split, const char *what)
{
    const int hd = ac->hd, nh = ac->nh, nkv = ac->nkv, n = bt_->n;
    const int kv_dim = nkv * hd;
    int n_blocks = 0, *bt_off = malloc(sizeof(int) * n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        bt_off[s] = n_blocks;
        n_blocks += (seq_len[s] + BS - 1) / BS;
    }
    /* a shuffled block table over a pool with spare blocks */
    int pool_blocks = n_blocks + 5;
    int *perm = shuffled_blocks(pool_blocks);
    size_t cache_n = (size_t)pool_blocks * BS * kv_dim;
    uint8_t *kc = malloc(cache_n), *vc = malloc(cache_n);
    random_kv_codes(kc, vc, cache_n);
    float scale[2 * 8 + 2 * 8];
    for (int h = 0; h < 2 * nkv; h++)
        scale[h] = 0.01f + 0.2f * (float)(urand() % 1000) / 1000.0f;
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)n * nh * hd);
    for (size_t i = 0; i < (size_t)n * nh * hd; i++)
        q[i] = bf16_of(frand() * 2.0f);
    int tok_bt[160];
    for (int t = 0; t < n; t++)
        tok_bt[t] = bt_off[bt_->seq[t]];
    int max_kv = 1;
    for (int t = 0; t < n; t++)
        max_kv = bt_->kv_len[t] > max_kv ? bt_->kv_len[t] : max_kv;

    int n_sm = 0, dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    int n_splits = 1, split_len = 64;
    if (force_split < 0) {
        /* tiles are made below */
    } else if (force_split > 0) {
        split_len = force_split;
        n_splits = (max_kv + split_len - 1) / split_len;
    } else {
        cuda_attn_decode_plan(n, max_kv, nh, nkv, n_sm,
                              cuda_attn_decode_blocks_per_sm(hd, true,
                                                             nh / nkv),
                              256,
                              &n_splits, &split_len);
    }
    size_t ws_n = cuda_attn_decode_ws_floats(n, nh, hd, n_splits);

    void *d_q = dev_up(q, sizeof(uint16_t) * (size_t)n * nh * hd);
    void *d_k = dev_up(kc, cache_n), *d_v = dev_up(vc, cache_n);
    float *d_scale = dev_up(scale, sizeof(float) * 2 * nkv);
    int *d_bt = dev_up(perm, sizeof(int) * pool_blocks);
    uint8_t *d_masks = dev_up(masks, mask_bytes);
    int *d_kvl = dev_up(bt_->kv_len, sizeof(int) * n);
    int *d_bto = dev_up(tok_bt, sizeof(int) * n);
    int *d_ctx = dev_up(bt_->ctx, sizeof(int) * n);
    int *d_mo = dev_up(bt_->mask_off, sizeof(int) * n);
    float *d_ws = NULL;
    void *d_out = NULL;
    if (ws_n)
        CK(cudaMalloc((void **)&d_ws, sizeof(float) * ws_n));
    CK(cudaMalloc(&d_out, sizeof(uint16_t) * (size_t)n * nh * hd));
    CK(cudaMemset(d_out, 0xFF, sizeof(uint16_t) * (size_t)n * nh * hd));

    cuda_attn_args_t a = kv8_attn_args(ac, pool_blocks, d_scale, d_bt,
                                       d_masks, d_kvl, d_bto, d_ctx, d_mo);
    a.d_q = d_q;
    a.d_k_cache = d_k;
    a.d_v_cache = d_v;
    a.d_out = d_out;
    if (force_split < 0) {
        int tiles[64][CUDA_PREFILL_TILE_INTS], n_tiles = 0;
        for (int sq = 0; sq < n_seqs; sq++) {
            int t0 = -1, nq = 0;
            for (int t = 0; t < n; t++)
                if (bt_->seq[t] == sq) {
                    if (t0 < 0)
                        t0 = t;
                    nq++;
                }
            for (int i0 = 0; t0 >= 0 && i0 < nq; i0 += CUDA_PREFILL_BQ) {
                int *tp = tiles[n_tiles++];
                tp[CUDA_PT_TOK0] = t0;
                tp[CUDA_PT_I0] = i0;
                tp[CUDA_PT_NQ] = nq - i0 < CUDA_PREFILL_BQ ? nq - i0
                                                           : CUDA_PREFILL_BQ;
                tp[CUDA_PT_NTOK] = nq;
                tp[CUDA_PT_CTX] = bt_->ctx[t0];
                tp[CUDA_PT_BT_OFF] = bt_off[sq];
                tp[CUDA_PT_MASK_OFF] = bt_->mask_off[t0];
                tp[CUDA_PT_PAD] = 0;
            }
        }
        int *d_tiles = dev_up(tiles, sizeof(int) * CUDA_PREFILL_TILE_INTS *
                                         (size_t)n_tiles);
        OK(cuda_attn_prefill(&a, d_tiles, n_tiles, CUDA_DT_BF16, 0));
        CK(cudaDeviceSynchronize());
        cudaFree(d_tiles);
    } else {
        OK(cuda_attn_decode(&a, NULL, n, n_splits, split_len, d_ws,
                            CUDA_DT_BF16, 0));
    }
    CK(cudaDeviceSynchronize());
    uint16_t *out = malloc(sizeof(uint16_t) * (size_t)n * nh * hd);
    CK(cudaMemcpy(out, d_out, sizeof(uint16_t) * (size_t)n * nh * hd,
                  cudaMemcpyDeviceToHost));

    /* reference: double precision over code * scale */
    double num = 0, den = 0;
    long nonfinite = 0;
    double *sc = malloc(sizeof(double) * (max_kv + 1));
    for (int t = 0; t < n; t++) {
        const int *tbl = perm + tok_bt[t];
        for (int h = 0; h < nh; h++) {
            int kvh = h / (nh / nkv);
            double mx = -INFINITY, l = 0;
            const uint16_t *qh = q + ((size_t)t * nh + h) * hd;
            for (int k = 0; k < bt_->kv_len[t]; k++) {
                bool vis = !(bt_->mask_off[t] >= 0 && k >= bt_->ctx[t] &&
                             !masks[bt_->mask_off[t] + k - bt_->ctx[t]]);
                sc[k] = -INFINITY;
                if (!vis)
                    continue;
                size_t sl = (size_t)tbl[k / BS] * BS + k % BS;
                const uint8_t *kr = kc + sl * kv_dim + kvh * hd;
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)f32_of_bf16(qh[e]) *
                         bt_e4m3_to_f32(kr[e]) * scale[kvh];
                sc[k] = d / sqrt((double)hd);
                mx = sc[k] > mx ? sc[k] : mx;
            }
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                l = 0;
                for (int k = 0; k < bt_->kv_len[t]; k++) {
                    if (sc[k] == -INFINITY)
                        continue;
                    double p = exp(sc[k] - mx);
                    size_t sl = (size_t)tbl[k / BS] * BS + k % BS;
                    l += p;
                    acc += p * bt_e4m3_to_f32(vc[sl * kv_dim + kvh * hd +
                                                 e]) * scale[nkv + kvh];
                }
                double ref = l > 0 ? acc / l : 0;
                float got = f32_of_bf16(out[((size_t)t * nh + h) * hd + e]);
                if (!isfinite(got)) {
                    nonfinite++;
                    continue;
                }
                num += (got - ref) * (got - ref);
                den += ref * ref;
            }
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    bool ok = nonfinite == 0 && rel < 1e-2;
    if (force_split < 0)
        printf("%s attn_prefill fp8 KV %s, %s: rel_err %.3e (tol 1e-2), "
               "max kv %d%s\n", ok ? "PASS" : "FAIL", ac->name, what, rel,
               max_kv, nonfinite ? ", NON-FINITE outputs" : "");
    else
        printf("%s attn_decode%s fp8 KV %s, %s: rel_err %.3e (tol 1e-2), "
               "%d split(s) of %d, max kv %d%s\n", ok ? "PASS" : "FAIL",
               g_kernel, ac->name, what, rel, n_splits, split_len, max_kv,
               nonfinite ? ", NON-FINITE outputs" : "");
    g_fail += !ok;

    free(sc);
    free(out);
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_scale);
    cudaFree(d_bt);
    cudaFree(d_masks);
    cudaFree(d_kvl);
    cudaFree(d_bto);
    cudaFree(d_ctx);
    cudaFree(d_mo);
    cudaFree(d_ws);
    cudaFree(d_out);
    free(q);
    free(kc);
    free(vc);
    free(perm);
    free(bt_off);
}

static void test_attn(bool tc)
{
    static const attn_case_t cases[] = {
        { 32, 8, 128, "hd 128 group 4" },
        { 8, 8, 64, "hd 64 group 1" },
        { 28, 4, 128, "hd 128 group 7" },
        /* groups of > 8 heads take the heads-as-rows step, 8 the
         * keys-as-rows one's widest */
        { 32, 2, 128, "hd 128 group 16" },
        { 32, 4, 64, "hd 64 group 8" },
    };
    static const int ctx_lens[] = { 1, 7, 64, 300, 1500, 4100 };
    const int n_ctx = (int)(sizeof(ctx_lens) / sizeof(ctx_lens[0]));

    setenv("BT_ATTN_TC", tc ? "1" : "0", 1);
    cuda_switches_reload();
    g_kernel = tc ? " (tensor cores)" : " (general)";
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        batch_t b;
        int seq_len[64];
        uint8_t mask[25] = {0};

        /* decode: one token per sequence at each context length */
        memset(&b, 0, sizeof(b));
        b.n = n_ctx;
        for (int i = 0; i < n_ctx; i++) {
            b.kv_len[i] = ctx_lens[i];
            b.ctx[i] = ctx_lens[i] - 1;
            b.mask_off[i] = -1;
            b.seq[i] = i;
            seq_len[i] = ctx_lens[i];
        }
        attn_run(&cases[c], &b, seq_len, n_ctx, mask, 1, 0,
                 "decode, planned split");
        attn_run(&cases[c], &b, seq_len, n_ctx, mask, 1, 256,
                 "decode, splits of 256");
        attn_run(&cases[c], &b, seq_len, n_ctx, mask, 1, 64,
                 "decode, splits of 64");

        /* a 100-token chunk after 700 cached tokens (causal), and a
         * 5-token masked tree after 50 */
        memset(&b, 0, sizeof(b));
        for (int i = 0; i < 100; i++, b.n++) {
            b.kv_len[b.n] = 700 + i + 1;
            b.ctx[b.n] = 700;
            b.mask_off[b.n] = -1;
            b.seq[b.n] = 0;
        }
        seq_len[0] = 800;
        for (int i = 0; i < 25; i++) /* a tree: each sees itself and its
                                        ancestors (i -> (i - 1) / 2) */
            mask[i] = 0;
        for (int i = 0; i < 5; i++)
            for (int j = i; j >= 0; j = j ? (j - 1) / 2 : -1) {
                mask[i * 5 + j] = 1;
                if (j == 0)
                    break;
            }
        for (int i = 0; i < 5; i++, b.n++) {
            b.kv_len[b.n] = 55;
            b.ctx[b.n] = 50;
            b.mask_off[b.n] = i * 5;
            b.seq[b.n] = 1;
        }
        seq_len[1] = 55;
        attn_run(&cases[c], &b, seq_len, 2, mask, sizeof(mask), 0,
                 "prompt chunk after a cached prefix + masked tree");
        attn_run(&cases[c], &b, seq_len, 2, mask, sizeof(mask), 128,
                 "prompt chunk after a cached prefix + masked tree, "
                 "splits of 128");
        if (tc) /* (the tiled kernel does not depend on the switch) */
            attn_run(&cases[c], &b, seq_len, 2, mask, sizeof(mask), -1,
                     "tiles: prompt chunk after a cached prefix + masked "
                     "tree");
    }
}

/* The fused RoPE over FP8 KV (cuda_attn_args_t.d_qkv with d_kv_scale:
 * single-token decode steps of up to 16 tokens, cuda_forward.c
 * fuse_rope) against the two-kernel path (cuda_rope_kv, then the decode
 * kernel reading d_q), same inputs: the new rows' codes equal but for
 * FMA contraction (a code at most one step away, in at most 1 of 1,000),
 * every other byte of the caches untouched, the outputs within 1e-3
 * (relative L2) and finite; d_q is poisoned in the fused run (it must not
 * be read) and the new slots are poisoned with NaN codes (they must be
 * written). */
static uint8_t *dev_down(const void *d, size_t bytes)
{
    uint8_t *h = malloc(bytes);

    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static void fused_rope_run(const attn_case_t *ac, int rope_half, bool bias,
                           int force_split)
{
    static const int ctxs[] = { 0, 6, 63, 64, 299, 1499, 4099 };
    const int n = (int)(sizeof(ctxs) / sizeof(ctxs[0]));
    const int hd = ac->hd, nh = ac->nh, nkv = ac->nkv, kv_dim = nkv * hd;
    const int qkv_dim = (nh + 2 * nkv) * hd;
    int kv_len[16], ctx[16], bt_off[16], pos[16], slot[16], mo[16];
    int n_blocks = 0, max_kv = 1;

    for (int t = 0; t < n; t++) {
        ctx[t] = ctxs[t];
        kv_len[t] = ctx[t] + 1;
        bt_off[t] = n_blocks;
        n_blocks += (kv_len[t] + BS - 1) / BS;
        pos[t] = (int)(urand() % 8192);
        mo[t] = -1;
        max_kv = kv_len[t] > max_kv ? kv_len[t] : max_kv;
    }
    const int pool_blocks = n_blocks + 3;
    int *perm = shuffled_blocks(pool_blocks);
    for (int t = 0; t < n; t++)
        slot[t] = perm[bt_off[t] + ctx[t] / BS] * BS + ctx[t] % BS;
    const size_t cache_n = (size_t)pool_blocks * BS * kv_dim;
    uint8_t *kc = malloc(cache_n), *vc = malloc(cache_n);
    random_kv_codes(kc, vc, cache_n);
    for (int t = 0; t < n; t++) /* the fused run must write these */
        for (int e = 0; e < kv_dim; e++) {
            kc[(size_t)slot[t] * kv_dim + e] = 0x7F;
            vc[(size_t)slot[t] * kv_dim + e] = 0x7F;
        }
    uint16_t *qkv = malloc(sizeof(uint16_t) * (size_t)n * qkv_dim);
    uint16_t *bvec = malloc(sizeof(uint16_t) * qkv_dim);
    for (size_t i = 0; i < (size_t)n * qkv_dim; i++)
        qkv[i] = bf16_of(frand() * ((i / hd) % 5 == 2 ? 300.0f : 3.0f));
    for (int i = 0; i < qkv_dim; i++)
        bvec[i] = bf16_of(frand() * 0.5f);
    float scale[2 * 8], inv_freq[128];
    for (int h = 0; h < 2 * nkv; h++)
        scale[h] = 0.005f + 1.5f * (float)(urand() % 1000) / 1000.0f;
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = powf(500000.0f, -2.0f * (float)i / (float)hd);

    int n_sm = 0, dev = 0, n_splits = 1, split_len = 64;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    if (force_split > 0) {
        split_len = force_split;
        n_splits = (max_kv + split_len - 1) / split_len;
    } else {
        cuda_attn_decode_plan(n, max_kv, nh, nkv, n_sm,
                              cuda_attn_decode_blocks_per_sm(hd, true,
                                                             nh / nkv),
                              64,
                              &n_splits, &split_len);
    }
    const size_t q_bytes = sizeof(uint16_t) * (size_t)n * nh * hd;
    void *d_qkv = dev_up(qkv, sizeof(uint16_t) * (size_t)n * qkv_dim);
    void *d_bias = bias ? dev_up(bvec, sizeof(uint16_t) * qkv_dim) : NULL;
    float *d_inv = dev_up(inv_freq, sizeof(float) * (hd / 2));
    float *d_scale = dev_up(scale, sizeof(float) * 2 * nkv);
    int *d_pos = dev_up(pos, sizeof(int) * n);
    int *d_slot = dev_up(slot, sizeof(int) * n);
    int *d_bt = dev_up(perm, sizeof(int) * pool_blocks);
    int *d_kvl = dev_up(kv_len, sizeof(int) * n);
    int *d_bto = dev_up(bt_off, sizeof(int) * n);
    int *d_ctx = dev_up(ctx, sizeof(int) * n);
    int *d_mo = dev_up(mo, sizeof(int) * n);
    uint8_t mask1 = 0;
    uint8_t *d_masks = dev_up(&mask1, 1);
    size_t ws_n = cuda_attn_decode_ws_floats(n, nh, hd, n_splits);
    float *d_ws = NULL;
    if (ws_n)
        CK(cudaMalloc((void **)&d_ws, sizeof(float) * ws_n));
    void *d_k[2], *d_v[2], *d_out[2], *d_q = NULL;
    CK(cudaMalloc(&d_q, q_bytes));
    for (int r = 0; r < 2; r++) {
        d_k[r] = dev_up(kc, cache_n);
        d_v[r] = dev_up(vc, cache_n);
        CK(cudaMalloc(&d_out[r], q_bytes));
        CK(cudaMemset(d_out[r], 0xFF, q_bytes));
    }

    cuda_rope_kv_args_t ra;
    memset(&ra, 0, sizeof(ra));
    ra.n_tokens = n;
    ra.n_heads = nh;
    ra.n_kv_heads = nkv;
    ra.head_dim = hd;
    ra.rope_half = rope_half;
    ra.d_qkv = d_qkv;
    ra.d_bias = d_bias;
    ra.d_inv_freq = d_inv;
    ra.d_pos = d_pos;
    ra.d_slot = d_slot;
    ra.d_q = d_q;
    ra.d_k_cache = d_k[0];
    ra.d_v_cache = d_v[0];
    ra.d_kv_scale = d_scale;
    cuda_attn_args_t a = kv8_attn_args(ac, pool_blocks, d_scale, d_bt,
                                       d_masks, d_kvl, d_bto, d_ctx, d_mo);
    /* 0: the two kernels; 1: fused, d_q poisoned */
    OK(cuda_rope_kv(&ra, CUDA_DT_BF16, 0));
    a.d_q = d_q;
    a.d_k_cache = d_k[0];
    a.d_v_cache = d_v[0];
    a.d_out = d_out[0];
    OK(cuda_attn_decode(&a, NULL, n, n_splits, split_len, d_ws,
                        CUDA_DT_BF16, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(d_q, 0xFF, q_bytes));
    const bool ok_fuse = cuda_attn_decode_rope_ok(&a, n, CUDA_DT_BF16);
    a.d_qkv = d_qkv;
    a.d_qkv_bias = d_bias;
    a.d_inv_freq = d_inv;
    a.d_pos = d_pos;
    a.d_slot = d_slot;
    a.rope_half = rope_half;
    a.d_k_cache = d_k[1];
    a.d_v_cache = d_v[1];
    a.d_out = d_out[1];
    if (ok_fuse)
        OK(cuda_attn_decode(&a, NULL, n, n_splits, split_len, d_ws,
                            CUDA_DT_BF16, 0));
    CK(cudaDeviceSynchronize());

    uint8_t *k0 = dev_down(d_k[0], cache_n), *k1 = dev_down(d_k[1], cache_n);
    uint8_t *v0 = dev_down(d_v[0], cache_n), *v1 = dev_down(d_v[1], cache_n);
    uint16_t *o0 = (uint16_t *)dev_down(d_out[0], q_bytes);
    uint16_t *o1 = (uint16_t *)dev_down(d_out[1], q_bytes);
    long diff = 0, far = 0, outside = 0;
    for (size_t i = 0; i < cache_n; i++)
        for (int kv = 0; kv < 2; kv++) {
            uint8_t x = kv ? v0[i] : k0[i], y = kv ? v1[i] : k1[i];
            if (x == y)
                continue;
            diff++;
            bool is_new = false;
            for (int t = 0; t < n; t++)
                is_new |= i / kv_dim == (size_t)slot[t];
            /* one step: magnitudes one apart with one sign, or +-0
             * and the smallest code of either sign */
            const int mx = x & 0x7F, my = y & 0x7F;
            const bool step = (x ^ y) & 0x80 ? mx + my <= 1
                                             : abs(mx - my) <= 1;
            if (!is_new)
                outside++;
            else if (!step || e4m3_nan(x) || e4m3_nan(y))
                far++;
        }
    const long n_new = 2L * n * kv_dim;
    char what[160];
    snprintf(what, sizeof(what), "%s %s%s, %d split(s) of %d", ac->name,
             rope_half ? "half" : "pairs", bias ? "+bias" : "", n_splits,
             split_len);
    printf("%s attn_decode+rope fp8 KV %s: codes of the new rows %ld of "
           "%ld differ from rope_kv's (%ld beyond one step), %ld bytes "
           "outside them\n",
           ok_fuse && far == 0 && outside == 0 && diff * 1000 <= n_new
               ? "PASS" : "FAIL",
           what, diff, n_new, far, outside);
    g_fail += !(ok_fuse && far == 0 && outside == 0 && diff * 1000 <= n_new);
    double num = 0, den = 0;
    long nonfinite = 0;
    for (size_t i = 0; i < (size_t)n * nh * hd; i++) {
        float x = f32_of_bf16(o0[i]), y = f32_of_bf16(o1[i]);
        if (!isfinite(x) || !isfinite(y)) {
            nonfinite++;
            continue;
        }
        num += (double)(y - x) * (y - x);
        den += (double)x * x;
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const bool ok_out = ok_fuse && nonfinite == 0 && rel < 1e-3;
    printf("%s attn_decode+rope fp8 KV %s: output against the two kernels "
           "rel_err %.3e (tol 1e-3)%s\n", ok_out ? "PASS" : "FAIL", what,
           rel, nonfinite ? ", NON-FINITE outputs" : "");
    g_fail += !ok_out;

    free(k0);
    free(k1);
    free(v0);
    free(v1);
    free(o0);
    free(o1);
    for (int r = 0; r < 2; r++) {
        cudaFree(d_k[r]);
        cudaFree(d_v[r]);
        cudaFree(d_out[r]);
    }
    void *dev_bufs[] = { d_q, d_qkv, d_bias, d_inv, d_scale, d_pos, d_slot,
                         d_bt, d_kvl, d_bto, d_ctx, d_mo, d_masks, d_ws };
    for (size_t i = 0; i < sizeof(dev_bufs) / sizeof(dev_bufs[0]); i++)
        cudaFree(dev_bufs[i]);
    free(perm);
    free(kc);
    free(vc);
    free(qkv);
    free(bvec);
}

static void test_fused_rope(void)
{
    static const attn_case_t cases[] = {
        { 32, 8, 128, "hd 128 group 4" },
        { 8, 8, 64, "hd 64 group 1" },
        { 28, 4, 128, "hd 128 group 7" },
        { 32, 2, 128, "hd 128 group 16" }, /* the heads-as-rows step */
    };

    setenv("BT_ATTN_TC", "1", 1);
    cuda_switches_reload();
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        fused_rope_run(&cases[c], 1, c == 0, 0);
        fused_rope_run(&cases[c], c != 1, c == 2, 64);
        fused_rope_run(&cases[c], 1, c == 1, 256);
    }
}

// ---------------------------------------------------------------------
// 4. the FP8 pool through the backend

#define POOL 64
#define PBS 8

static void cfg_kv8(backend_config_t *cfg)
{
    backend_config_init(cfg);
    cfg->n_kv_blocks = POOL;
    cfg->block_size = PBS;
    cfg->max_batch_tokens = 512;
    cfg->max_seqs = 8;
    cfg->precision = BACKEND_PRECISION_BF16;
    cfg->kv_dtype = BACKEND_KV_DTYPE_FP8;
}

/* Every block of the pool saved to host memory (n_blocks x bb bytes). */
static char *save_all(backend_t *be, size_t bb)
{
    char *h = calloc(POOL, bb);
    void *hp[POOL];
    int ids[POOL];

    for (int i = 0; i < POOL; i++) {
        hp[i] = h + (size_t)i * bb;
        ids[i] = i;
    }
    OK(backend_kv_save(be, POOL, ids, hp));
    return h;
}

static void test_pool(void)
{
    char path[512];
    model_t *m = NULL;
    backend_t *gpu = NULL, *cpu = NULL, *bf = NULL;
    backend_config_t cfg;
    const kv_layout_t *kl;
    int ids[40], table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *logits;
    bool ok;

    snprintf(path, sizeof(path), "%s/models/stories260K.bin",
             bt_golden_shared_dir());
    if (model_load(path, &m) != BT_OK) {
        printf("FAIL cannot load %s\n", path);
        g_fail++;
        return;
    }
    const model_config_t *mc = model_config(m);
    logits = malloc(sizeof(float) * (size_t)mc->vocab_size);
    for (int i = 0; i < 40; i++)
        ids[i] = 1 + (i * 37) % (mc->vocab_size - 1);

    cfg_kv8(&cfg);
    OK(backend_create("cuda", m, &cfg, &gpu));
    cfg_kv8(&cfg);
    cfg.kv_dtype = BACKEND_KV_DTYPE_BF16;
    OK(backend_create("cuda", m, &cfg, &bf));
    kl = backend_kv_layout(gpu);
    ok = kl->elem_size == 1 &&
         backend_kv_host_block_bytes(gpu) * 2 ==
             backend_kv_host_block_bytes(bf);
    printf("%s kv8 pool: elem_size %zu, host block %zu bytes (bf16: %zu)\n",
           ok ? "PASS" : "FAIL", kl->elem_size,
           backend_kv_host_block_bytes(gpu), backend_kv_host_block_bytes(bf));
    g_fail += !ok;
    backend_destroy(&bf);

    /* a 40-token prompt writes blocks 0..4 */
    {
        backend_seq_t seq = { .n_tokens = 40, .ctx_len = 0, .tokens = ids,
                              .block_table = table, .n_logits = 1 };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

        OK(backend_forward(gpu, &batch, logits, NULL));
        cfg_kv8(&cfg);
        cfg.n_threads = 0;
        OK(backend_create("cpu", m, &cfg, &cpu));
        OK(backend_forward(cpu, &batch, logits, NULL));
    }
    size_t bb = backend_kv_host_block_bytes(gpu);
    {
        /* save 0..4, load into 20..24, copy 20 -> 30 and slots of 21 to
         * 31, save again: the bytes travel unchanged */
        char *h = calloc(5, bb), *h2 = calloc(5, bb), *h3 = calloc(2, bb);
        void *hp[5], *hp2[5], *hp3[2];
        int src[5] = {0, 1, 2, 3, 4}, dst[5] = {20, 21, 22, 23, 24};
        int cp[2] = {30, 31}, ss[PBS], ds[PBS];
        bool written = false;

        for (int i = 0; i < 5; i++) {
            hp[i] = h + (size_t)i * bb;
            hp2[i] = h2 + (size_t)i * bb;
        }
        hp3[0] = h3;
        hp3[1] = h3 + bb;
        OK(backend_kv_save(gpu, 5, src, hp));
        OK(backend_kv_load(gpu, 5, dst, hp));
        OK(backend_kv_save(gpu, 5, dst, hp2));
        OK(backend_kv_copy_block(gpu, 20, 30));
        for (int i = 0; i < PBS; i++) {
            ss[i] = 21 * PBS + i;
            ds[i] = 31 * PBS + i;
        }
        OK(backend_kv_copy_slots(gpu, PBS, ss, ds));
        OK(backend_kv_save(gpu, 2, cp, hp3));
        for (size_t i = 0; i < 5 * bb && !written; i++)
            written = h[i] != 0;
        ok = written && memcmp(h, h2, 5 * bb) == 0 &&
             memcmp(h3, h, 2 * bb) == 0;
        printf("%s kv8 pool: blocks saved, loaded elsewhere, copied (block "
               "and slots), saved again: identical codes\n",
               ok ? "PASS" : "FAIL");
        g_fail += !ok;
        free(h);
        free(h2);
        free(h3);
    }
    {
        /* the cpu's codes for the same prompt (blocks 0..4) */
        char *hg = save_all(gpu, bb);
        size_t cbb = backend_kv_host_block_bytes(cpu);
        char *hc = cbb == bb ? save_all(cpu, bb) : NULL;
        long same = 0, near = 0, n = (long)(5 * bb);

        if (hc == NULL) {
            printf("FAIL kv8 pool: cpu host block %zu bytes, cuda %zu\n",
                   cbb, bb);
            g_fail++;
        } else {
            for (long i = 0; i < n; i++) {
                uint8_t a = (uint8_t)hg[i], b = (uint8_t)hc[i];
                same += a == b;
                near += (a & 0x80) == (b & 0x80) &&
                        abs((int)(a & 0x7F) - (int)(b & 0x7F)) <= 1;
            }
            ok = near >= n * 95 / 100;
            printf("%s kv8 pool: cuda codes vs the cpu's for one prompt: "
                   "%.2f%% identical, %.2f%% within one code (>= 95%% "
                   "held)\n", ok ? "PASS" : "FAIL", 100.0 * same / n,
                   100.0 * near / n);
            g_fail += !ok;
        }
        free(hg);
        free(hc);
    }
    backend_destroy(&cpu);
    backend_destroy(&gpu);

    /* refusals */
    cfg_kv8(&cfg);
    cfg.precision = BACKEND_PRECISION_F32;
    ok = backend_create("cuda", m, &cfg, &gpu) == BT_ERR_UNSUPPORTED;
    backend_destroy(&gpu);
    cfg_kv8(&cfg);
    cfg.tp_size = 2;
    ok = ok && backend_create("cuda", m, &cfg, &gpu) != BT_OK;
    backend_destroy(&gpu);
    printf("%s kv8 refused with precision f32 and with tp 2\n",
           ok ? "PASS" : "FAIL");
    g_fail += !ok;
    free(logits);
    model_destroy(&m);
}

// ---------------------------------------------------------------------
// 5. the widened prefill through the backend

static double rel_l2(const float *a, const float *b, int n)
{
    double num = 0.0, den = 0.0;

    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
}

/* The last logits of ids[0..n) fed as chunks of `chunk` tokens (1: a
 * token a step) into blocks 0.. of a fresh sequence. */
static void feed(backend_t *be, const int *ids, int n, int chunk,
                 const int *table, float *logits)
{
    for (int at = 0; at < n; at += chunk) {
        backend_seq_t seq = { .n_tokens = BT_MIN(chunk, n - at),
                              .ctx_len = at, .tokens = ids + at,
                              .block_table = table, .n_logits = 1 };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
        OK(backend_forward(be, &batch, logits, NULL));
    }
}

static void test_widened(void)
{
    enum { N = 200, WBS = 16 };
    model_t *m = NULL;
    backend_t *gpu = NULL;
    backend_config_t cfg;
    int ids[N], table[N / WBS + 1];

    if (model_load("synth:tiny-h128", &m) != BT_OK) {
        printf("FAIL cannot load synth:tiny-h128\n");
        g_fail++;
        return;
    }
    const model_config_t *mc = model_config(m);
    const int vocab = mc->vocab_size;
    if (!cuda_attn_prefill_widen_ok(mc->head_dim, mc->n_heads,
                                    mc->n_kv_heads, WBS)) {
        printf("INFO kv8 widened prefill: not on this device (no sm_90a "
               "wgmma): not checked\n");
        model_destroy(&m);
        return;
    }
    float *step = malloc(sizeof(float) * (size_t)vocab);
    float *one = malloc(sizeof(float) * (size_t)vocab);
    for (int i = 0; i < N; i++)
        ids[i] = 3 + (i * 131 + 7) % (vocab - 3);
    for (int i = 0; i < N / WBS + 1; i++)
        table[i] = 2 * i + 1; /* scattered: every other block */
    backend_config_init(&cfg);
    cfg.n_kv_blocks = 64;
    cfg.block_size = WBS;
    cfg.max_batch_tokens = 512;
    cfg.max_seqs = 8;
    cfg.precision = BACKEND_PRECISION_BF16;
    cfg.kv_dtype = BACKEND_KV_DTYPE_FP8;
    OK(backend_create("cuda", m, &cfg, &gpu));
    feed(gpu, ids, N, 1, table, step);
    static const int chunks[] = {N, 150};
    for (int c = 0; c < 2; c++) {
        double e;
        if (chunks[c] == N)
            feed(gpu, ids, N, N, table, one);
        else { /* a cached prefix of 150, then a chunk of 50 */
            feed(gpu, ids, 150, 150, table, one);
            backend_seq_t seq = { .n_tokens = N - 150, .ctx_len = 150,
                                  .tokens = ids + 150,
                                  .block_table = table, .n_logits = 1 };
            backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
            OK(backend_forward(gpu, &batch, one, NULL));
        }
        e = rel_l2(one, step, vocab);
        printf("%s kv8 widened prefill (synth:tiny-h128, %s) vs a token a "
               "step: rel L2 %.2e\n", e < 2e-2 ? "PASS" : "FAIL",
               chunks[c] == N ? "one chunk of 200" : "150 cached + 50",
               e);
        g_fail += !(e < 2e-2);
    }
    backend_destroy(&gpu);
    free(step);
    free(one);
    model_destroy(&m);
}

int main(void)
{
    int n_dev = 0;

    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("FAIL no CUDA device\n");
        return 1;
    }
    test_rope();
    test_attn(true);
    test_attn(false);
    test_fused_rope();
    test_pool();
    test_widened();
    printf("test_cuda_kv8: %s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
