/*
 * gemm_fp8.c - worker_gemm_fp8(): FP8 products (precision fp8, kernels/fp8.h).
 *
 * One token: the FP8 GEMV (the weights read once at the bandwidth limit;
 * cuda_forward.c's fused form makes its input inside).  2 to
 * GEMM_FP8_SKINNY_ROUTE_MAX: the skinny FP8 GEMM (kernels/
 * gemm_fp8_skinny.cu: the weights read once on the tensor cores' native
 * E4M3 MMAs; the GEMV converts codes and cuBLASLt's kernels, tiled for
 * prefill, read these shapes well below bandwidth), unless
 * worker_gemm_fp8_force_cublaslt (9 and up).  Without wgmma the skinny
 * GEMM's fallback loses to the GEMV, which then keeps 2 to
 * CUDA_GEMV_FP8_MAX_TOK.  Both go under worker_gemm_fp8_t.gemv ("the
 * codes, no cuBLASLt").  More:
 * cuBLASLt's FP8 GEMM (E4M3 A and B in
 * the "TN" layout Hopper's FP8 kernels require -- A = w transposed, as
 * every plan here -- f32 compute, fast accumulation unless
 * BT_FP8_FAST_ACCUM=0), in one of two
 * ways, decided once per context (gemm_fp8_vec_probe, logged once):
 *   vec: the weight scales (one per output row, cuBLASLt's m) and the
 *     input scales (one per token, its n) as CUBLASLT_MATMUL_MATRIX_SCALE_
 *     OUTER_VEC_32F vectors, so the GEMM's own epilogue scales and writes
 *     y directly: bf16, or the f32 residual with beta = 1 (C = D = y).
 *     One plan per exact token count; prefill counts (multiples of
 *     GEMM_BIG_STEP up to GEMM_BIG_MAX) timed among GEMM_FP8_CANDS of the
 *     heuristic's algorithms at their first uncaptured use (the warm-up's
 *     prompts), each checked against the first, the fastest kept and
 *     cached in the tuner's file (gemm_cache.h kind FP8_VEC).  Per-tensor
 *     scales are the same call: the input kernels write a scale per token
 *     either way and a checkpoint's tensor scale is repeated per row.
 *   epilogue (the library does not run vec, a shape it has no vec
 *     algorithm for, or worker_gemm_fp8_force_epilogue): f32 sums into the
 *     caller's scratch, then cuda_fp8_scale_out multiplies by the token's
 *     and the row's scale and writes y.  Tokens go through in chunks of as
 *     many rows as the scratch holds, each planned with its token count
 *     rounded up to 16 (the extra input rows are whatever d_xq holds
 *     there, and their output columns are never read: a column of the
 *     product depends on its own input row only).  Heuristic algorithm,
 *     not tuned.
 * A shape cuBLASLt has no epilogue algorithm for (odd sizes of the tiny
 * models) takes the skinny GEMM in groups of CUDA_GEMM_FP8_SKINNY_MAX_TOK
 * tokens (the GEMV in groups of CUDA_GEMV_FP8_MAX_TOK without it), with
 * one WARN.
 * Decode counts (up to GEMM_FP8_DECODE_TOK_MAX): the tuner times the vec
 * plan's algorithms beside the plain plan's (f32 sums, K splits, then
 * cuda_fp8_scale_out) and the skinny GEMM in pieces of 64 tokens
 * (gemm_fp8_path_t); decode graphs are captured untimed, so the counts
 * 64 / 128 / 256 / 512 of a weight shape are tuned together at its first
 * uncaptured use (gemm_fp8_tune_decode) and kept in the tuner's file.
 */
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_fp8.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cuda_switches.h"
#include "gemm_int.h"
#include "kernels/fp8.h"
#include "kernels/gemv.h"

/* Tokens per cuBLASLt call: what the scratch holds in whole groups of
 * GEMM_FP8_TOK_ALIGN, at most n_tok (0: not even one group). */
static int gemm_fp8_chunk(int n_tok, int n_out, size_t acc_floats)
{
    size_t rows = acc_floats / (size_t)cuda_fp8_ld(n_out) /
                  GEMM_FP8_TOK_ALIGN * GEMM_FP8_TOK_ALIGN;

    return (int)BT_MIN(rows, (size_t)n_tok);
}

/* The token count a chunk of n tokens is planned with. */
static int gemm_fp8_plan_tok(int n)
{
    return (n + GEMM_FP8_TOK_ALIGN - 1) / GEMM_FP8_TOK_ALIGN *
           GEMM_FP8_TOK_ALIGN;
}

/* The cuBLASLt FP8 plan of n_tok x n_out x ld, or NULL when cuBLASLt
 * has none (logged once per shape, then remembered; the error is
 * cleared: the caller falls back). */
static gemm_plan_t *gemm_fp8_plan(worker_gemm_ctx_t *ctx, int n_tok,
                                  int n_out, int ld)
{
    gemm_plan_t *p = NULL;

    for (int i = 0; i < ctx->n_fp8_bad; i++)
        if (ctx->fp8_bad[i][0] == n_tok && ctx->fp8_bad[i][1] == n_out &&
            ctx->fp8_bad[i][2] == ld)
            return NULL;
    if (gemm__plan_find(ctx, n_tok, n_out, ld, GEMM_DT_E4M3, CUDA_DT_F32,
                        false, &p) != BT_OK) {
        bt_error_clear();
        (void)cudaGetLastError();
        if (ctx->n_fp8_bad < GEMM_FP8_BAD_MAX) {
            ctx->fp8_bad[ctx->n_fp8_bad][0] = n_tok;
            ctx->fp8_bad[ctx->n_fp8_bad][1] = n_out;
            ctx->fp8_bad[ctx->n_fp8_bad][2] = ld;
            ctx->n_fp8_bad++;
        }
        return NULL;
    }
    return p;
}

/* True when the skinny FP8 GEMM takes a product of n_tok tokens that
 * the GEMV does not (in pieces of CUDA_GEMM_FP8_SKINNY_MAX_TOK when
 * cuBLASLt cannot: worker_gemm_fp8_gemv). */
static bool gemm_fp8_skinny_takes(const worker_gemm_ctx_t *ctx, int n_tok,
                                  int n_out, int ld)
{
    return ctx->fp8_skinny && !ctx->fp8_force_cublaslt &&
           n_tok > CUDA_GEMV_FP8_MAX_TOK &&
           n_tok <= GEMM_FP8_SKINNY_ROUTE_MAX &&
           cuda_gemm_fp8_skinny_ok(n_tok, n_out, ld);
}

bool worker_gemm_fp8_gemv(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                          int ld, size_t acc_floats)
{
    int chunk = gemm_fp8_chunk(n_tok, n_out, acc_floats);

    if (n_tok <= CUDA_GEMV_FP8_MAX_TOK || chunk < 1 ||
        gemm_fp8_skinny_takes(ctx, n_tok, n_out, ld))
        return true;
    if (gemm_fp8_plan(ctx, gemm_fp8_plan_tok(chunk), n_out, ld) == NULL ||
        (n_tok % chunk != 0 &&
         gemm_fp8_plan(ctx, gemm_fp8_plan_tok(n_tok % chunk), n_out,
                       ld) == NULL)) {
        static bool warned;

        if (!warned)
            BT_LOG_WARN("CUDA", "cuBLASLt has no FP8 algorithm for %d x %d "
                        "x %d: the skinny FP8 GEMM takes it in pieces "
                        "(slower)", n_tok, n_out, ld);
        warned = true;
        return true;
    }
    return false;
}

/* Enqueues plan p (fp8_vec) with algorithm algo: y [+]= (xq . wq^T) *
 * xs[t] * ws[n], written by the GEMM itself. */
static bt_status_t gemm_fp8_vec_run(worker_gemm_ctx_t *ctx,
                                    const gemm_plan_t *p,
                                    const cublasLtMatmulAlgo_t *algo,
                                    const worker_gemm_fp8_t *a, void *d_y,
                                    bool accumulate, cudaStream_t stream)
{
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    bt_status_t status;

    status = gemm__check(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a->d_ws,
        sizeof(a->d_ws)), "A scale pointer");
    if (status == BT_OK)
        status = gemm__check(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a->d_xs,
            sizeof(a->d_xs)), "B scale pointer");
    if (status != BT_OK)
        return status;
    return gemm__check(cublasLtMatmul(ctx->handle, p->op, &one, a->d_wq, p->a,
                                      a->d_xq, p->b, &beta, d_y, p->d, d_y,
                                      p->d, algo, ctx->d_ws, ctx->ws_bytes,
                                      stream),
                       "fp8 matmul (scale vectors)");
}

/* The probe's product: PT tokens, PO rows, PK columns of small integers
 * (exact in E4M3, exact sums), scales that differ per token and row. */
enum { GEMM_PROBE_T = 32, GEMM_PROBE_O = 64, GEMM_PROBE_K = 64 };

static float gemm_probe_x(int t, int k)
{
    return (float)((t * 3 + k * 5) % 7 - 3);
}

static float gemm_probe_w(int n, int k)
{
    return (float)((n * 5 + k * 3) % 5 - 2);
}

static float gemm_probe_xs(int t)
{
    return 0.25f * (float)(1 + t % 5);
}

static float gemm_probe_ws(int n)
{
    return 0.5f + 0.125f * (float)(n % 9);
}

/* One probe product on the device (bufs d, layout as gemm_fp8_vec_probe
 * makes it): bf16 out, or f32 += onto ones; true when every value is the
 * exact product within the output's rounding. */
static bool gemm_fp8_probe_one(worker_gemm_ctx_t *ctx, char *d, bool acc,
                               cudaStream_t stream)
{
    const size_t xq_off = 0, wq_off = 4096, xs_off = 8192, ws_off = 8448;
    const size_t y_off = 8704, ny = (size_t)GEMM_PROBE_T * GEMM_PROBE_O;
    const cuda_dtype_t out_dt = acc ? CUDA_DT_F32 : CUDA_DT_BF16;
    const worker_gemm_fp8_t a = {
        (const uint8_t *)(d + xq_off), NULL, (const float *)(d + xs_off),
        (const uint8_t *)(d + wq_off), (const float *)(d + ws_off), NULL, 0,
        false };
    float h_y[GEMM_PROBE_T * GEMM_PROBE_O];
    uint16_t h_b[GEMM_PROBE_T * GEMM_PROBE_O];
    gemm_plan_t *p;

    for (size_t i = 0; i < ny; i++)
        h_y[i] = 1.0f;
    if (gemm__plan_find_kind(ctx, GEMM_PROBE_T, GEMM_PROBE_O, GEMM_PROBE_K,
                             GEMM_DT_E4M3, out_dt, acc, true, &p) != BT_OK ||
        BT_CUDA_STATUS(cudaMemcpyAsync(d + y_off, h_y, sizeof(h_y),
                                       cudaMemcpyHostToDevice, stream)) !=
            BT_OK ||
        gemm_fp8_vec_run(ctx, p, &p->algo, &a, d + y_off, acc, stream) !=
            BT_OK ||
        BT_CUDA_STATUS(cudaMemcpyAsync(acc ? (void *)h_y : (void *)h_b,
                                       d + y_off,
                                       ny * cuda_dtype_size(out_dt),
                                       cudaMemcpyDeviceToHost, stream)) !=
            BT_OK ||
        BT_CUDA_STATUS(cudaStreamSynchronize(stream)) != BT_OK)
        return false;
    for (int t = 0; t < GEMM_PROBE_T; t++)
        for (int n = 0; n < GEMM_PROBE_O; n++) {
            const size_t i = (size_t)t * GEMM_PROBE_O + n;
            float sum = 0.0f, want, got;
            uint32_t u;

            for (int k = 0; k < GEMM_PROBE_K; k++)
                sum += gemm_probe_x(t, k) * gemm_probe_w(n, k);
            want = sum * gemm_probe_xs(t) * gemm_probe_ws(n) +
                   (acc ? 1.0f : 0.0f);
            if (acc) {
                got = h_y[i];
            } else {
                u = (uint32_t)h_b[i] << 16;
                memcpy(&got, &u, sizeof(got));
            }
            if (!(fabsf(got - want) <= (acc ? 1e-5f : 8e-3f) * fabsf(want) +
                                           1e-6f))
                return false;
        }
    return true;
}

/* Decides ctx->fp8_vec once: does cuBLASLt run the FP8 GEMM with the
 * scale vectors inside it, and get it right (a library can accept the
 * mode at plan time and refuse it at the call, and a result that ignored
 * a vector would be a wrong token, so the probe multiplies and checks)?
 * Not during capture (it synchronizes the stream). */
static void gemm_fp8_vec_probe(worker_gemm_ctx_t *ctx, cudaStream_t stream)
{
    enum { BYTES = 8704 + GEMM_PROBE_T * GEMM_PROBE_O * 4 };
    uint8_t h_q[8192];          /* x codes at 0, w codes at 4096 */
    float h_s[GEMM_PROBE_T + GEMM_PROBE_O]; /* xs at 8192, ws at 8448 */
    char *d = NULL;
    bool ok;

    bt_error_clear(); /* what is logged below is the probe's */
    memset(h_q, 0, sizeof(h_q));
    for (int t = 0; t < GEMM_PROBE_T; t++)
        for (int k = 0; k < GEMM_PROBE_K; k++)
            h_q[t * GEMM_PROBE_K + k] = bt_f32_to_e4m3(gemm_probe_x(t, k));
    for (int n = 0; n < GEMM_PROBE_O; n++)
        for (int k = 0; k < GEMM_PROBE_K; k++)
            h_q[4096 + n * GEMM_PROBE_K + k] =
                bt_f32_to_e4m3(gemm_probe_w(n, k));
    ok = cuda__dev_malloc((void **)&d, BYTES, "gemm_fp8_probe") == BT_OK;
    if (ok) {
        for (int t = 0; t < GEMM_PROBE_T; t++)
            h_s[t] = gemm_probe_xs(t);
        for (int n = 0; n < GEMM_PROBE_O; n++)
            h_s[GEMM_PROBE_T + n] = gemm_probe_ws(n);
        ok = BT_CUDA_STATUS(cudaMemcpyAsync(d, h_q, sizeof(h_q),
                                            cudaMemcpyHostToDevice,
                                            stream)) == BT_OK &&
             BT_CUDA_STATUS(cudaMemcpyAsync(d + 8192, h_s,
                                            GEMM_PROBE_T * sizeof(float),
                                            cudaMemcpyHostToDevice,
                                            stream)) == BT_OK &&
             BT_CUDA_STATUS(cudaMemcpyAsync(d + 8448, h_s + GEMM_PROBE_T,
                                            GEMM_PROBE_O * sizeof(float),
                                            cudaMemcpyHostToDevice,
                                            stream)) == BT_OK &&
             gemm_fp8_probe_one(ctx, d, false, stream) &&
             gemm_fp8_probe_one(ctx, d, true, stream);
    }
    (void)cudaStreamSynchronize(stream);
    cuda__dev_free((void **)&d);
    ctx->fp8_vec = ok ? 1 : 0;
    if (ok) {
        BT_LOG_INFO("CUDA", "FP8 GEMM: cuBLASLt applies the per-token and "
                    "per-row scales inside the GEMM and writes the output "
                    "directly");
    } else {
        BT_LOG_WARN("CUDA", "FP8 GEMM: cuBLASLt does not run the FP8 GEMM "
                    "with per-token and per-row scale vectors here (%s): "
                    "f32 sums and a scaling pass instead (slower)",
                    *bt_error_last() ? bt_error_last() : "wrong result");
        bt_error_clear();
        (void)cudaGetLastError();
    }
}

/* The plain FP8 GEMM of n_tok tokens with algorithm algo of plan p
 * (gemm_fp8_plan: f32 sums into a->d_acc), then the scaling pass into
 * d_y; the caller checked that the sums fit a->d_acc. */
static bt_status_t gemm_fp8_plain_run(worker_gemm_ctx_t *ctx,
                                      const gemm_plan_t *p,
                                      const cublasLtMatmulAlgo_t *algo,
                                      const worker_gemm_fp8_t *a, int n_tok,
                                      void *d_y, cuda_dtype_t out_dt,
                                      bool accumulate, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    bt_status_t status;

    status = gemm__check(cublasLtMatmul(ctx->handle, p->op, &one, a->d_wq,
                                        p->a, a->d_xq, p->b, &zero, a->d_acc,
                                        p->d, a->d_acc, p->d, algo, ctx->d_ws,
                                        ctx->ws_bytes, stream),
                         "fp8 matmul");
    if (status == BT_OK)
        status = cuda_fp8_scale_out(a->d_acc, cuda_fp8_ld(p->n_out),
                                    a->d_xs, a->d_ws, n_tok, p->n_out, d_y,
                                    out_dt, accumulate, stream);
    return status;
}

/* The skinny FP8 GEMM over n_tok tokens in pieces of
 * CUDA_GEMM_FP8_SKINNY_MAX_TOK. */
static bt_status_t gemm_fp8_skinny_run(worker_gemm_ctx_t *ctx, int n_tok,
                                       int n_out, int ld,
                                       const worker_gemm_fp8_t *a, void *d_y,
                                       cuda_dtype_t out_dt, bool accumulate,
                                       cudaStream_t stream)
{
    const size_t es = cuda_dtype_size(out_dt);
    bt_status_t status = BT_OK;

    for (int t0 = 0; t0 < n_tok && status == BT_OK;
         t0 += CUDA_GEMM_FP8_SKINNY_MAX_TOK) {
        const int n = BT_MIN(CUDA_GEMM_FP8_SKINNY_MAX_TOK, n_tok - t0);

        status = cuda_gemm_fp8_skinny(
            n, n_out, ld, a->d_xq + (size_t)t0 * ld, a->d_xs + t0, a->d_wq,
            a->d_ws, (char *)d_y + (size_t)t0 * n_out * es, out_dt,
            accumulate, true, &ctx->gemv_ws, stream);
    }
    return status;
}

/* One FP8 candidate: the vec plan's algorithm, the plain plan's, or the
 * skinny GEMM (p and algo unused). */
static bt_status_t gemm_fp8_cand_run(worker_gemm_ctx_t *ctx,
                                     const gemm_plan_t *p,
                                     const cublasLtMatmulAlgo_t *algo,
                                     const worker_gemm_fp8_t *a, int n_tok,
                                     int n_out, int ld, void *d_y,
                                     cuda_dtype_t out_dt, bool acc,
                                     gemm_fp8_path_t path,
                                     cudaStream_t stream)
{
    if (path == GEMM_FP8_SKINNY)
        return gemm_fp8_skinny_run(ctx, n_tok, n_out, ld, a, d_y, out_dt,
                                   acc, stream);
    return path == GEMM_FP8_PLAIN
               ? gemm_fp8_plain_run(ctx, p, algo, a, n_tok, d_y, out_dt, acc,
                                    stream)
               : gemm_fp8_vec_run(ctx, p, algo, a, d_y, acc, stream);
}

/* Median time in us of one candidate's run into d_y, over
 * GEMM_TUNE_REPS runs after an L2 flush each (one untimed run first). */
static bt_status_t gemm_fp8_time(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                                 const cublasLtMatmulAlgo_t *algo,
                                 const worker_gemm_fp8_t *a, int n_tok,
                                 int n_out, int ld, void *d_y,
                                 cuda_dtype_t out_dt, bool acc,
                                 gemm_fp8_path_t path, gemm_scratch_t *sc,
                                 cudaStream_t stream, float *us_p)
{
    float t[GEMM_TUNE_REPS];
    bt_status_t status;

    status = gemm_fp8_cand_run(ctx, p, algo, a, n_tok, n_out, ld, d_y,
                               out_dt, acc, path, stream);
    for (int r = 0; r < GEMM_TUNE_REPS && status == BT_OK; r++) {
        status = cuda_l2_flush(sc->d_flush, GEMM_FLUSH_BYTES, stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaEventRecord(sc->ev[0], stream));
        if (status == BT_OK)
            status = gemm_fp8_cand_run(ctx, p, algo, a, n_tok, n_out, ld,
                                       d_y, out_dt, acc, path, stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaEventRecord(sc->ev[1], stream));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaEventSynchronize(sc->ev[1]));
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaEventElapsedTime(&t[r], sc->ev[0],
                                                         sc->ev[1]));
    }
    if (status != BT_OK)
        return status;
    *us_p = gemm__median_us(t, GEMM_TUNE_REPS, sc, false);
    return BT_OK;
}

/* Where a decode count's FP8 product may take the plain plan (its f32
 * sums fit a->d_acc) and the skinny GEMM (in pieces of 64): the tuner's
 * candidates, and what a cached pick must still meet. */
static bool gemm_fp8_plain_can(int n_tok, int n_out,
                               const worker_gemm_fp8_t *a)
{
    return n_tok <= GEMM_FP8_DECODE_TOK_MAX &&
           n_tok % GEMM_FP8_TOK_ALIGN == 0 &&
           (size_t)n_tok * cuda_fp8_ld(n_out) <= a->acc_floats;
}

static bool gemm_fp8_skinny_can(const worker_gemm_ctx_t *ctx, int n_tok,
                                int n_out, int ld)
{
    return ctx->fp8_skinny && n_tok <= GEMM_TUNE_MAX_TOK &&
           cuda_gemm_fp8_skinny_ok(BT_MIN(n_tok,
                                          CUDA_GEMM_FP8_SKINNY_MAX_TOK),
                                   n_out, ld);
}

/* The tuner's plan of a candidate, found again for each use: building
 * one may recycle another's slot (gemm__plan_find_kind). */
static gemm_plan_t *gemm_fp8_tune_plan(worker_gemm_ctx_t *ctx, int n_tok,
                                       int n_out, int ld,
                                       cuda_dtype_t out_dt, bool acc,
                                       bool plain)
{
    gemm_plan_t *p = NULL;

    if (plain)
        return gemm_fp8_plan(ctx, n_tok, n_out, ld);
    return gemm__plan_find_kind(ctx, n_tok, n_out, ld, GEMM_DT_E4M3, out_dt,
                                acc, true, &p) == BT_OK
               ? p
               : NULL;
}

/* Times the heuristic's first GEMM_FP8_CANDS algorithms for the vec plan
 * of (n_tok, n_out, ld, out_dt, acc) on the caller's inputs (read only;
 * the outputs go to scratch), each checked against the first, and adds
 * the fastest to ctx->tuned (then the cache file).  Where the f32 sums
 * fit a->d_acc, the plain plan's algorithms and their K splits run too,
 * each with the scaling pass (workbench: cuBLASLt offers the vec plan
 * one algorithm and no split, and o / down at 64 tokens read their
 * weights at 1.0-1.6 TB/s).  A failure keeps the heuristic's first
 * algorithm (WARN). */
static void gemm_fp8_tune(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                          int ld, cuda_dtype_t out_dt, bool acc,
                          const worker_gemm_fp8_t *a, cudaStream_t stream)
{
    cublasLtMatmulHeuristicResult_t res[GEMM_FP8_CANDS];
    cublasLtMatmulAlgo_t algos[GEMM_FP8_CANDS + GEMM_LT_ALGOS_MAX];
    const size_t ny = (size_t)n_tok * n_out;
    const size_t y_bytes = ny * cuda_dtype_size(out_dt);
    const double flop = 2.0 * n_tok * (double)n_out * ld;
    gemm_scratch_t sc;
    gemm_plan_t *p = NULL, *pp;
    gemm_tuned_t *t;
    char line[2048], best_name[32] = "";
    size_t len = 0;
    int n_res = 0, n_vec = 0, n_plain = 0, n_pheur = 0, n_skinny, best = -1;
    gemm_fp8_path_t best_path = GEMM_FP8_VEC;
    float best_us = 0.0f;
    bt_status_t status;
    double t0 = bt_time_s();

    ctx->setups++;
    memset(&sc, 0, sizeof(sc));
    if (gemm_fp8_plain_can(n_tok, n_out, a) &&
        (pp = gemm_fp8_plan(ctx, n_tok, n_out, ld)) != NULL &&
        gemm__lt_heuristic(ctx, pp, GEMM_FP8_CANDS, res, &n_pheur) == BT_OK) {
        cublasLtMatmulAlgo_t *pa = algos + GEMM_FP8_CANDS;

        for (int i = 0; i < n_pheur; i++)
            pa[i] = res[i].algo;
        n_plain = n_pheur;
        gemm__lt_add_splits(ctx, pp, pa, &n_plain);
    }
    bt_error_clear();
    status = gemm__plan_find_kind(ctx, n_tok, n_out, ld, GEMM_DT_E4M3, out_dt,
                                  acc, true, &p);
    if (status == BT_OK)
        status = gemm__lt_heuristic(ctx, p, GEMM_FP8_CANDS, res, &n_res);
    for (int i = 0; i < n_res; i++)
        algos[i] = res[i].algo;
    n_vec = n_res;
    if (status == BT_OK)
        status = gemm__scratch_alloc(&sc, y_bytes);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemsetAsync(sc.d_flush, 0,
                                                GEMM_FLUSH_BYTES, stream));
    /* the reference: the heuristic's first algorithm (onto zeros) */
    if (status == BT_OK && n_res > 0)
        status = BT_CUDA_STATUS(cudaMemsetAsync(sc.d_ref, 0, y_bytes,
                                                stream));
    if (status == BT_OK && n_res > 0 &&
        (p = gemm_fp8_tune_plan(ctx, n_tok, n_out, ld, out_dt, acc,
                                false)) == NULL)
        status = BT_ERROR(BT_ERR_CUDA, "CUDA", "FP8 vec plan lost");
    if (status == BT_OK && n_res > 0)
        status = gemm_fp8_vec_run(ctx, p, &algos[0], a, sc.d_ref, acc,
                                  stream);
    n_skinny = gemm_fp8_skinny_can(ctx, n_tok, n_out, ld);
    for (int c = 0;
         c < n_vec + n_plain + n_skinny && status == BT_OK && n_res > 0;
         c++) {
        const gemm_fp8_path_t path = c < n_vec             ? GEMM_FP8_VEC
                                     : c < n_vec + n_plain ? GEMM_FP8_PLAIN
                                                           : GEMM_FP8_SKINNY;
        const bool plain = path == GEMM_FP8_PLAIN;
        /* the candidate's algorithm (the skinny GEMM has none) */
        const int i = plain                    ? GEMM_FP8_CANDS + (c - n_vec)
                      : path == GEMM_FP8_VEC ? c
                                             : 0;
        const gemm_plan_t *cp =
            path == GEMM_FP8_SKINNY
                ? NULL
                : gemm_fp8_tune_plan(ctx, n_tok, n_out, ld, out_dt, acc,
                                     plain);
        char name[32];
        double rel = 0.0;
        float us = 0.0f;

        if (cp == NULL && path != GEMM_FP8_SKINNY) {
            bt_error_clear();
            continue;
        }
        if (path == GEMM_FP8_SKINNY) {
            snprintf(name, sizeof(name), "skinny");
        } else if (plain) {
            gemm__lt_name(algos + GEMM_FP8_CANDS, c - n_vec, n_pheur, name,
                          sizeof(name));
            name[0] = 'p'; /* "pt3", "pt3/k4c": the plain plan's */
        } else {
            snprintf(name, sizeof(name), "lt%d", c);
        }
        /* each candidate must write every value (NaN bytes first), and
         * agree with the first */
        if (BT_CUDA_STATUS(cudaMemsetAsync(sc.d_y, acc ? 0 : 0xFF, y_bytes,
                                           stream)) != BT_OK ||
            gemm_fp8_cand_run(ctx, cp, &algos[i], a, n_tok, n_out, ld,
                              sc.d_y, out_dt, acc, path, stream) != BT_OK ||
            gemm__rel_err(sc.d_y, &sc, ny, out_dt, stream, &rel) != BT_OK) {
            bt_error_clear();
            (void)cudaGetLastError();
            continue; /* an algorithm that does not run */
        }
        if (!(rel <= 2e-2)) {
            BT_LOG_WARN("CUDA", "gemm tune fp8: %s disagrees with lt0 at "
                        "t=%d o=%d ld=%d (rel err %.3g): dropped", name,
                        n_tok, n_out, ld, rel);
            continue;
        }
        if (gemm_fp8_time(ctx, cp, &algos[i], a, n_tok, n_out, ld, sc.d_y,
                          out_dt, acc, path, &sc, stream, &us) != BT_OK) {
            bt_error_clear();
            (void)cudaGetLastError();
            continue;
        }
        if (len < sizeof(line))
            len += (size_t)snprintf(line + len, sizeof(line) - len,
                                    "%s%s %.1f", len ? ", " : "", name, us);
        if (best < 0 || us < best_us) {
            best = i;
            best_path = path;
            best_us = us;
            snprintf(best_name, sizeof(best_name), "%s", name);
        }
    }
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    /* an entry even on failure (the heuristic's pick): a shape is tried
     * once, not at every call */
    if (p != NULL)
        p = gemm_fp8_tune_plan(ctx, n_tok, n_out, ld, out_dt, acc, false);
    if (p != NULL && ctx->n_tuned < GEMM_MAX_TUNED) {
        t = &ctx->tuned[ctx->n_tuned++];
        memset(t, 0, sizeof(*t));
        t->bucket = n_tok;
        t->n_out = n_out;
        t->n_in = ld;
        t->out_dt = out_dt;
        t->kind = GEMM_CACHE_KIND_FP8_VEC;
        t->accumulate = acc;
        t->fp8_path = best < 0 ? GEMM_FP8_VEC : best_path;
        t->choice = GEMM_CHOICE_LT + (best < 0 ? 0 : best);
        t->algo = best < 0 || best_path == GEMM_FP8_SKINNY ? p->algo
                                                            : algos[best];
        t->us = best < 0 ? -1.0f : best_us;
    }
    if (status != BT_OK || best < 0) {
        BT_LOG_WARN("CUDA", "gemm tune fp8 t=%d o=%d ld=%d failed: the "
                    "heuristic's algorithm", n_tok, n_out, ld);
        bt_error_clear();
    } else {
        BT_LOG_INFO("CUDA", "gemm tune fp8 t=%d o=%d ld=%d out=%s%s: %s "
                    "%.1f us (%.0f TFLOP/s) [%s us] in %.0f ms", n_tok,
                    n_out, ld, gemm__dt_name(out_dt), acc ? " +=" : "",
                    best_name, best_us, flop / (best_us * 1e-6) / 1e12, line,
                    (bt_time_s() - t0) * 1e3);
        if (ctx->cache_path != NULL)
            gemm__cache_save(ctx);
    }
    gemm__scratch_free(&sc);
}

/* Installs the cache file's pick for the vec plan p, when it is there
 * and can run: the vec or the plain plan's algorithm still accepted by
 * cublasLtMatmulAlgoCheck within the workspace (the plain one's f32 sums
 * within a->d_acc), or the skinny GEMM where it is built. */
static bool gemm_fp8_cache_install(worker_gemm_ctx_t *ctx,
                                   const gemm_plan_t *p,
                                   const worker_gemm_fp8_t *a)
{
    const int n_tok = p->n_tok, n_out = p->n_out, n_in = p->n_in;
    const cuda_dtype_t out_dt = p->out_dt;
    const bool acc = p->accumulate;
    const gemm_cache_entry_t *e;
    const gemm_plan_t *ap = p;
    cublasLtMatmulHeuristicResult_t chk;
    gemm_tuned_t *t;
    int path = GEMM_FP8_VEC;

    if (ctx->n_cached == 0 || ctx->n_tuned == GEMM_MAX_TUNED)
        return false;
    e = gemm__cache_find(ctx->cached, ctx->n_cached, n_tok, n_out, n_in,
                         out_dt, GEMM_CACHE_KIND_FP8_VEC, acc);
    if (e == NULL)
        return false;
    if (strcmp(e->choice, "skinny") == 0)
        path = GEMM_FP8_SKINNY;
    else if (e->choice[0] == 'p')
        path = GEMM_FP8_PLAIN;
    if ((path == GEMM_FP8_SKINNY) == (e->lt != 0))
        return false; /* an algorithm for the skinny GEMM, or none */
    if (path == GEMM_FP8_SKINNY &&
        !gemm_fp8_skinny_can(ctx, n_tok, n_out, n_in))
        return false;
    if (path == GEMM_FP8_PLAIN &&
        (!gemm_fp8_plain_can(n_tok, n_out, a) ||
         (ap = gemm_fp8_plan(ctx, n_tok, n_out, n_in)) == NULL)) {
        bt_error_clear();
        return false;
    }
    t = &ctx->tuned[ctx->n_tuned];
    memset(t, 0, sizeof(*t));
    memcpy(&t->algo, e->algo, sizeof(t->algo));
    memset(&chk, 0, sizeof(chk));
    if (path != GEMM_FP8_SKINNY &&
        (cublasLtMatmulAlgoCheck(ctx->handle, ap->op, ap->a, ap->b, ap->d,
                                 ap->d, &t->algo,
                                 &chk) != CUBLAS_STATUS_SUCCESS ||
         chk.workspaceSize > ctx->ws_bytes))
        return false;
    t->bucket = n_tok;
    t->n_out = n_out;
    t->n_in = n_in;
    t->out_dt = out_dt;
    t->kind = GEMM_CACHE_KIND_FP8_VEC;
    t->accumulate = acc;
    t->fp8_path = path;
    t->choice = GEMM_CHOICE_LT +
                (path == GEMM_FP8_SKINNY ? 0 : atoi(e->choice + 2));
    t->us = e->us;
    ctx->n_tuned++;
    ctx->setups++;
    ctx->cache_hits++;
    BT_LOG_INFO("CUDA", "gemm tune fp8 t=%d o=%d ld=%d: %s from %s", n_tok,
                n_out, n_in, e->choice, ctx->cache_path);
    return true;
}

/* Decode graphs' FP8 token counts past the skinny GEMM's route: a graph
 * is captured without an uncaptured run of its own, so these are tuned
 * together at a weight shape's first uncaptured use (a 16-token warm-up
 * prompt), on inputs of the tuner's own (E4M3 1.0, unit scales). */
static const int gemm_fp8_decode_toks[] = {64, 128, 256,
                                           GEMM_FP8_DECODE_TOK_MAX};

static void gemm_fp8_tune_decode(worker_gemm_ctx_t *ctx, int n_out, int ld,
                                 cuda_dtype_t out_dt, bool acc,
                                 const worker_gemm_fp8_t *a,
                                 cudaStream_t stream)
{
    const int key[4] = { n_out, ld, (int)out_dt, acc };
    const int n_dec = (int)BT_ARRAY_SIZE(gemm_fp8_decode_toks);
    float ones[GEMM_FP8_DECODE_TOK_MAX];
    worker_gemm_fp8_t in = *a;
    bool todo[BT_ARRAY_SIZE(gemm_fp8_decode_toks)], any = false;
    uint8_t *d_x = NULL;
    float *d_s = NULL;

    if (!ctx->tune || ctx->fp8_force_epilogue)
        return;
    for (int i = 0; i < ctx->n_fp8_dec_done; i++)
        if (memcmp(ctx->fp8_dec_done[i], key, sizeof(key)) == 0)
            return;
    if (ctx->n_fp8_dec_done == GEMM_FP8_BAD_MAX ||
        ctx->n_tuned + n_dec > GEMM_MAX_TUNED || gemm__capturing(stream))
        return;
    memcpy(ctx->fp8_dec_done[ctx->n_fp8_dec_done++], key, sizeof(key));
    if (ctx->fp8_vec < 0)
        gemm_fp8_vec_probe(ctx, stream);
    if (ctx->fp8_vec == 0)
        return;
    /* the cache file's picks first: timing needs inputs of our own */
    for (int i = 0; i < n_dec; i++) {
        const int n_tok = gemm_fp8_decode_toks[i];
        gemm_plan_t *p = NULL;

        todo[i] = gemm__tuned_find_kind(ctx, n_tok, n_out, ld, out_dt,
                                        GEMM_CACHE_KIND_FP8_VEC,
                                        acc) == NULL &&
                  gemm__plan_find_kind(ctx, n_tok, n_out, ld, GEMM_DT_E4M3,
                                       out_dt, acc, true, &p) == BT_OK &&
                  !gemm_fp8_cache_install(ctx, p, a);
        any |= todo[i];
        bt_error_clear();
    }
    if (!any)
        return;
    for (int i = 0; i < GEMM_FP8_DECODE_TOK_MAX; i++)
        ones[i] = 1.0f;
    if (cudaMalloc((void **)&d_x, (size_t)GEMM_FP8_DECODE_TOK_MAX * ld) !=
            cudaSuccess ||
        cudaMalloc((void **)&d_s, sizeof(ones)) != cudaSuccess ||
        cudaMemsetAsync(d_x, 0x38, (size_t)GEMM_FP8_DECODE_TOK_MAX * ld,
                        stream) != cudaSuccess ||
        cudaMemcpyAsync(d_s, ones, sizeof(ones), cudaMemcpyHostToDevice,
                        stream) != cudaSuccess) {
        (void)cudaGetLastError();
        BT_LOG_WARN("CUDA", "FP8 decode shapes %d x %d not tuned: no scratch "
                    "inputs", n_out, ld);
        cudaFree(d_x);
        cudaFree(d_s);
        return;
    }
    in.d_xq = d_x;
    in.d_xs = d_s;
    in.gemv = false;
    for (int i = 0; i < n_dec; i++)
        if (todo[i])
            gemm_fp8_tune(ctx, gemm_fp8_decode_toks[i], n_out, ld, out_dt,
                          acc, &in, stream);
    bt_error_clear();
    (void)cudaStreamSynchronize(stream);
    cudaFree(d_x);
    cudaFree(d_s);
}

/* Sends a shape to the epilogue path for good: cuBLASLt has no vec
 * algorithm for it, or refused the call (logged once per shape, with
 * the library's reason; the error is cleared). */
static void gemm_fp8_vec_drop(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                              int ld, cuda_dtype_t out_dt, bool acc)
{
    const int key[5] = { n_tok, n_out, ld, (int)out_dt, acc };

    BT_LOG_INFO("CUDA", "FP8 GEMM %d x %d x %d (out %s%s): cuBLASLt does "
                "not run it with scale vectors (%s); f32 sums and a scaling "
                "pass", n_tok, n_out, ld, gemm__dt_name(out_dt),
                acc ? " +=" : "", bt_error_last());
    bt_error_clear();
    (void)cudaGetLastError();
    if (ctx->n_fp8_vec_bad < GEMM_FP8_BAD_MAX)
        memcpy(ctx->fp8_vec_bad[ctx->n_fp8_vec_bad++], key, sizeof(key));
}

/* Token counts whose FP8 products are timed: prefill's multiples of
 * GEMM_BIG_STEP, and decode graphs' powers of two past the skinny GEMM's
 * (other counts take the heuristic's first algorithm). */
static bool gemm_fp8_tuned_tok(int n_tok)
{
    if (n_tok % GEMM_BIG_STEP == 0)
        return n_tok <= GEMM_BIG_MAX;
    return n_tok > GEMM_FP8_SKINNY_ROUTE_MAX && n_tok <= GEMM_TUNE_MAX_TOK &&
           (n_tok & (n_tok - 1)) == 0;
}

/* The vec plan for this call and its algorithm (*p_p, *algo_p), or false
 * when the call takes the epilogue path: forced, the library without vec
 * (probed here at the first uncaptured call; a captured call before that
 * takes the epilogue), or no vec algorithm for the shape (logged once).
 * *path_p: how it runs (the tuner's pick; the plain plan's algorithm
 * with the scaling pass, or the skinny GEMM without a plan). */
static bool gemm_fp8_vec_pick(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                              int ld, cuda_dtype_t out_dt, bool acc,
                              const worker_gemm_fp8_t *a, cudaStream_t stream,
                              gemm_plan_t **p_p,
                              const cublasLtMatmulAlgo_t **algo_p,
                              gemm_fp8_path_t *path_p)
{
    const int key[5] = { n_tok, n_out, ld, (int)out_dt, acc };
    gemm_tuned_t *t = NULL;
    gemm_plan_t *p = NULL;

    if (ctx->fp8_force_epilogue)
        return false;
    if (ctx->fp8_vec < 0) {
        if (gemm__capturing(stream))
            return false;
        gemm_fp8_vec_probe(ctx, stream);
    }
    if (ctx->fp8_vec == 0)
        return false;
    for (int i = 0; i < ctx->n_fp8_vec_bad; i++)
        if (memcmp(ctx->fp8_vec_bad[i], key, sizeof(key)) == 0)
            return false;
    *path_p = GEMM_FP8_VEC;
    if (ctx->tune && gemm_fp8_tuned_tok(n_tok)) {
        t = gemm__tuned_find_kind(ctx, n_tok, n_out, ld, out_dt,
                                  GEMM_CACHE_KIND_FP8_VEC, acc);
        if (t == NULL && ctx->n_tuned < GEMM_MAX_TUNED &&
            !gemm__capturing(stream)) {
            if (gemm__plan_find_kind(ctx, n_tok, n_out, ld, GEMM_DT_E4M3,
                                     out_dt, acc, true, &p) == BT_OK &&
                !gemm_fp8_cache_install(ctx, p, a))
                gemm_fp8_tune(ctx, n_tok, n_out, ld, out_dt, acc, a, stream);
            bt_error_clear();
            t = gemm__tuned_find_kind(ctx, n_tok, n_out, ld, out_dt,
                                      GEMM_CACHE_KIND_FP8_VEC, acc);
        }
    }
    if (t != NULL && t->fp8_path == GEMM_FP8_SKINNY) {
        *p_p = NULL;
        *algo_p = NULL;
        *path_p = GEMM_FP8_SKINNY;
        return true;
    }
    if (t != NULL && t->fp8_path == GEMM_FP8_PLAIN &&
        (p = gemm_fp8_plan(ctx, n_tok, n_out, ld)) != NULL) {
        *p_p = p;
        *algo_p = &t->algo;
        *path_p = GEMM_FP8_PLAIN;
        return true;
    }
    if (gemm__plan_find_kind(ctx, n_tok, n_out, ld, GEMM_DT_E4M3, out_dt, acc,
                             true, &p) != BT_OK) {
        gemm_fp8_vec_drop(ctx, n_tok, n_out, ld, out_dt, acc);
        return false;
    }
    *p_p = p;
    *algo_p = t != NULL ? &t->algo : &p->algo;
    return true;
}

void worker_gemm_fp8_force_epilogue(worker_gemm_ctx_t *ctx, bool on)
{
    ctx->fp8_force_epilogue = on;
}

void worker_gemm_fp8_force_cublaslt(worker_gemm_ctx_t *ctx, bool on)
{
    ctx->fp8_force_cublaslt = on;
}

/* 2-8 tokens: the skinny GEMM only on wgmma (H100, L2 flushed, an 8B
 * layer's four products at 8 tokens: GEMV 144 us, skinny 102; at 4: 138
 * / 101; test_cuda_fp8 "fp8 small").  One token stays on the GEMV (105 /
 * 102, and the GEMV's fused form saves the input kernel). */
bool worker_gemm_fp8_uses_skinny(const worker_gemm_ctx_t *ctx, int n_tok,
                                 const worker_gemm_fp8_t *a)
{
    return a->gemv && ctx->fp8_skinny && a->d_xq != NULL &&
           (n_tok > CUDA_GEMV_FP8_MAX_TOK ||
            (n_tok >= 2 && cuda_gemm_fp8_skinny_native()));
}

/* The gemv form of worker_gemm_fp8 (a->gemv): the skinny GEMM in pieces
 * of CUDA_GEMM_FP8_SKINNY_MAX_TOK tokens where worker_gemm_fp8_uses_skinny,
 * else the GEMV in pieces of CUDA_GEMV_FP8_MAX_TOK. */
static bt_status_t gemm_fp8_codes_run(worker_gemm_ctx_t *ctx, int n_tok,
                                      int n_out, int ld,
                                      const worker_gemm_fp8_t *a, void *d_y,
                                      cuda_dtype_t out_dt, bool accumulate,
                                      cudaStream_t stream)
{
    const size_t es = cuda_dtype_size(out_dt);
    bt_status_t status = BT_OK;

    if (worker_gemm_fp8_uses_skinny(ctx, n_tok, a))
        return gemm_fp8_skinny_run(ctx, n_tok, n_out, ld, a, d_y, out_dt,
                                   accumulate, stream);
    for (int t0 = 0; t0 < n_tok && status == BT_OK;
         t0 += CUDA_GEMV_FP8_MAX_TOK) {
        const int n = BT_MIN(CUDA_GEMV_FP8_MAX_TOK, n_tok - t0);

        status = cuda_gemv_fp8(
            n, n_out, ld, a->d_xq != NULL ? a->d_xq + (size_t)t0 * ld : NULL,
            n_tok == 1 ? a->d_xv : NULL, a->d_xs + t0, a->d_wq, a->d_ws,
            (char *)d_y + (size_t)t0 * n_out * es, out_dt, accumulate,
            stream);
    }
    return status;
}

bool worker_gemm_fp8_uses_vec(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                              int ld, const worker_gemm_fp8_t *a,
                              cuda_dtype_t out_dt, bool accumulate,
                              cudaStream_t stream)
{
    gemm_plan_t *p;
    const cublasLtMatmulAlgo_t *algo;
    gemm_fp8_path_t path;

    return !a->gemv && n_tok > 0 &&
           gemm_fp8_vec_pick(ctx, n_tok, n_out, ld, out_dt, accumulate, a,
                             stream, &p, &algo, &path) &&
           path == GEMM_FP8_VEC;
}

bt_status_t worker_gemm_fp8(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                            int ld, const worker_gemm_fp8_t *a, void *d_y,
                            cuda_dtype_t out_dt, bool accumulate,
                            cudaStream_t stream)
{
    const size_t es = cuda_dtype_size(out_dt);
    const int ldd = cuda_fp8_ld(n_out);
    const float one = 1.0f, zero = 0.0f;
    bt_status_t status = BT_OK;
    int chunk;

    BT_ASSERT(n_tok >= 0 && n_out > 0 && ld > 0 && ld % 16 == 0);
    if (n_tok == 0)
        return BT_OK;
    gemm_fp8_tune_decode(ctx, n_out, ld, out_dt, accumulate, a, stream);
    if (a->gemv)
        return gemm_fp8_codes_run(ctx, n_tok, n_out, ld, a, d_y, out_dt,
                                  accumulate, stream);
    {
        gemm_plan_t *p;
        const cublasLtMatmulAlgo_t *algo;
        gemm_fp8_path_t path;

        if (gemm_fp8_vec_pick(ctx, n_tok, n_out, ld, out_dt, accumulate, a,
                              stream, &p, &algo, &path)) {
            status = gemm_fp8_cand_run(ctx, p, algo, a, n_tok, n_out, ld,
                                       d_y, out_dt, accumulate, path,
                                       stream);
            if (status == BT_OK)
                return BT_OK;
            /* refused at the call (cuBLASLt checks its arguments before
             * it enqueues anything): this shape takes the epilogue from
             * now on; a device fault fails the epilogue's call as well */
            gemm_fp8_vec_drop(ctx, n_tok, n_out, ld, out_dt, accumulate);
            status = BT_OK;
        }
    }
    chunk = gemm_fp8_chunk(n_tok, n_out, a->acc_floats);
    for (int t0 = 0; t0 < n_tok && status == BT_OK; t0 += chunk) {
        int n = BT_MIN(chunk, n_tok - t0);
        gemm_plan_t *p = gemm_fp8_plan(ctx, gemm_fp8_plan_tok(n), n_out, ld);

        if (p == NULL)  /* planned by worker_gemm_fp8_gemv above */
            return BT_ERROR(BT_ERR_CUDA, "CUDA", "FP8 plan %d x %d x %d "
                            "lost", n, n_out, ld);
        status = gemm__check(cublasLtMatmul(ctx->handle, p->op, &one, a->d_wq,
                                            p->a,
                                            a->d_xq + (size_t)t0 * ld, p->b,
                                            &zero, a->d_acc, p->d, a->d_acc,
                                            p->d, &p->algo, ctx->d_ws,
                                            ctx->ws_bytes, stream),
                             "fp8 matmul");
        if (status == BT_OK)
            status = cuda_fp8_scale_out(
                a->d_acc, ldd, a->d_xs + t0, a->d_ws, n, n_out,
                (char *)d_y + (size_t)t0 * n_out * es, out_dt, accumulate,
                stream);
    }
    return status;
}
