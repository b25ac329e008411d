/*
 * test_cuda_fp8.c - the CUDA FP8 kernels (worker/cuda/kernels/fp8.h,
 * worker_gemm_fp8 in gemm.h) against the cpu backend's FP8 reference
 * (worker/cpu/cpu_fp8.c), op by op (needs a GPU; run by `make gpu-test`
 * and tests/gpu/run_gpu_fp8.sh, never by ctest):
 *   1. weight quantization on the device (per row, absmax / 448) gives
 *      the cpu's codes and scales bit for bit;
 *   2. GEMM-input quantization (static per-tensor scale or dynamic per
 *      token) gives cpu__fp8_quant_rows' codes and scales bit for bit;
 *   3. the product (FP8 GEMV up to 8 tokens, the skinny FP8 GEMM of
 *      9-64, "skinny", cuBLASLt's FP8 GEMM beyond and, forced, at 9-64:
 *      the scales inside the GEMM where cuBLASLt runs that, "cublaslt-vec",
 *      else and when forced f32 sums + the scaling epilogue,
 *      "cublaslt-epilogue") against cpu__fp8_gemm_ref on the same codes:
 *      relative error < 5e-2 (DEVICE.md's fp8 bound; f32 sums of exact
 *      products leave ~1e-3, the bf16 output's rounding), with per-channel
 *      and per-tensor weight scales, static and dynamic input scales, bf16
 *      output and the f32 residual's +=, on Llama-3-8B's shapes (q|k|v
 *      6144 x 4096, o 4096 x 4096, gate|up 28672 x 4096, down 4096 x
 *      14336) and the tiny models' (dim 64, hidden 172: padded rows), 1-8
 *      tokens (GEMV), 9-64 (skinny: 9, 16, 17, 24, 33, 37, 40, 57, 64, odd
 *      and padded K on the tiny shapes) and beyond (GEMM).  The reference
 *      is computed on a sample of up to 32 tokens x 256 rows of each
 *      product.  The skinny GEMM's mma.m16n8k32 fallback (no split K) is
 *      compared with its wgmma form (split K where the rows are few), and
 *      the wgmma form with the GEMV at 1, 4 and 8 tokens (skinny_small).
 *   4. the fused producers: cuda_fp8_glu_quant gives exactly cuda_swiglu
 *      then cuda_fp8_quant_act (same elementwise arithmetic);
 *      cuda_fp8_norm_quant the same as cuda_rmsnorm then
 *      cuda_fp8_quant_act up to the norm's sum order (dequantized
 *      relative difference < 1e-2, the differing codes counted).
 *   5. the conversion helpers (kernels/fp8_cvt.cuh, the hardware cvt the
 *      quantization and the FP8 KV writes use) give bt_f32_to_e4m3's
 *      codes bit for bit, and bt_e4m3_to_f32's values as bf16: every
 *      code's value, the midpoints between codes (ties) and +-1-3 ulps
 *      around them, the saturation range (448, 464, 480, inf), NaNs of
 *      both signs, zeros, the subnormal boundaries, every bf16 value, and
 *      random floats ([-1000, 1000], tiny magnitudes, raw bit patterns)
 *      ("fp8 cvt" line).
 *   6. the fused 1-token GEMV (cuda_gemv_fp8_fused: RMSNorm, SwiGLU or
 *      the bf16 row, quantized and multiplied in one kernel) gives the
 *      two kernels' outputs (the producer, then cuda_gemv_fp8) bit for
 *      bit on the 8B linears, dynamic and static input scales, bf16 out
 *      and f32 += (the norm: relative difference < 1e-2 required, the
 *      differing outputs counted); INFO lines time both per linear.
 * INFO lines time the 8B shapes (L2 flushed before each run): GB/s of
 * weights for the GEMV, TFLOP/s for the GEMM; gemm_paths checks both
 * cuBLASLt paths on the 8B shapes and prints one row per shape at 2048
 * tokens, old path (epilogue) vs new (vec), in TFLOP/s; skinny_paths
 * the skinny GEMM against the forced cuBLASLt at 16/32/64 tokens, us and
 * GB/s of weights.
 *   7. BT_FP8_FAST_ACCUM's two modes (gemm_accum_modes): everything
 *      above runs the default, cuBLASLt's fast accumulation; the 8B
 *      linears again in exact accumulation, checked as in 3 and timed
 *      against the default at 2048 tokens.
 * --paths runs only gemm_paths and 7; --skinny only skinny_paths and
 * skinny_small (the skinny GEMM checked and timed, ~20 s).
 * Prints one PASS/FAIL line per check; exits non-zero on any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bt_fp8.h"
#include "bt_test.h"
#include "cpu/cpu_int.h"
#include "cuda/cuda_switches.h"
#include "cuda/gemm.h"
#include "cuda/kernels/fp8.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/swiglu.h"
#include "gpu_test_util.h"

#define REF_TOK 32     /* tokens of a product checked against the cpu */
#define REF_ROWS 256   /* rows of it */
#define REL_MAX 5e-2
#define FLUSH_BYTES ((size_t)256 << 20)

static int g_fail;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    return u;
}

static float f32_of_bits(uint32_t u)
{
    float f;

    memcpy(&f, &u, 4);
    return f;
}

/* f and its neighbours: +-1..3 ulps (and its negative), into v. */
static size_t cvt_push_near(float *v, size_t n, float f)
{
    const uint32_t u = bits_of(f);

    for (int d = -3; d <= 3; d++) {
        const uint32_t w = (uint32_t)((int64_t)u + d);
        v[n++] = f32_of_bits(w);
        v[n++] = f32_of_bits(w ^ 0x80000000u);
    }
    return n;
}

/* Check 5: cuda_fp8_cvt_check's codes (the four- and the one-value
 * helper) against bt_f32_to_e4m3, its bf16 values against
 * bt_e4m3_to_f32's (a NaN code: any bf16 NaN). */
static void cvt_check(void)
{
    const size_t cap = (size_t)4 << 20;
    float *v = malloc(sizeof(float) * cap);
    uint8_t *q, *q1, *d_q, *d_q1;
    uint16_t *xv, *d_xv;
    float *d_x;
    size_t n = 0;
    long bad4 = 0, bad1 = 0, badv = 0;
    static const uint32_t specials[] = {
        0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, /* 0, denormals */
        0x7F800000u, 0x7F7FFFFFu,                           /* inf, FLT_MAX */
        0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0x7FFFFFFFu, /* NaNs */
        0x7FC00001u, 0x7FBFFFFFu,
    };
    static const float edges[] = {
        448.0f, 456.0f, 460.0f, 463.0f, 464.0f, 465.0f, 472.0f, 480.0f,
        496.0f, 500.0f, 512.0f, 1000.0f, 1.0e4f, 65504.0f, 1.0e30f,
        0.0009765625f,   /* 2^-10: half the smallest subnormal (tie) */
        0.001953125f,    /* 2^-9: the smallest subnormal */
        0.00048828125f,  /* 2^-11 */
        0.013671875f,    /* 7 * 2^-9: the largest subnormal */
        0.0146484375f,   /* between it and 2^-6 (tie, to even 2^-6) */
        0.015625f,       /* 2^-6: the smallest normal */
        1.0f, 1.0625f, 1.125f, 1.1875f, 240.0f, 416.0f, 432.0f, 440.0f,
    };

    if (v == NULL)
        exit(1);
    for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++)
        n = cvt_push_near(v, n, f32_of_bits(specials[i]));
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        n = cvt_push_near(v, n, edges[i]);
    for (int c = 0; c < 256; c++) { /* every code's value (NaNs too) */
        n = cvt_push_near(v, n, bt_e4m3_to_f32((uint8_t)c));
        if (c < 0x7E) { /* the tie between c and c + 1 */
            const float m = 0.5f * (bt_e4m3_to_f32((uint8_t)c) +
                                    bt_e4m3_to_f32((uint8_t)(c + 1)));
            n = cvt_push_near(v, n, m);
        }
    }
    for (uint32_t h = 0; h < 65536; h++) { /* every bf16, low bits 0/rand */
        v[n++] = f32_of_bits(h << 16);
        g_rng ^= g_rng << 13;
        g_rng ^= g_rng >> 7;
        g_rng ^= g_rng << 17;
        v[n++] = f32_of_bits(h << 16 | (uint32_t)(g_rng & 0xFFFF));
    }
    for (int i = 0; i < (1 << 20); i++) /* [-1000, 1000] */
        v[n++] = frand() * 1000.0f;
    for (int i = 0; i < (1 << 19); i++) { /* 2^-20 .. 2^10, any sign */
        g_rng ^= g_rng << 13;
        g_rng ^= g_rng >> 7;
        g_rng ^= g_rng << 17;
        const uint32_t e = 107u + (uint32_t)((g_rng >> 32) % 31u);
        v[n++] = f32_of_bits((uint32_t)(g_rng >> 63) << 31 | e << 23 |
                             (uint32_t)(g_rng & 0x7FFFFFu));
    }
    for (int i = 0; i < (1 << 19); i++) { /* raw bit patterns */
        g_rng ^= g_rng << 13;
        g_rng ^= g_rng >> 7;
        g_rng ^= g_rng << 17;
        v[n++] = f32_of_bits((uint32_t)(g_rng >> 16));
    }
    n += 3; /* a last partial group of the four-value helper */
    for (size_t i = n - 3; i < n; i++)
        v[i] = f32_of_bits(0xFFC00000u + (uint32_t)(n - i)); /* -NaNs */
    if (n > cap) {
        printf("FAIL fp8 cvt: %zu inputs > %zu\n", n, cap);
        exit(1);
    }
    q = malloc(n);
    q1 = malloc(n);
    xv = malloc(2 * n);
    CK(cudaMalloc((void **)&d_x, sizeof(float) * n));
    CK(cudaMalloc((void **)&d_q, n));
    CK(cudaMalloc((void **)&d_q1, n));
    CK(cudaMalloc((void **)&d_xv, 2 * n));
    CK(cudaMemcpy(d_x, v, sizeof(float) * n, cudaMemcpyHostToDevice));
    BT_ASSERT_OK(cuda_fp8_cvt_check(d_x, (int)n, d_q, d_q1, d_xv, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(q, d_q, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(q1, d_q1, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xv, d_xv, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        const uint8_t want = bt_f32_to_e4m3(v[i]);
        const float val = bt_e4m3_to_f32(q[i]);
        const bool vok = val != val ? (xv[i] & 0x7FFFu) > 0x7F80u
                                    : xv[i] == bf16_of(val);

        if (q[i] != want && bad4++ < 8)
            printf("INFO fp8 cvt x4: %08x (%g) -> %02x, bt %02x\n",
                   bits_of(v[i]), (double)v[i], q[i], want);
        if (q1[i] != want && bad1++ < 8)
            printf("INFO fp8 cvt x1: %08x (%g) -> %02x, bt %02x\n",
                   bits_of(v[i]), (double)v[i], q1[i], want);
        if (!vok && badv++ < 8)
            printf("INFO fp8 cvt bf16: code %02x -> %04x, want %04x\n",
                   q[i], xv[i], bf16_of(val));
    }
    printf("%s fp8 cvt (hardware e4m3x2 vs bt_f32_to_e4m3): %zu inputs, "
           "%ld / %ld codes (x4 / x1) and %ld bf16 values differ\n",
           bad4 || bad1 || badv ? "FAIL" : "PASS", n, bad4, bad1, badv);
    g_fail += bad4 || bad1 || badv;
    cudaFree(d_xv);
    cudaFree(d_q1);
    cudaFree(d_q);
    cudaFree(d_x);
    free(xv);
    free(q1);
    free(q);
    free(v);
}

/* One weight shape on the device, quantized one way. */
typedef struct {
    int n_out, n_in, ld;
    bool per_tensor;
    uint8_t *h_q;      /* (n_out, n_in) the cpu's codes */
    float *h_ws;       /* (n_out); per tensor: all equal */
    uint8_t *d_q;      /* (n_out, ld) */
    float *d_ws;
} wt_t;

/* Quantizes w (n_out, n_in) as the cpu does (cpu_backend.c cpu_fp8_row;
 * per tensor: one absmax / 448 for all rows, as a checkpoint has). */
static void host_quant_w(const float *w, wt_t *q)
{
    float gmax = 0.0f;

    if (q->per_tensor)
        for (size_t i = 0; i < (size_t)q->n_out * q->n_in; i++)
            gmax = fmaxf(gmax, fabsf(w[i]));
    for (int r = 0; r < q->n_out; r++) {
        const float *wr = w + (size_t)r * q->n_in;
        float amax = 0.0f, s, inv;

        for (int i = 0; i < q->n_in; i++)
            amax = fmaxf(amax, fabsf(wr[i]));
        s = bt_fp8_scale(q->per_tensor ? gmax : amax);
        inv = 1.0f / s;
        for (int i = 0; i < q->n_in; i++)
            q->h_q[(size_t)r * q->n_in + i] = bt_f32_to_e4m3(wr[i] * inv);
        q->h_ws[r] = s;
    }
}

/* Weights of the shape with rows of different magnitudes (so per-row
 * scales matter); per channel: quantized on the device and checked
 * against the host's codes (check 1); per tensor: the host's codes
 * uploaded, as a checkpoint's are. */
static void wt_make(wt_t *q, int n_out, int n_in, bool per_tensor,
                    const char *name)
{
    size_t n = (size_t)n_out * n_in;
    float *w = malloc(sizeof(float) * n);
    uint8_t *back;
    float *ws_back;
    long bad = 0;

    memset(q, 0, sizeof(*q));
    q->n_out = n_out;
    q->n_in = n_in;
    q->ld = cuda_fp8_ld(n_in);
    q->per_tensor = per_tensor;
    q->h_q = malloc(n);
    q->h_ws = malloc(sizeof(float) * n_out);
    for (int r = 0; r < n_out; r++) {
        float mag = 0.02f * (1.0f + (float)(r % 13));
        for (int i = 0; i < n_in; i++)
            w[(size_t)r * n_in + i] = frand() * mag;
    }
    host_quant_w(w, q);
    CK(cudaMalloc((void **)&q->d_q, (size_t)n_out * q->ld));
    CK(cudaMalloc((void **)&q->d_ws, sizeof(float) * n_out));
    CK(cudaMemset(q->d_q, 0xFF, (size_t)n_out * q->ld)); /* padding too */
    if (per_tensor) {
        CK(cudaMemset(q->d_q, 0, (size_t)n_out * q->ld));
        CK(cudaMemcpy2D(q->d_q, q->ld, q->h_q, n_in, n_in, n_out,
                        cudaMemcpyHostToDevice));
        CK(cudaMemcpy(q->d_ws, q->h_ws, sizeof(float) * n_out,
                      cudaMemcpyHostToDevice));
        free(w);
        return;
    }
    {
        float *d_w;

        CK(cudaMalloc((void **)&d_w, sizeof(float) * n));
        CK(cudaMemcpy(d_w, w, sizeof(float) * n, cudaMemcpyHostToDevice));
        BT_ASSERT_OK(cuda_fp8_quant_weight(d_w, n_out, n_in, q->ld, q->d_q,
                                           q->d_ws, NULL));
        CK(cudaDeviceSynchronize());
        CK(cudaFree(d_w));
    }
    back = malloc((size_t)n_out * q->ld);
    ws_back = malloc(sizeof(float) * n_out);
    CK(cudaMemcpy(back, q->d_q, (size_t)n_out * q->ld,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ws_back, q->d_ws, sizeof(float) * n_out,
                  cudaMemcpyDeviceToHost));
    for (int r = 0; r < n_out; r++) {
        bad += ws_back[r] != q->h_ws[r];
        for (int i = 0; i < q->ld; i++)
            bad += back[(size_t)r * q->ld + i] !=
                   (i < n_in ? q->h_q[(size_t)r * n_in + i] : 0);
    }
    printf("%s fp8 weight quantization %s %d x %d: %ld of %zu codes and "
           "scales differ from the cpu's\n", bad ? "FAIL" : "PASS", name,
           n_out, n_in, bad, (size_t)n_out * q->ld + n_out);
    g_fail += bad != 0;
    free(back);
    free(ws_back);
    free(w);
}

static void wt_free(wt_t *q)
{
    cudaFree(q->d_q);
    cudaFree(q->d_ws);
    free(q->h_q);
    free(q->h_ws);
}

/* Device buffers shared by the runs (sized for the largest). */
typedef struct {
    worker_gemm_ctx_t *ctx;
    void *d_x;        /* bf16 inputs */
    uint8_t *d_xq;
    void *d_xv;
    float *d_xs;
    void *d_y;
    float *d_acc;
    size_t acc_floats;
    void *d_flush;
    cuda_gemv_ws_t ws; /* split-K scratch of the skinny GEMM timed alone */
    const struct fused_in_s *fin; /* OP_FUSED / OP_TWO's input */
} bufs_t;

/* Llama-3-8B's four linears (o and down accumulate into the residual)
 * and what feeds each in a layer (the engine's cuda_fp8_linear). */
typedef struct {
    const char *name;
    int n_out, n_in;
    bool acc;
    cuda_fp8_in_t in;
} lin8b_t;

#define N_LIN8B 4
static const lin8b_t g_lin8b[N_LIN8B] = {
    { "8b qkv", 6144, 4096, false, CUDA_FP8_IN_NORM },
    { "8b o", 4096, 4096, true, CUDA_FP8_IN_ROWS },
    { "8b gate_up", 28672, 4096, false, CUDA_FP8_IN_NORM },
    { "8b down", 4096, 14336, true, CUDA_FP8_IN_GLU },
};

/* The input of a 1-token product made inside it (fused_gemv): the
 * device row d_in (f32 for the norm, bf16 else; the gate|up row for
 * the SwiGLU), the norm's weights d_g. */
typedef struct fused_in_s {
    cuda_fp8_in_t in;
    const void *d_in, *d_g;
    float in_scale;
} fused_in_t;

#define FUSED_EPS 1e-5f

/* What time_op times: worker_gemm_fp8 (whichever path it takes), or on
 * b's current inputs the FP8 GEMV or the skinny GEMM (wgmma, split K
 * through b->ws as the engine's context does) directly, or a 1-token
 * product from fused_in_t's input: the fused GEMV, or the two kernels
 * it replaces (fused_enqueue). */
typedef enum { OP_GEMM, OP_GEMV, OP_SKINNY, OP_FUSED, OP_TWO } op_t;

/* One token's product from f's input into b->d_y: cuda_gemv_fp8_fused,
 * or (!fused) the producer of f->in writing bf16 values and the scale
 * then cuda_gemv_fp8's rows kernel (the engine's path before the fused
 * kernel, still its path where cuda_gemv_fp8_fused_ok is false). */
static bt_status_t fused_enqueue(bufs_t *b, const wt_t *q,
                                 const fused_in_t *f, bool fused,
                                 cuda_dtype_t out_dt, bool acc)
{
    bt_status_t st;

    if (fused)
        return cuda_gemv_fp8_fused(f->in, f->d_in, f->d_g, FUSED_EPS,
                                   q->n_in, q->ld, f->in_scale, q->d_q,
                                   q->d_ws, q->n_out, b->d_y, out_dt, acc,
                                   NULL);
    if (f->in == CUDA_FP8_IN_NORM)
        st = cuda_fp8_norm_quant(f->d_in, f->d_g, FUSED_EPS, 1, q->n_in,
                                 q->ld, f->in_scale, NULL, b->d_xv, b->d_xs,
                                 NULL);
    else if (f->in == CUDA_FP8_IN_GLU)
        st = cuda_fp8_glu_quant(f->d_in, 1, q->n_in, q->ld, f->in_scale,
                                NULL, b->d_xv, b->d_xs, NULL);
    else
        st = cuda_fp8_quant_act(f->d_in, CUDA_DT_BF16, 1, q->n_in, q->ld,
                                f->in_scale, NULL, b->d_xv, b->d_xs, NULL);
    if (st != BT_OK)
        return st;
    return cuda_gemv_fp8(1, q->n_out, q->ld, NULL, b->d_xv, b->d_xs, q->d_q,
                         q->d_ws, b->d_y, out_dt, acc, NULL);
}

/* Median time (us) of 9 runs of op, L2 flushed before each. */
static float time_op(bufs_t *b, const wt_t *q, int n_tok,
                     const worker_gemm_fp8_t *a, cuda_dtype_t out_dt,
                     bool acc, op_t op)
{
    enum { REPS = 9 };
    float t[REPS];
    cudaEvent_t e0, e1;

    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < REPS; i++) {
        BT_ASSERT_OK(cuda_l2_flush(b->d_flush, FLUSH_BYTES, NULL));
        CK(cudaEventRecord(e0, NULL));
        if (op == OP_GEMM)
            BT_ASSERT_OK(worker_gemm_fp8(b->ctx, n_tok, q->n_out, q->ld, a,
                                         b->d_y, out_dt, acc, NULL));
        else if (op == OP_FUSED || op == OP_TWO)
            BT_ASSERT_OK(fused_enqueue(b, q, b->fin, op == OP_FUSED, out_dt,
                                       acc));
        else if (op == OP_SKINNY)
            BT_ASSERT_OK(cuda_gemm_fp8_skinny(n_tok, q->n_out, q->ld,
                                              b->d_xq, b->d_xs, q->d_q,
                                              q->d_ws, b->d_y, out_dt, acc,
                                              true, &b->ws, NULL));
        else
            BT_ASSERT_OK(cuda_gemv_fp8(n_tok, q->n_out, q->ld, b->d_xq,
                                       n_tok == 1 ? b->d_xv : NULL, b->d_xs,
                                       q->d_q, q->d_ws, b->d_y, out_dt, acc,
                                       NULL));
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    for (int i = 1; i < REPS; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t[REPS / 2] * 1000.0f;
}

/* One product: n_tok inputs quantized on the device (check 2), the
 * product (check 3), optionally timed (the median time in us returned;
 * 0 untimed).  The PASS line names the path worker_gemm_fp8 took: gemv,
 * cublaslt-vec (the scales inside the GEMM) or cublaslt-epilogue (f32
 * sums + cuda_fp8_scale_out). */
static float run(bufs_t *b, const wt_t *q, const char *name, int n_tok,
                 bool static_act, bool acc, bool timed)
{
    const int n_in = q->n_in, ld = q->ld, n_out = q->n_out;
    const cuda_dtype_t out_dt = acc ? CUDA_DT_F32 : CUDA_DT_BF16;
    const size_t oes = acc ? 4 : 2;
    size_t nx = (size_t)n_tok * n_in;
    uint16_t *hx = malloc(2 * nx);
    float *xf = malloc(sizeof(float) * nx), *xqf = malloc(sizeof(float) * nx);
    float *xs = malloc(sizeof(float) * n_tok), *xs_d = malloc(4 * n_tok);
    uint8_t *xq_d = malloc((size_t)n_tok * ld);
    uint16_t *xv_d = malloc((size_t)n_tok * ld * 2);
    float *y0 = NULL;
    void *y = malloc((size_t)n_tok * n_out * oes);
    float in_scale = 0.0f, gmax = 0.0f;
    long qbad = 0;
    bool gemv;
    worker_gemm_fp8_t a;
    char what[192];
    const char *path;
    float us = 0.0f;

    snprintf(what, sizeof(what), "%s %d x %d, %s weights, %s inputs, %d "
             "tokens, %s", name, n_out, n_in,
             q->per_tensor ? "per-tensor" : "per-channel",
             static_act ? "static" : "dynamic", n_tok,
             acc ? "f32 +=" : "bf16 out");
    for (int t = 0; t < n_tok; t++) {
        float mag = 0.5f + 0.25f * (float)(t % 9);
        for (int i = 0; i < n_in; i++) {
            size_t k = (size_t)t * n_in + i;
            /* an outlier column or two, as real activations have */
            float v = frand() * mag * (i % 97 == 3 ? 8.0f : 1.0f);
            hx[k] = bf16_of(v);
            xf[k] = f32_of_bf16(hx[k]);
            gmax = fmaxf(gmax, fabsf(xf[k]));
        }
    }
    if (static_act) /* a calibrated scale a little under the absmax */
        in_scale = 0.8f * gmax / 448.0f;
    CK(cudaMemcpy(b->d_x, hx, 2 * nx, cudaMemcpyHostToDevice));
    BT_ASSERT_OK(cuda_fp8_quant_act(b->d_x, CUDA_DT_BF16, n_tok, n_in, ld,
                                    in_scale, b->d_xq, b->d_xv, b->d_xs,
                                    NULL));
    CK(cudaDeviceSynchronize());
    cpu__fp8_quant_rows(xqf, xs, xf, n_in, n_tok, n_in, in_scale);
    CK(cudaMemcpy(xq_d, b->d_xq, (size_t)n_tok * ld, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xv_d, b->d_xv, (size_t)n_tok * ld * 2,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xs_d, b->d_xs, 4 * n_tok, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n_tok; t++) {
        qbad += xs_d[t] != xs[t];
        for (int i = 0; i < ld; i++) {
            uint8_t c = xq_d[(size_t)t * ld + i];
            float want = i < n_in ? xqf[(size_t)t * n_in + i] : 0.0f;
            qbad += bt_e4m3_to_f32(c) != want || (i >= n_in && c != 0);
            qbad += f32_of_bf16(xv_d[(size_t)t * ld + i]) != want;
        }
    }
    if (qbad || n_tok == 1 || n_tok == 2048) {
        printf("%s fp8 input quantization %s: %ld of %d codes, values and "
               "scales differ from cpu__fp8_quant_rows\n",
               qbad ? "FAIL" : "PASS", what, qbad, n_tok * (2 * ld + 1));
        g_fail += qbad != 0;
    }

    if (acc) {
        float *h0 = malloc(sizeof(float) * (size_t)n_tok * n_out);
        for (size_t i = 0; i < (size_t)n_tok * n_out; i++)
            h0[i] = frand();
        CK(cudaMemcpy(b->d_y, h0, sizeof(float) * (size_t)n_tok * n_out,
                      cudaMemcpyHostToDevice));
        y0 = h0;
    }
    gemv = worker_gemm_fp8_gemv(b->ctx, n_tok, n_out, ld, b->acc_floats);
    a = (worker_gemm_fp8_t){ b->d_xq, b->d_xv, b->d_xs, q->d_q, q->d_ws,
                             b->d_acc, b->acc_floats, gemv };
    BT_ASSERT_OK(worker_gemm_fp8(b->ctx, n_tok, n_out, ld, &a, b->d_y,
                                 out_dt, acc, NULL));
    /* (asked after the call: a shape cuBLASLt refused at it is known) */
    path = gemv ? (worker_gemm_fp8_uses_skinny(b->ctx, n_tok, &a)
                       ? "skinny" : "gemv")
           : worker_gemm_fp8_uses_vec(b->ctx, n_tok, n_out, ld, &a, out_dt,
                                      acc, NULL)
               ? "cublaslt-vec"
               : "cublaslt-epilogue";
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(y, b->d_y, (size_t)n_tok * n_out * oes,
                  cudaMemcpyDeviceToHost));

    /* the reference on a sample of tokens and rows */
    {
        int nt = n_tok < REF_TOK ? n_tok : REF_TOK;
        int nr = n_out < REF_ROWS ? n_out : REF_ROWS;
        int *ti = malloc(sizeof(int) * nt), *ri = malloc(sizeof(int) * nr);
        uint8_t *sxq = malloc((size_t)nt * n_in);
        uint8_t *swq = malloc((size_t)nr * n_in);
        float *sxs = malloc(sizeof(float) * nt), *sws = malloc(4 * nr);
        float *ref = malloc(sizeof(float) * (size_t)nt * nr);
        double num = 0.0, den = 0.0;
        long nonfinite = 0;

        for (int i = 0; i < nt; i++) {
            ti[i] = (int)((long)i * (n_tok - 1) / (nt > 1 ? nt - 1 : 1));
            sxs[i] = xs[ti[i]];
            for (int j = 0; j < n_in; j++)
                sxq[(size_t)i * n_in + j] =
                    bt_f32_to_e4m3(xqf[(size_t)ti[i] * n_in + j]);
        }
        for (int i = 0; i < nr; i++) {
            ri[i] = (int)((long)i * (n_out - 1) / (nr > 1 ? nr - 1 : 1));
            sws[i] = q->h_ws[ri[i]];
            memcpy(swq + (size_t)i * n_in, q->h_q + (size_t)ri[i] * n_in,
                   (size_t)n_in);
        }
        cpu__fp8_gemm_ref(ref, sxq, sxs, swq, sws,
                          q->per_tensor ? 1 : nr, nt, n_in, nr);
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < nr; j++) {
                size_t k = (size_t)ti[i] * n_out + ri[j];
                double g = acc ? (double)((float *)y)[k] - (double)y0[k]
                               : (double)f32_of_bf16(((uint16_t *)y)[k]);
                double r = ref[(size_t)i * nr + j];

                if (!isfinite(g))
                    nonfinite++;
                num += (g - r) * (g - r);
                den += r * r;
            }
        {
            double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
            bool ok = rel < REL_MAX && nonfinite == 0;

            printf("%s fp8 %s %s: relative error %.2e vs cpu__fp8_gemm_ref "
                   "(%d tokens x %d rows checked)\n", ok ? "PASS" : "FAIL",
                   path, what, rel, nt, nr);
            g_fail += !ok;
        }
        free(ti);
        free(ri);
        free(sxq);
        free(swq);
        free(sxs);
        free(sws);
        free(ref);
    }
    if (timed) {
        double bytes = (double)n_out * ld + (double)n_tok * ld * 2.0;
        double flops = 2.0 * n_tok * (double)n_out * n_in;

        us = time_op(b, q, n_tok, &a, out_dt, acc, OP_GEMM);
        printf("INFO fp8 time %s %s: %.1f us, %.0f GB/s of weights and "
               "inputs, %.1f TFLOP/s\n", path, what, us, bytes / us * 1e-3,
               flops / us * 1e-6);
    }
    free(hx);
    free(xf);
    free(xqf);
    free(xs);
    free(xs_d);
    free(xq_d);
    free(xv_d);
    free(y0);
    free(y);
    return us;
}

/* Quantizes n_tok rows of k through the fused producer (glu: SwiGLU of
 * (n_tok, 2k) bf16 gate|up rows; else RMSNorm of (n_tok, k) f32 rows)
 * and through the unfused kernels, and compares (check 4). */
static void fused_one(bufs_t *b, bool glu, int n_tok, int k, bool st)
{
    const int ld = cuda_fp8_ld(k);
    const size_t nin = (size_t)n_tok * k * (glu ? 2 : 1);
    const float eps = 1e-5f, in_scale = st ? 0.01f : 0.0f;
    uint8_t *qa = malloc((size_t)n_tok * ld), *qb = malloc((size_t)n_tok * ld);
    float *sa = malloc(4 * n_tok), *sb = malloc(4 * n_tok);
    void *d_in, *d_mid, *d_g = NULL;
    long diff = 0;
    double num = 0.0, den = 0.0, rel;
    bool ok;

    CK(cudaMalloc(&d_in, nin * 4));
    CK(cudaMalloc(&d_mid, (size_t)n_tok * k * 2));
    if (glu) {
        uint16_t *h = malloc(nin * 2);
        for (size_t i = 0; i < nin; i++)
            h[i] = bf16_of(3.0f * frand());
        CK(cudaMemcpy(d_in, h, nin * 2, cudaMemcpyHostToDevice));
        free(h);
        BT_ASSERT_OK(cuda_swiglu(d_in, n_tok, k, d_mid, CUDA_DT_BF16, NULL));
    } else {
        float *h = malloc(nin * 4);
        uint16_t *g = malloc((size_t)k * 2);
        for (size_t i = 0; i < nin; i++)
            h[i] = 2.0f * frand() * (i % 61 == 7 ? 10.0f : 1.0f);
        for (int i = 0; i < k; i++)
            g[i] = bf16_of(1.0f + 0.5f * frand());
        CK(cudaMalloc(&d_g, (size_t)k * 2));
        CK(cudaMemcpy(d_in, h, nin * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_g, g, (size_t)k * 2, cudaMemcpyHostToDevice));
        free(h);
        free(g);
        BT_ASSERT_OK(cuda_rmsnorm(d_in, NULL, d_g, NULL, n_tok, k, eps,
                                  d_mid, CUDA_DT_BF16, NULL));
    }
    BT_ASSERT_OK(cuda_fp8_quant_act(d_mid, CUDA_DT_BF16, n_tok, k, ld,
                                    in_scale, b->d_xq, NULL, b->d_xs, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(qa, b->d_xq, (size_t)n_tok * ld, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sa, b->d_xs, 4 * n_tok, cudaMemcpyDeviceToHost));
    CK(cudaMemset(b->d_xq, 0xFF, (size_t)n_tok * ld));
    if (glu)
        BT_ASSERT_OK(cuda_fp8_glu_quant(d_in, n_tok, k, ld, in_scale,
                                        b->d_xq, NULL, b->d_xs, NULL));
    else
        BT_ASSERT_OK(cuda_fp8_norm_quant(d_in, d_g, eps, n_tok, k, ld,
                                         in_scale, b->d_xq, NULL, b->d_xs,
                                         NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(qb, b->d_xq, (size_t)n_tok * ld, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sb, b->d_xs, 4 * n_tok, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < ld; i++) {
            uint8_t ca = qa[(size_t)t * ld + i], cb = qb[(size_t)t * ld + i];
            double va = (double)bt_e4m3_to_f32(ca) * sa[t];
            double vb = (double)bt_e4m3_to_f32(cb) * sb[t];

            diff += ca != cb || (i == 0 && sa[t] != sb[t]);
            num += (va - vb) * (va - vb);
            den += va * va;
        }
    rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    ok = glu ? diff == 0 : rel < 1e-2 && isfinite(rel);
    printf("%s fp8 fused %s + quantization, %d tokens x %d, %s: %ld codes "
           "or scales differ from the unfused kernels, relative %.2e\n",
           ok ? "PASS" : "FAIL", glu ? "SwiGLU" : "RMSNorm", n_tok, k,
           st ? "static" : "dynamic", diff, rel);
    g_fail += !ok;
    cudaFree(d_in);
    cudaFree(d_mid);
    cudaFree(d_g);
    free(qa);
    free(qb);
    free(sa);
    free(sb);
}

static const char *fused_in_name(cuda_fp8_in_t in)
{
    return in == CUDA_FP8_IN_NORM  ? "RMSNorm"
           : in == CUDA_FP8_IN_GLU ? "SwiGLU"
                                   : "bf16 row";
}

/* Check 5 on one linear, one input scale and output kind: the fused
 * 1-token GEMV against the two kernels (fused_enqueue) from the same
 * y (random for +=).  The same outputs bit for bit: the same arithmetic
 * step by step, and for the norm qf8_vec_kernel's order of the sum of
 * squares (gemv_fp8.cu), though only a relative difference < 1e-2 is
 * required there (the order is the fused kernel's one documented
 * freedom); the differing outputs are counted.  Timed when `timed`. */
static void fused_gemv_one(bufs_t *b, const wt_t *q, const lin8b_t *sh,
                           const fused_in_t *f, bool acc, bool timed)
{
    const cuda_dtype_t out_dt = acc ? CUDA_DT_F32 : CUDA_DT_BF16;
    const size_t oes = acc ? 4 : 2, ny = (size_t)q->n_out;
    float *h0 = malloc(sizeof(float) * ny);
    unsigned char *ya = malloc(ny * oes), *yb = malloc(ny * oes);
    double num = 0.0, den = 0.0, rel;
    long diff = 0;
    bool ok;

    for (size_t i = 0; i < ny; i++)
        h0[i] = frand();
    for (int fused = 0; fused < 2; fused++) {
        if (acc)
            CK(cudaMemcpy(b->d_y, h0, sizeof(float) * ny,
                          cudaMemcpyHostToDevice));
        else
            CK(cudaMemset(b->d_y, 0xFF, ny * oes));
        BT_ASSERT_OK(fused_enqueue(b, q, f, fused == 1, out_dt, acc));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(fused ? yb : ya, b->d_y, ny * oes,
                      cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < ny; i++) {
        double va, vb;

        if (acc) {
            float fa, fb;
            memcpy(&fa, ya + 4 * i, 4);
            memcpy(&fb, yb + 4 * i, 4);
            va = fa;
            vb = fb;
        } else {
            uint16_t ha, hb;
            memcpy(&ha, ya + 2 * i, 2);
            memcpy(&hb, yb + 2 * i, 2);
            va = f32_of_bf16(ha);
            vb = f32_of_bf16(hb);
        }
        diff += memcmp(ya + oes * i, yb + oes * i, oes) != 0;
        num += (va - vb) * (va - vb);
        den += va * va;
    }
    rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    ok = f->in == CUDA_FP8_IN_NORM ? rel < 1e-2 && isfinite(rel)
                                   : diff == 0;
    printf("%s fp8 fused gemv %s %d x %d, %s input, %s, %s: %ld of %zu "
           "outputs differ from the two kernels, relative %.2e\n",
           ok ? "PASS" : "FAIL", sh->name, q->n_out, q->n_in,
           fused_in_name(f->in), f->in_scale > 0.0f ? "static" : "dynamic",
           acc ? "f32 +=" : "bf16 out", diff, ny, rel);
    g_fail += !ok;
    if (timed) {
        float us_f, us_t;

        b->fin = f;
        us_f = time_op(b, q, 1, NULL, out_dt, acc, OP_FUSED);
        us_t = time_op(b, q, 1, NULL, out_dt, acc, OP_TWO);
        b->fin = NULL;
        printf("INFO fp8 fused gemv %s %d x %d (%s, %s, %s): fused %.1f us, "
               "two kernels %.1f us (%.2fx)\n", sh->name, q->n_out, q->n_in,
               fused_in_name(f->in),
               f->in_scale > 0.0f ? "static" : "dynamic",
               acc ? "f32 +=" : "bf16 out", us_f, us_t, us_t / us_f);
    }
    free(h0);
    free(ya);
    free(yb);
}

/* Check 5: the fused 1-token GEMV (cuda_gemv_fp8_fused) against the two
 * kernels it replaces on the 8B linears, each fed as in a layer (q|k|v
 * and gate|up: the RMSNorm of an f32 residual row; o: a bf16 row; down:
 * the SwiGLU of a gate|up row), dynamic and static input scales, bf16
 * out and f32 +=; the linear's own output kind timed (L2 flushed). */
static void fused_gemv(bufs_t *b)
{
    void *d_in, *d_g;

    CK(cudaMalloc(&d_in, (size_t)2 * 14336 * 2));
    CK(cudaMalloc(&d_g, (size_t)4096 * 2));
    for (int i = 0; i < N_LIN8B; i++) {
        const lin8b_t *sh = &g_lin8b[i];
        const int n = sh->n_in;
        wt_t q;

        wt_make(&q, sh->n_out, n, false, sh->name);
        if (sh->in == CUDA_FP8_IN_NORM) {
            float *h = malloc(sizeof(float) * n);
            uint16_t *g = malloc((size_t)n * 2);

            for (int j = 0; j < n; j++) {
                h[j] = 2.0f * frand() * (j % 61 == 7 ? 10.0f : 1.0f);
                g[j] = bf16_of(1.0f + 0.5f * frand());
            }
            CK(cudaMemcpy(d_in, h, sizeof(float) * n,
                          cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_g, g, (size_t)n * 2, cudaMemcpyHostToDevice));
            free(h);
            free(g);
        } else {
            const int m = sh->in == CUDA_FP8_IN_GLU ? 2 * n : n;
            uint16_t *h = malloc((size_t)m * 2);

            for (int j = 0; j < m; j++)
                h[j] = bf16_of(sh->in == CUDA_FP8_IN_GLU
                                   ? 3.0f * frand()
                                   : frand() * (j % 97 == 3 ? 8.0f : 1.0f));
            CK(cudaMemcpy(d_in, h, (size_t)m * 2, cudaMemcpyHostToDevice));
            free(h);
        }
        for (int st = 0; st < 2; st++) {
            /* static: a calibrated-like scale, some values saturating */
            const fused_in_t f = { sh->in, d_in,
                                   sh->in == CUDA_FP8_IN_NORM ? d_g : NULL,
                                   st ? 0.02f : 0.0f };

            for (int acc = 0; acc < 2; acc++)
                fused_gemv_one(b, &q, sh, &f, acc == 1,
                               (acc == 1) == sh->acc);
        }
        wt_free(&q);
    }
    cudaFree(d_in);
    cudaFree(d_g);
}

/* The cuBLASLt FP8 GEMM's two paths on the 8B prefill shapes (issue 37):
 * the scales inside the GEMM (cublaslt-vec, the default where cuBLASLt
 * runs it) and the f32 sums + scaling epilogue it falls back to (forced
 * here with worker_gemm_fp8_force_epilogue), each checked against
 * cpu__fp8_gemm_ref and timed at 2048 tokens, then one row per shape:
 * old path vs new in TFLOP/s.  Token counts that are not multiples of 16
 * and static input scales are checked on both paths too. */
static void gemm_paths(bufs_t *b)
{
    const lin8b_t *sh = g_lin8b;
    /* (2053, 4100, 8191: an aggregated worker's mixed steps) */
    static const int toks[] = { 9, 100, 1000, 2053, 4100, 8191 };
    float t_new[N_LIN8B], t_old[N_LIN8B];
    bool vec[N_LIN8B];

    for (int i = 0; i < N_LIN8B; i++) {
        wt_t q;

        wt_make(&q, sh[i].n_out, sh[i].n_in, false, sh[i].name);
        for (int forced = 0; forced < 2; forced++) {
            worker_gemm_fp8_t a = { b->d_xq, b->d_xv, b->d_xs, q.d_q,
                                    q.d_ws, b->d_acc, b->acc_floats, false };
            float *t = forced ? &t_old[i] : &t_new[i];

            worker_gemm_fp8_force_epilogue(b->ctx, forced == 1);
            *t = run(b, &q, sh[i].name, 2048, false, sh[i].acc, true);
            if (!forced)
                vec[i] = worker_gemm_fp8_uses_vec(
                    b->ctx, 2048, q.n_out, q.ld, &a,
                    sh[i].acc ? CUDA_DT_F32 : CUDA_DT_BF16, sh[i].acc, NULL);
            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++)
                run(b, &q, sh[i].name, toks[k], k == 1, sh[i].acc, false);
        }
        worker_gemm_fp8_force_epilogue(b->ctx, false);
        wt_free(&q);
    }
    printf("INFO fp8 cuBLASLt GEMM, 2048 tokens, old path (f32 sums + "
           "cuda_fp8_scale_out) vs new (scales in the GEMM, tuned):\n");
    for (int i = 0; i < N_LIN8B; i++) {
        const double fl = 2.0 * 2048 * (double)sh[i].n_out * sh[i].n_in;

        printf("INFO fp8 gemm 2048 x %d x %d %s: old %.1f us %.0f TFLOP/s, "
               "new %.1f us %.0f TFLOP/s (%s), x%.2f\n", sh[i].n_out,
               sh[i].n_in, sh[i].acc ? "f32 +=" : "bf16 out", t_old[i],
               fl / t_old[i] * 1e-6, t_new[i], fl / t_new[i] * 1e-6,
               vec[i] ? "cublaslt-vec" : "cublaslt-epilogue: no scale "
                                         "vectors in this cuBLASLt",
               t_old[i] / t_new[i]);
    }
}

/* A product kernel called directly, for agree_check. */
typedef enum {
    K_GEMV,        /* the FP8 GEMV on the codes (its mma kernel) */
    K_SKINNY_WG,   /* the skinny GEMM on wgmma, split K through b->ws
                      as gemm.c runs it */
    K_SKINNY_MMA   /* its mma.m16n8k32 fallback (no workspace: no split) */
} kernel_t;

static const char *kernel_name(kernel_t k)
{
    return k == K_GEMV        ? "gemv (codes)"
           : k == K_SKINNY_WG ? "skinny wgmma"
                              : "skinny mma.m16n8k32 fallback";
}

/* One kernel against worker_gemm_fp8's product that run() left in
 * b->d_y (bf16 out, the inputs of its n_tok tokens in b->d_xq, the
 * routed product checked against the reference there): relative
 * difference < REL_MAX (they sum in different orders and precisions).
 * The kernels gemm_fp8.c does not route to on this device are checked
 * this way: the skinny GEMM's fallback, and the GEMV at 2-8 tokens, the
 * fallback of devices without wgmma. */
static void agree_check(bufs_t *b, const wt_t *q, const char *name,
                        int n_tok, kernel_t k)
{
    const size_t ny = (size_t)n_tok * q->n_out;
    uint16_t *ya = malloc(2 * ny), *yb = malloc(2 * ny);
    double num = 0.0, den = 0.0, rel;
    bool ok;

    CK(cudaMemcpy(ya, b->d_y, 2 * ny, cudaMemcpyDeviceToHost));
    if (k == K_GEMV)
        BT_ASSERT_OK(cuda_gemv_fp8(n_tok, q->n_out, q->ld, b->d_xq, NULL,
                                   b->d_xs, q->d_q, q->d_ws, b->d_y,
                                   CUDA_DT_BF16, false, NULL));
    else
        BT_ASSERT_OK(cuda_gemm_fp8_skinny(
            n_tok, q->n_out, q->ld, b->d_xq, b->d_xs, q->d_q, q->d_ws,
            b->d_y, CUDA_DT_BF16, false, k == K_SKINNY_WG,
            k == K_SKINNY_WG ? &b->ws : NULL, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(yb, b->d_y, 2 * ny, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < ny; i++) {
        double va = f32_of_bf16(ya[i]), vb = f32_of_bf16(yb[i]);

        num += (va - vb) * (va - vb);
        den += va * va;
    }
    rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    ok = rel < REL_MAX && isfinite(rel);
    printf("%s fp8 %s %s %d x %d, %d tokens: relative difference %.2e "
           "from worker_gemm_fp8\n", ok ? "PASS" : "FAIL", kernel_name(k),
           name, q->n_out, q->n_in, n_tok, rel);
    g_fail += !ok;
    free(ya);
    free(yb);
}

/* 1-8 tokens, the skinny GEMM against the FP8 GEMV: each checked (run()
 * checks the routed one against the reference, agree_check the other
 * against it), then both timed, bf16 out.  (H100, 2026-12-06: the
 * skinny 22-45% faster at 4 and 8 tokens on every 8B shape, equal at 1:
 * gemm_fp8.c routes 2-8 to it.) */
static void skinny_small(bufs_t *b)
{
    const lin8b_t *sh = g_lin8b;
    static const int toks[] = { 1, 2, 4, 8 };
    enum { NT = sizeof(toks) / sizeof(toks[0]) };

    for (int i = 0; i < N_LIN8B; i++) {
        wt_t q;

        wt_make(&q, sh[i].n_out, sh[i].n_in, false, sh[i].name);
        for (int k = 0; k < NT; k++) {
            const double wb = (double)q.n_out * q.ld;
            const worker_gemm_fp8_t a = { b->d_xq, NULL, b->d_xs, NULL,
                                          NULL, NULL, 0, true };
            float us_g, us_s;

            run(b, &q, sh[i].name, toks[k], false, false, false);
            agree_check(b, &q, sh[i].name, toks[k],
                        worker_gemm_fp8_uses_skinny(b->ctx, toks[k], &a)
                            ? K_GEMV : K_SKINNY_WG);
            us_g = time_op(b, &q, toks[k], NULL, CUDA_DT_BF16, false,
                           OP_GEMV);
            us_s = time_op(b, &q, toks[k], NULL, CUDA_DT_BF16, false,
                           OP_SKINNY);
            printf("INFO fp8 small %d x %d x %d: gemv %.1f us %.0f GB/s, "
                   "skinny %.1f us %.0f GB/s\n", toks[k], q.n_out, q.n_in,
                   us_g, wb / us_g * 1e-3, us_s, wb / us_s * 1e-3);
        }
        wt_free(&q);
    }
}

/* The skinny FP8 GEMM against cuBLASLt's FP8 GEMM (forced with
 * worker_gemm_fp8_force_cublaslt, checked against the reference) on the
 * 8B decode shapes at 16, 32 and 64 tokens, both timed on the same
 * inputs, then one INFO row per shape and token count (us and GB/s of
 * weights): where gemm_fp8.c's routing bound should be; and the skinny
 * GEMM's mma fallback at 9, 33 and 64 tokens. */
static void skinny_paths(bufs_t *b)
{
    const lin8b_t *sh = g_lin8b;
    static const int toks[] = { 16, 32, 64 };
    static const int fb_toks[] = { 9, 33, 64 };
    enum { NS = N_LIN8B, NT = 3 };
    float t_sk[NS][NT], t_lt[NS][NT];

    for (int i = 0; i < NS; i++) {
        wt_t q;

        wt_make(&q, sh[i].n_out, sh[i].n_in, false, sh[i].name);
        for (int k = 0; k < NT; k++) {
            const cuda_dtype_t dt = sh[i].acc ? CUDA_DT_F32 : CUDA_DT_BF16;

            worker_gemm_fp8_force_cublaslt(b->ctx, true);
            t_lt[i][k] =
                run(b, &q, sh[i].name, toks[k], false, sh[i].acc, true);
            t_sk[i][k] = time_op(b, &q, toks[k], NULL, dt, sh[i].acc,
                                 OP_SKINNY);
        }
        worker_gemm_fp8_force_cublaslt(b->ctx, false);
        for (int k = 0; k < (int)(sizeof(fb_toks) / sizeof(int)); k++) {
            run(b, &q, sh[i].name, fb_toks[k], false, false, false);
            agree_check(b, &q, sh[i].name, fb_toks[k], K_SKINNY_MMA);
        }
        wt_free(&q);
    }
    printf("INFO fp8 decode shapes, skinny FP8 GEMM vs cuBLASLt's FP8 GEMM "
           "(L2 flushed; GB/s of weights):\n");
    for (int i = 0; i < NS; i++)
        for (int k = 0; k < NT; k++) {
            const double wb = (double)sh[i].n_out * cuda_fp8_ld(sh[i].n_in);

            printf("INFO fp8 skinny %d x %d x %d %s: skinny %.1f us %.0f "
                   "GB/s, cublaslt %.1f us %.0f GB/s, x%.2f\n", toks[k],
                   sh[i].n_out, sh[i].n_in,
                   sh[i].acc ? "f32 +=" : "bf16 out", t_sk[i][k],
                   wb / t_sk[i][k] * 1e-3, t_lt[i][k],
                   wb / t_lt[i][k] * 1e-3, t_lt[i][k] / t_sk[i][k]);
        }
}

/* The tuned FP8 picks through the tuner's file (BT_GEMM_CACHE, set by
 * main to a file of this process): a second context installs the 2048-
 * token pick of the 8B o shape from it instead of timing (a cache hit),
 * and the product with it is checked against the reference again. */
static void gemm_cache_fp8(bufs_t *b)
{
    worker_gemm_ctx_t *first = b->ctx, *second = NULL;
    worker_gemm_fp8_t a;
    wt_t q;
    bool vec;

    BT_ASSERT_OK(worker_gemm_ctx_create(32u << 20, &second));
    b->ctx = second;
    wt_make(&q, 4096, 4096, false, "8b o");
    a = (worker_gemm_fp8_t){ b->d_xq, b->d_xv, b->d_xs, q.d_q, q.d_ws,
                             b->d_acc, b->acc_floats, false };
    run(b, &q, "8b o (cached pick)", 2048, false, true, false);
    vec = worker_gemm_fp8_uses_vec(second, 2048, q.n_out, q.ld, &a,
                                   CUDA_DT_F32, true, NULL);
    if (vec) {
        int hits = worker_gemm_cache_hits(second);

        printf("%s fp8 gemm cache: a second context installed %d pick(s) "
               "from the file instead of timing\n", hits >= 1 ? "PASS"
                                                             : "FAIL", hits);
        g_fail += hits < 1;
    } else {
        printf("INFO fp8 gemm cache: not checked (no scale vectors in this "
               "cuBLASLt, nothing tuned)\n");
    }
    wt_free(&q);
    b->ctx = first;
    worker_gemm_ctx_destroy(&second);
}

/* BT_FP8_FAST_ACCUM's two modes (gemm.c): b->ctx runs the default,
 * fast accumulation (no periodic f32 promotion inside cuBLASLt's FP8
 * kernels); a context in exact accumulation (BT_FP8_FAST_ACCUM=0) runs
 * the 8B linears too, the same checks as every product (relative error
 * < REL_MAX against cpu__fp8_gemm_ref, printed for both: what the
 * default costs), at the prefill and mixed-step token counts, both
 * timed at 2048 tokens.  The exact context tunes without the test's
 * cache file (its picks would replace the default's, which
 * gemm_cache_fp8 reads). */
static void gemm_accum_modes(bufs_t *b)
{
    static const int toks[] = { 100, 1000, 2053, 8191 };
    worker_gemm_ctx_t *fast = b->ctx, *exact = NULL;
    const char *cache = getenv("BT_GEMM_CACHE");
    char *saved = cache ? strdup(cache) : NULL;

    setenv("BT_FP8_FAST_ACCUM", "0", 1);
    setenv("BT_GEMM_CACHE", "off", 1);
    cuda_switches_reload();
    BT_ASSERT_OK(worker_gemm_ctx_create(32u << 20, &exact));
    unsetenv("BT_FP8_FAST_ACCUM");
    if (saved != NULL)
        setenv("BT_GEMM_CACHE", saved, 1);
    free(saved);
    cuda_switches_reload();
    for (int i = 0; i < N_LIN8B; i++) {
        const lin8b_t *sh = &g_lin8b[i];
        const double fl = 2.0 * 2048 * (double)sh->n_out * sh->n_in;
        char name[96];
        float t_exact, t_fast;
        wt_t q;

        snprintf(name, sizeof(name), "%s exact-accum", sh->name);
        wt_make(&q, sh->n_out, sh->n_in, false, sh->name);
        b->ctx = fast;
        t_fast = run(b, &q, sh->name, 2048, false, sh->acc, true);
        b->ctx = exact;
        t_exact = run(b, &q, name, 2048, false, sh->acc, true);
        for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++)
            run(b, &q, name, toks[k], k == 1, sh->acc, false);
        printf("INFO fp8 gemm 2048 x %d x %d %s: exact %.1f us %.0f TFLOP/s, "
               "fast accumulation %.1f us %.0f TFLOP/s, x%.2f\n", sh->n_out,
               sh->n_in, sh->acc ? "f32 +=" : "bf16 out", t_exact,
               fl / t_exact * 1e-6, t_fast, fl / t_fast * 1e-6,
               t_exact / t_fast);
        wt_free(&q);
    }
    b->ctx = fast;
    worker_gemm_ctx_destroy(&exact);
}

typedef struct {
    const char *name;
    int n_out, n_in;
    bool acc;            /* the residual projections (o, down) */
    bool big;            /* 8B shapes: timed, fewer mode combinations */
} shape_t;

int main(int argc, char **argv)
{
    static const shape_t shapes[] = {
        { "8b qkv", 6144, 4096, false, true },
        { "8b o", 4096, 4096, true, true },
        { "8b gate_up", 28672, 4096, false, true },
        { "8b down", 4096, 14336, true, true },
        { "tiny qkv", 128, 64, false, false },
        { "tiny o", 64, 64, true, false },
        { "tiny gate_up", 344, 64, false, false },
        { "tiny down", 64, 172, true, false },
    };
    /* 32: the decode graphs' largest bucket on the skinny GEMM; 64 ...
     * 256: the buckets above it (cuBLASLt) */
    static const int toks_all[] = { 1,  2,  3,  4,  5,  8,   9,   16,
                                    17, 24, 33, 40, 57, 64,  32,  128,
                                    256, 512, 2048 };
    static const int toks_modes[] = { 1, 8, 33, 2048 };
    static const int toks_tiny[] = { 1,  2,  5,  8,  9,  17, 24,
                                     33, 37, 40, 57, 64, 128 };
    const int max_tok = 8192, max_ld = 14336, max_out = 28672;
    /* --paths: only the cuBLASLt paths' A/Bs (gemm_paths, gemm_accum_modes:
     * ~1 min instead of ~3) */
    const bool paths_only = argc > 1 && strcmp(argv[1], "--paths") == 0;
    /* --skinny: only the skinny GEMM's checks and timings (skinny_paths,
     * skinny_small) */
    const bool skinny_only = argc > 1 && strcmp(argv[1], "--skinny") == 0;
    /* --fused: only the conversions and the fused producers (check 4,
     * seconds: cvt_check, fused_one) */
    const bool fused_only = argc > 1 && strcmp(argv[1], "--fused") == 0;
    bufs_t b;
    int dev_n = 0;
    char cache[64];

    if (argc > 2 ||
        (argc == 2 && !paths_only && !skinny_only && !fused_only)) {
        fprintf(stderr,
                "usage: test_cuda_fp8 [--paths | --skinny | --fused]\n");
        return 2;
    }

    if (cudaGetDeviceCount(&dev_n) != cudaSuccess || dev_n == 0) {
        printf("FAIL no CUDA device\n");
        return 1;
    }
    memset(&b, 0, sizeof(b));
    /* the tuner's picks in a file of this test's own (gemm_cache_fp8),
     * read by the contexts created below */
    snprintf(cache, sizeof(cache), "/tmp/bt_test_fp8_gemm_cache.%d",
             (int)getpid());
    unlink(cache);
    setenv("BT_GEMM_CACHE", cache, 1);
    BT_ASSERT_OK(worker_gemm_ctx_create(32u << 20, &b.ctx));
    CK(cudaMalloc(&b.d_x, (size_t)max_tok * max_ld * 2));
    CK(cudaMalloc((void **)&b.d_xq, (size_t)max_tok * max_ld));
    CK(cudaMalloc(&b.d_xv, (size_t)max_tok * max_ld * 2));
    CK(cudaMalloc((void **)&b.d_xs, sizeof(float) * max_tok));
    CK(cudaMalloc(&b.d_y, (size_t)max_tok * max_out * 4));
    /* 1024 tokens of the widest product: 2048 goes in two pieces */
    b.acc_floats = (size_t)1024 * max_out;
    CK(cudaMalloc((void **)&b.d_acc, sizeof(float) * b.acc_floats));
    CK(cudaMalloc(&b.d_flush, FLUSH_BYTES));
    b.ws.part_bytes = (size_t)32 << 20;
    b.ws.n_cnt = 4096;
    CK(cudaMalloc((void **)&b.ws.d_part, b.ws.part_bytes));
    CK(cudaMalloc((void **)&b.ws.d_cnt, sizeof(int) * b.ws.n_cnt));
    CK(cudaMemset(b.ws.d_cnt, 0, sizeof(int) * b.ws.n_cnt));
    CK(cudaMemset(b.d_flush, 0, FLUSH_BYTES));

    if (paths_only) {
        gemm_paths(&b);
        gemm_accum_modes(&b);
        goto done;
    }
    if (skinny_only) {
        skinny_paths(&b);
        skinny_small(&b);
        goto done;
    }
    cvt_check();
    {
        static const int fk[][2] = { {1, 4096}, {8, 4096}, {64, 4096},
                                     {512, 4096}, {3, 64}, {37, 64} };
        /* 512 and 300 rows: the two-pass kernel (qf8_glu2_kernel, from
         * 256 rows; 1,000 leaves padding codes past k) */
        static const int gk[][2] = { {1, 14336}, {8, 14336}, {512, 14336},
                                     {300, 1000}, {3, 172}, {37, 172} };

        for (size_t i = 0; i < sizeof(fk) / sizeof(fk[0]); i++)
            for (int st = 0; st < 2; st++)
                fused_one(&b, false, fk[i][0], fk[i][1], st == 1);
        for (size_t i = 0; i < sizeof(gk) / sizeof(gk[0]); i++)
            for (int st = 0; st < 2; st++)
                fused_one(&b, true, gk[i][0], gk[i][1], st == 1);
    }
    if (fused_only)
        goto done;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const shape_t *sh = &shapes[s];

        for (int pt = 0; pt < 2; pt++) {
            wt_t q;

            wt_make(&q, sh->n_out, sh->n_in, pt == 1, sh->name);
            for (int st = 0; st < 2; st++) {
                const int *toks = !sh->big ? toks_tiny
                                  : pt == 0 && st == 0 ? toks_all
                                                       : toks_modes;
                int n = !sh->big ? (int)(sizeof(toks_tiny) / sizeof(int))
                        : pt == 0 && st == 0
                            ? (int)(sizeof(toks_all) / sizeof(int))
                            : (int)(sizeof(toks_modes) / sizeof(int));

                for (int i = 0; i < n; i++)
                    run(&b, &q, sh->name, toks[i], st == 1, sh->acc,
                        sh->big && pt == 0 && st == 0 &&
                            (toks[i] == 1 || toks[i] == 8 ||
                             toks[i] >= 64));
            }
            /* the other output kind once: bf16 out for the residual
             * shapes, f32 += for the others */
            run(&b, &q, sh->name, 4, false, !sh->acc, false);
            run(&b, &q, sh->name, 24, false, !sh->acc, false);
            run(&b, &q, sh->name, sh->big ? 512 : 37, false, !sh->acc,
                false);
            if (!sh->big) { /* odd and padded K: the fallbacks too */
                run(&b, &q, sh->name, 33, false, false, false);
                agree_check(&b, &q, sh->name, 33, K_SKINNY_MMA);
                run(&b, &q, sh->name, 5, false, false, false);
                agree_check(&b, &q, sh->name, 5, K_GEMV);
            }
            wt_free(&q);
        }
    }
    fused_gemv(&b);
    gemm_paths(&b);
    skinny_paths(&b);
    skinny_small(&b);
    gemm_cache_fp8(&b);
    gemm_accum_modes(&b);
done:
    unlink(cache);
    cudaFree(b.d_flush);
    cudaFree(b.d_acc);
    cudaFree(b.d_y);
    cudaFree(b.d_xs);
    cudaFree(b.d_xv);
    cudaFree(b.d_xq);
    cudaFree(b.d_x);
    worker_gemm_ctx_destroy(&b.ctx);
    printf("test_cuda_fp8: %s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
