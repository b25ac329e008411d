/*
 * gemm.c - worker_gemm(): row-major y = x w^T through cuBLASLt.
 *
 * cuBLASLt is column-major, so the row-major product y (t, o) = x (t, i)
 * w (o, i)^T is computed as the column-major D (o, t) = op(A) B with
 * A = w seen as (i, o) column-major and transposed, B = x seen as (i, t):
 * m = n_out, n = n_tok, k = n_in.  Descriptors and the heuristic's pick
 * are built the first time a shape is seen and kept (llm.c
 * matmul_cublaslt, minus its globals).
 *
 * Skinny shapes (decode steps, <= GEMM_TUNE_MAX_TOK tokens, bf16) are
 * autotuned: the first time a weight shape (n_out, n_in, out dtype) is
 * used OUTSIDE stream capture (a prefill, normally, before any decode
 * graph is captured), every token bucket 1, 2, 4, ..., 128 of that shape
 * is timed with CUDA events on the caller's stream (L2 flushed before each
 * run, median of GEMM_TUNE_REPS; captured in a graph behind a small lead
 * kernel, as in a decode step: gemm_lead_t; the candidates within 4% of
 * the best then timed again, interleaved: gemm_tune_final) for each GEMV
 * variant that supports it
 * (kernels/gemv.h) and the first GEMM_LT_CANDS algorithms of cuBLASLt's
 * heuristic; every GEMV variant's output is first checked against
 * cuBLASLt's on the same pseudo-random input (a variant that disagrees is
 * dropped with a WARN).  The winner per (bucket, n_out, n_in, out dtype)
 * is cached and logged at INFO; a call with n_tok tokens uses the winner
 * of its power-of-two bucket (a cuBLASLt winner only when n_tok is the
 * bucket itself, else the heuristic's algorithm).  Shapes first seen
 * during capture are never timed: they take the static default (the rows
 * GEMV for <= 2 tokens, else cuBLASLt's heuristic) until a call outside
 * capture tunes them (graphs captured before that keep the default).
 * Prefill shapes whose n_tok is a multiple of GEMM_BIG_STEP (up to
 * GEMM_BIG_MAX) are tuned too, exactly, among GEMM_LT_CANDS_BIG cuBLASLt
 * algorithms, at their first uncaptured use.
 * Split-K variants of cuBLASLt's first picks are timed too
 * (gemm__lt_add_splits).  Each candidate is timed after a read-only L2
 * flush (cuda_l2_flush).
 * Switches (cuda_switches.h, read once): BT_GEMM_TUNE=0 turns tuning off;
 * BT_GEMV_FORCE=NAME forces a GEMV variant wherever it supports the shape
 * ("lt": cuBLASLt); BT_GEMV_DISABLE=a,b drops variants from tuning;
 * BT_GEMV=0 is cuBLASLt only.
 * BT_GEMM_CACHE=PATH keeps the picks across processes (gemm_cache.h;
 * unset: ~/.cache/baton/gemm-HOST.txt, "off": none):
 * a family found there whole (every bucket, each cuBLASLt algorithm
 * accepted by cublasLtMatmulAlgoCheck) is installed without timing, and
 * each family tuned here is merged into the file (bt_write_file: a
 * temporary file renamed over it; concurrent workers lose at most a
 * family, which the next start re-tunes).  The file's key names the device, the
 * libraries, the GEMV variants and the tuning variables above, so a
 * file from another combination is ignored and rewritten.
 * The FP8 products and their tuner are gemm_fp8.c; what the two files
 * share (the context, plans, picks, scratch) is gemm_int.h.
 */
#include "gemm.h"

#include <cublasLt.h>
#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <unistd.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cuda_switches.h"
#include "gemm_cache.h"
#include "gemm_int.h"
#include "kernels/fp8.h"
#include "kernels/gemv.h"


bt_status_t gemm__check(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return BT_OK;
    return BT_ERROR(BT_ERR_CUDA, "CUDA", "cuBLASLt %s failed: %s (%d)", what,
                    cublasLtGetStatusString(st), (int)st);
}

static void gemm_cache_open(worker_gemm_ctx_t *ctx);

bt_status_t worker_gemm_ctx_create(size_t ws_bytes,
                                   worker_gemm_ctx_t **ctx_p)
{
    worker_gemm_ctx_t *ctx;
    bt_status_t status;

    ctx = bt_calloc(1, sizeof(*ctx), "gemm_ctx");
    if (ctx == NULL)
        return BT_ERR_NO_MEMORY;
    ctx->plans = bt_calloc(GEMM_MAX_PLANS, sizeof(*ctx->plans), "gemm_plans");
    if (ctx->plans == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_free_ctx;
    }
    ctx->tuned = bt_calloc(GEMM_MAX_TUNED, sizeof(*ctx->tuned), "gemm_tuned");
    if (ctx->tuned == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_free_plans;
    }
    status = gemm__check(cublasLtCreate(&ctx->handle), "create");
    if (status != BT_OK)
        goto err_free_plans;
    status = cuda__dev_malloc(&ctx->d_ws, ws_bytes, "gemm_workspace");
    if (status != BT_OK)
        goto err_destroy_handle;
    ctx->ws_bytes = ws_bytes;
    status = cuda__dev_malloc((void **)&ctx->d_cnt,
                              GEMM_TC_COUNTERS * sizeof(int), "gemm_tc_cnt");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&ctx->d_part, GEMM_TC_PART_BYTES,
                                  "gemm_tc_part");
    if (status != BT_OK)
        goto err_free_ws;
    status = BT_CUDA_STATUS(
        cudaMemset(ctx->d_cnt, 0, GEMM_TC_COUNTERS * sizeof(int)));
    if (status != BT_OK)
        goto err_free_ws;
    ctx->gemv_ws.d_part = ctx->d_part;
    ctx->gemv_ws.part_bytes = GEMM_TC_PART_BYTES;
    ctx->gemv_ws.d_cnt = ctx->d_cnt;
    ctx->gemv_ws.n_cnt = GEMM_TC_COUNTERS;
    {
        const char *env = cuda_switches()->gemv; /* 0: cuBLASLt for all */
        ctx->use_gemv = env == NULL || strcmp(env, "0") != 0;
        env = cuda_switches()->gemm_tune; /* 0: static defaults */
        ctx->tune = ctx->use_gemv && (env == NULL || strcmp(env, "0") != 0);
        env = cuda_switches()->fp8_fast_accum;
        ctx->fp8_fast_accum = env == NULL || strcmp(env, "0") != 0;
        if (!ctx->fp8_fast_accum)
            BT_LOG_INFO("CUDA", "FP8 GEMMs in exact accumulation "
                        "(BT_FP8_FAST_ACCUM=0)");
    }
    /* Shared-memory limits of the ring kernels, outside any capture.  A
     * failure only costs those kernels (their launches fail the tuner's
     * check, which then keeps the defaults). */
    if (cuda_gemv_prepare() != BT_OK) {
        BT_LOG_WARN("CUDA", "GEMV ring kernels unavailable: autotuning off");
        bt_error_clear();
        (void)cudaGetLastError();
        ctx->tune = false;
    }
    if (ctx->tune)
        gemm_cache_open(ctx);
    ctx->fp8_vec = -1;
    /* (a failure only costs the kernel: 2-8 tokens stay on the GEMV,
     * more on cuBLASLt) */
    ctx->fp8_skinny = cuda_gemm_fp8_skinny_prepare() == BT_OK;
    if (!ctx->fp8_skinny) {
        BT_LOG_WARN("CUDA", "skinny FP8 GEMM unavailable: 2-8 FP8 tokens "
                    "take the GEMV, 9-%d cuBLASLt",
                    CUDA_GEMM_FP8_SKINNY_MAX_TOK);
        bt_error_clear();
        (void)cudaGetLastError();
    }
    *ctx_p = ctx;
    return BT_OK;

err_free_ws:
    cuda__dev_free((void **)&ctx->d_part);
    cuda__dev_free((void **)&ctx->d_cnt);
    cuda__dev_free(&ctx->d_ws);
err_destroy_handle:
    cublasLtDestroy(ctx->handle);
err_free_plans:
    bt_free(ctx->tuned);
    bt_free(ctx->plans);
err_free_ctx:
    bt_free(ctx);
    return status;
}

static void gemm_plan_cleanup(gemm_plan_t *p)
{
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof(*p));
}

void worker_gemm_ctx_destroy(worker_gemm_ctx_t **ctx_p)
{
    worker_gemm_ctx_t *ctx = *ctx_p;

    if (ctx == NULL)
        return;
    for (int i = 0; i < ctx->n_plans; i++)
        gemm_plan_cleanup(&ctx->plans[i]);
    cuda__dev_free((void **)&ctx->d_part);
    cuda__dev_free((void **)&ctx->d_cnt);
    cuda__dev_free(&ctx->d_ws);
    cublasLtDestroy(ctx->handle);
    bt_free(ctx->cached);
    bt_free(ctx->cache_path);
    bt_free(ctx->tuned);
    bt_free(ctx->plans);
    bt_free(ctx);
    *ctx_p = NULL;
}

static cudaDataType_t gemm_cuda_type(cuda_dtype_t dt)
{
    if (dt == GEMM_DT_E4M3)
        return CUDA_R_8F_E4M3;
    return dt == CUDA_DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

const char *gemm__dt_name(cuda_dtype_t dt)
{
    return dt == GEMM_DT_E4M3 ? "e4m3" : dt == CUDA_DT_F32 ? "f32" : "bf16";
}

/* Leading dimension of a plan's D: FP8 plans write f32 sums with rows
 * of whole 16-byte groups (cuBLASLt's FP8 kernels want aligned ones). */
static int gemm_ldd(const gemm_plan_t *p)
{
    return p->in_dt == GEMM_DT_E4M3 && !p->fp8_vec ? cuda_fp8_ld(p->n_out)
                                                   : p->n_out;
}

/* The heuristic's first n_req algorithms for plan p's descriptors (at
 * most the workspace) into res, their count into *n_p (0: none). */
bt_status_t gemm__lt_heuristic(worker_gemm_ctx_t *ctx,
                               const gemm_plan_t *p, int n_req,
                               cublasLtMatmulHeuristicResult_t *res,
                               int *n_p)
{
    cublasLtMatmulPreference_t pref = NULL;
    bt_status_t status;

    *n_p = 0;
    status = gemm__check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    if (status == BT_OK)
        status = gemm__check(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->ws_bytes,
            sizeof(ctx->ws_bytes)), "pref workspace");
    if (status == BT_OK)
        status = gemm__check(cublasLtMatmulAlgoGetHeuristic(
            ctx->handle, p->op, p->a, p->b, p->d, p->d, pref, n_req, res,
            n_p), "heuristic");
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return status;
}

/* Builds the descriptors of one shape and asks the heuristic. */
static bt_status_t gemm_plan_build(worker_gemm_ctx_t *ctx, gemm_plan_t *p)
{
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    bt_status_t status;

    status = gemm__check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F,
                                                  CUDA_R_32F), "desc");
    if (status != BT_OK)
        goto err;
    status = gemm__check(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
    if (status != BT_OK)
        goto err;
    status = gemm__check(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
    if (status != BT_OK)
        goto err;
    if (p->fp8_vec) {
        /* A = w: one scale per output row (cuBLASLt's m); B = x: one per
         * token (its n).  The pointers are set per call (gemm_fp8_vec_run);
         * until then any device address stands in. */
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;

        status = gemm__check(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)),
            "A scale mode");
        if (status == BT_OK)
            status = gemm__check(cublasLtMatmulDescSetAttribute(
                p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                sizeof(mode)), "B scale mode");
        if (status == BT_OK)
            status = gemm__check(cublasLtMatmulDescSetAttribute(
                p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ctx->d_ws,
                sizeof(ctx->d_ws)), "A scale pointer");
        if (status == BT_OK)
            status = gemm__check(cublasLtMatmulDescSetAttribute(
                p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ctx->d_ws,
                sizeof(ctx->d_ws)), "B scale pointer");
        if (status != BT_OK)
            goto err;
    }
    if (p->in_dt == GEMM_DT_E4M3 && ctx->fp8_fast_accum) {
        /* the tensor cores' own accumulator for the whole K, never
         * promoted to f32 registers on the way (XLA's and PyTorch's
         * use_fast_accum).  H100, 2026-12-05 (test_cuda_fp8 --paths,
         * 2048 tokens): the 8B linears 1.10-1.23x faster, relative error
         * against the cpu 1.7e-3 -> 2.1e-3 (bf16 out) and 1.2e-4 ->
         * 1.3-2.7e-3 (f32 +=); prefill 2053 40.0 -> 35.2 ms, serving
         * fp8 2048/128 2,643 -> 2,887 tok/s; H200, 2026-12-06: prefill
         * 2048 37.3 -> 31.6 ms (PERFORMANCE.md). */
        const int8_t on = 1;

        status = gemm__check(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)),
            "fast accumulation");
        if (status != BT_OK)
            goto err;
    }
    status = gemm__check(cublasLtMatrixLayoutCreate(
        &p->a, gemm_cuda_type(p->in_dt), p->n_in, p->n_out, p->n_in),
        "layout A");
    if (status != BT_OK)
        goto err;
    status = gemm__check(cublasLtMatrixLayoutCreate(
        &p->b, gemm_cuda_type(p->in_dt), p->n_in, p->n_tok, p->n_in),
        "layout B");
    if (status != BT_OK)
        goto err;
    status = gemm__check(cublasLtMatrixLayoutCreate(
        &p->d, gemm_cuda_type(p->out_dt), p->n_out, p->n_tok, gemm_ldd(p)),
        "layout D");
    if (status != BT_OK)
        goto err;
    status = gemm__lt_heuristic(ctx, p, 1, &res, &n_res);
    if (status != BT_OK)
        goto err;
    if (n_res == 0) {
        status = BT_ERROR(BT_ERR_CUDA, "CUDA",
                          "cuBLASLt has no algorithm for %d x %d x %d "
                          "(in %s%s, out %s)", p->n_tok, p->n_out, p->n_in,
                          gemm__dt_name(p->in_dt),
                          p->fp8_vec ? " with scale vectors" : "",
                          gemm__dt_name(p->out_dt));
        goto err;
    }
    p->algo = res.algo;
    return BT_OK;

err:
    gemm_plan_cleanup(p);
    return status;
}

/* The plan of a shape (fp8_vec: an E4M3 plan with the scale vectors in
 * the GEMM), built on first use.  The pointer stays valid until the next
 * plan is built (the oldest is recycled past GEMM_MAX_PLANS). */
bt_status_t gemm__plan_find_kind(worker_gemm_ctx_t *ctx, int n_tok,
                                 int n_out, int n_in,
                                 cuda_dtype_t in_dt,
                                 cuda_dtype_t out_dt, bool accumulate,
                                 bool fp8_vec, gemm_plan_t **plan_p)
{
    gemm_plan_t *p;
    bt_status_t status;

    for (int i = 0; i < ctx->n_plans; i++) {
        p = &ctx->plans[i];
        if (p->n_tok == n_tok && p->n_out == n_out && p->n_in == n_in &&
            p->in_dt == in_dt && p->out_dt == out_dt &&
            p->accumulate == accumulate && p->fp8_vec == fp8_vec) {
            *plan_p = p;
            return BT_OK;
        }
    }
    if (ctx->n_plans == GEMM_MAX_PLANS) {
        /* Shapes beyond the cache: recycle the oldest slot. */
        gemm_plan_cleanup(&ctx->plans[0]);
        memmove(&ctx->plans[0], &ctx->plans[1],
                (GEMM_MAX_PLANS - 1) * sizeof(ctx->plans[0]));
        ctx->n_plans--;
        memset(&ctx->plans[ctx->n_plans], 0, sizeof(ctx->plans[0]));
    }
    p = &ctx->plans[ctx->n_plans];
    p->n_tok = n_tok;
    p->n_out = n_out;
    p->n_in = n_in;
    p->in_dt = in_dt;
    p->out_dt = out_dt;
    p->accumulate = accumulate;
    p->fp8_vec = fp8_vec;
    status = gemm_plan_build(ctx, p);
    if (status != BT_OK)
        return status;
    ctx->n_plans++;
    ctx->setups++;
    *plan_p = p;
    return BT_OK;
}

bt_status_t gemm__plan_find(worker_gemm_ctx_t *ctx, int n_tok,
                            int n_out, int n_in, cuda_dtype_t in_dt,
                            cuda_dtype_t out_dt, bool accumulate,
                            gemm_plan_t **plan_p)
{
    return gemm__plan_find_kind(ctx, n_tok, n_out, n_in, in_dt, out_dt,
                                accumulate, false, plan_p);
}

uint64_t worker_gemm_setups(const worker_gemm_ctx_t *ctx)
{
    return ctx->setups;
}

int worker_gemm_cache_hits(const worker_gemm_ctx_t *ctx)
{
    return ctx->cache_hits;
}

bool worker_gemm_gemv_enabled(const worker_gemm_ctx_t *ctx)
{
    return ctx->use_gemv;
}

static bt_status_t gemm_lt_run(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                               const cublasLtMatmulAlgo_t *algo,
                               const void *d_x, const void *d_w, void *d_y,
                               bool accumulate, cudaStream_t stream)
{
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;

    return gemm__check(cublasLtMatmul(ctx->handle, p->op, &alpha, d_w, p->a,
                                      d_x, p->b, &beta, d_y, p->d, d_y, p->d,
                                      algo, ctx->d_ws, ctx->ws_bytes, stream),
                       "matmul");
}

// ---------------------------------------------------------------------
// Autotuning

static int gemm_bucket(int n_tok)
{
    int b = 1;

    while (b < n_tok)
        b <<= 1;
    return b;
}

gemm_tuned_t *gemm__tuned_find_kind(worker_gemm_ctx_t *ctx,
                                    int bucket, int n_out, int n_in,
                                    cuda_dtype_t out_dt, int kind,
                                    bool accumulate)
{
    for (int i = 0; i < ctx->n_tuned; i++) {
        gemm_tuned_t *t = &ctx->tuned[i];
        if (t->bucket == bucket && t->n_out == n_out && t->n_in == n_in &&
            t->out_dt == out_dt && t->kind == kind &&
            t->accumulate == accumulate)
            return t;
    }
    return NULL;
}

/* A bf16 weight shape's pick (the FP8 GEMM's are gemm_fp8_tuned's). */
static gemm_tuned_t *gemm_tuned_find(worker_gemm_ctx_t *ctx, int bucket,
                                     int n_out, int n_in, cuda_dtype_t out_dt)
{
    return gemm__tuned_find_kind(ctx, bucket, n_out, n_in, out_dt,
                                 GEMM_CACHE_KIND_DENSE, false);
}

/* True when variant k is listed in BT_GEMV_DISABLE (comma-separated). */
static bool gemm_gemv_disabled(int k)
{
    const char *env = cuda_switches()->gemv_disable;
    const char *name = cuda_gemv_kernel_name((cuda_gemv_kernel_t)k);
    size_t len = strlen(name);

    for (const char *p = env; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0)
            return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}


/* The tuners' scratch after the caller zeroed it: outputs y and ref of
 * y_bytes, the flush buffer, the error sums, two events.  The bf16 tuner
 * adds its inputs (d_x); gemm__scratch_free undoes either, also after a
 * failure part way. */
bt_status_t gemm__scratch_alloc(gemm_scratch_t *sc, size_t y_bytes)
{
    bt_status_t status;

    status = cuda__dev_malloc(&sc->d_y, y_bytes, "gemm_tune_y");
    if (status == BT_OK)
        status = cuda__dev_malloc(&sc->d_ref, y_bytes, "gemm_tune_ref");
    if (status == BT_OK)
        status = cuda__dev_malloc(&sc->d_flush, GEMM_FLUSH_BYTES,
                                  "gemm_tune_flush");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&sc->d_err, 3 * sizeof(double),
                                  "gemm_tune_err");
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&sc->ev[0]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&sc->ev[1]));
    return status;
}

void gemm__scratch_free(gemm_scratch_t *sc)
{
    if (sc->ev[1])
        cudaEventDestroy(sc->ev[1]);
    if (sc->ev[0])
        cudaEventDestroy(sc->ev[0]);
    cuda__dev_free((void **)&sc->d_err);
    cuda__dev_free(&sc->d_flush);
    cuda__dev_free(&sc->d_ref);
    cuda__dev_free(&sc->d_y);
    cuda__dev_free(&sc->d_x);
}

/* Bytes of the flush buffer's head the lead uses for n_in columns of
 * GEMM_TUNE_MAX_TOK rows: f32 input, bf16 output. */
static size_t gemm_lead_bytes(int n_in)
{
    return (size_t)GEMM_TUNE_MAX_TOK * n_in * (4 + 2);
}

/* The lead of plan p's candidates: what precedes a skinny product in a
 * decode step (see gemm_lead_t). */
static bt_status_t gemm_lead_run(const gemm_plan_t *p,
                                 const gemm_scratch_t *sc,
                                 cudaStream_t stream)
{
    char *head = (char *)sc->d_flush;
    const size_t x_bytes = (size_t)GEMM_TUNE_MAX_TOK * p->n_in * 4;

    return cuda_gemv_tune_lead((const float *)head, p->n_tok, p->n_in,
                               head + x_bytes, stream);
}

/* Runs candidate c (gemv variant, or GEMM_CHOICE_LT + i of algos). */
static bt_status_t gemm_cand_run(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                                 const cublasLtMatmulAlgo_t *algos, int c,
                                 const void *d_x, const void *d_w, void *d_y,
                                 cudaStream_t stream)
{
    if (c >= GEMM_CHOICE_LT)
        return gemm_lt_run(ctx, p, &algos[c - GEMM_CHOICE_LT], d_x, d_w, d_y,
                           false, stream);
    return cuda_gemv_run((cuda_gemv_kernel_t)c, p->n_tok, p->n_out, p->n_in,
                         d_x, d_w, d_y, p->out_dt, false, &ctx->gemv_ws,
                         stream);
}

/* One timed launch: the lead (when sc->lead is set) then candidate c
 * (c < 0: the lead alone), or the graph ge holding them. */
static bt_status_t gemm_cand_launch(worker_gemm_ctx_t *ctx,
                                    const gemm_plan_t *p,
                                    const cublasLtMatmulAlgo_t *algos, int c,
                                    const void *d_w, const gemm_scratch_t *sc,
                                    cudaGraphExec_t ge, cudaStream_t stream)
{
    bt_status_t status = BT_OK;

    if (ge != NULL)
        return BT_CUDA_STATUS(cudaGraphLaunch(ge, stream));
    if (sc->lead != GEMM_LEAD_NONE)
        status = gemm_lead_run(p, sc, stream);
    if (status == BT_OK && c >= 0)
        status = gemm_cand_run(ctx, p, algos, c, sc->d_x, d_w, sc->d_y,
                               stream);
    return status;
}

/* Readies candidate c (c < 0: the lead alone) for timing: behind a
 * captured lead, the lead and c as one graph (*ge_p; else NULL), then
 * one untimed run. */
static bt_status_t gemm_cand_prepare(worker_gemm_ctx_t *ctx,
                                     const gemm_plan_t *p,
                                     const cublasLtMatmulAlgo_t *algos, int c,
                                     const void *d_w, const gemm_scratch_t *sc,
                                     cudaStream_t stream,
                                     cudaGraphExec_t *ge_p)
{
    cudaGraph_t g = NULL;
    bt_status_t status = BT_OK;

    *ge_p = NULL;
    if (sc->lead == GEMM_LEAD_GRAPH) {
        status = BT_CUDA_STATUS(cudaStreamBeginCapture(
            stream, cudaStreamCaptureModeThreadLocal));
        if (status == BT_OK) {
            bt_status_t end;
            status = gemm_cand_launch(ctx, p, algos, c, d_w, sc, NULL, stream);
            end = BT_CUDA_STATUS(cudaStreamEndCapture(stream, &g));
            if (status == BT_OK)
                status = end;
        }
        if (status == BT_OK) {
            status = BT_CUDA_STATUS(cudaGraphInstantiate(ge_p, g, 0));
            if (status != BT_OK)
                *ge_p = NULL; /* no exec to destroy */
        }
        if (g != NULL)
            cudaGraphDestroy(g);
    }
    if (status == BT_OK)
        status = gemm_cand_launch(ctx, p, algos, c, d_w, sc, *ge_p, stream);
    if (status != BT_OK) {
        if (*ge_p != NULL)
            cudaGraphExecDestroy(*ge_p);
        *ge_p = NULL;
        (void)cudaGetLastError();
    }
    return status;
}

/* One timed run of a prepared candidate after an L2 flush, in
 * milliseconds. */
static bt_status_t gemm_cand_once(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                                  const cublasLtMatmulAlgo_t *algos, int c,
                                  const void *d_w, gemm_scratch_t *sc,
                                  cudaGraphExec_t ge, cudaStream_t stream,
                                  float *ms_p)
{
    bt_status_t status;

    status = cuda_l2_flush(sc->d_flush, GEMM_FLUSH_BYTES, stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(sc->ev[0], stream));
    if (status == BT_OK)
        status = gemm_cand_launch(ctx, p, algos, c, d_w, sc, ge, stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(sc->ev[1], stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventSynchronize(sc->ev[1]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventElapsedTime(ms_p, sc->ev[0],
                                                     sc->ev[1]));
    return status;
}

/* The median of t[0 .. n) in microseconds (t in ms; sorts t), less the
 * lead's time behind a lead when `less_lead`. */
float gemm__median_us(float *t, int n, const gemm_scratch_t *sc,
                      bool less_lead)
{
    float us;

    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float v = t[j];
            t[j] = t[j - 1];
            t[j - 1] = v;
        }
    us = t[n / 2] * 1e3f;
    if (less_lead && sc->lead != GEMM_LEAD_NONE)
        us = BT_MAX(us - sc->lead_us, 0.1f);
    return us;
}

/* Median time in microseconds of candidate c (c < 0: the lead alone) over
 * GEMM_TUNE_REPS runs, each after an L2 flush; one untimed run first.
 * Behind a lead, the lead's own time (sc->lead_us) is taken off. */
static bt_status_t gemm_cand_time(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                                  const cublasLtMatmulAlgo_t *algos, int c,
                                  const void *d_w, gemm_scratch_t *sc,
                                  cudaStream_t stream, float *us_p)
{
    float t[GEMM_TUNE_REPS];
    cudaGraphExec_t ge = NULL;
    bt_status_t status;

    status = gemm_cand_prepare(ctx, p, algos, c, d_w, sc, stream, &ge);
    for (int r = 0; r < GEMM_TUNE_REPS && status == BT_OK; r++)
        status = gemm_cand_once(ctx, p, algos, c, d_w, sc, ge, stream,
                                &t[r]);
    if (ge != NULL)
        cudaGraphExecDestroy(ge);
    if (status != BT_OK)
        return status;
    *us_p = gemm__median_us(t, GEMM_TUNE_REPS, sc, c >= 0);
    return BT_OK;
}

/* The final round of a skinny bucket.  The first pass's medians of
 * GEMM_TUNE_REPS runs can differ by less than their noise (round 22:
 * picks ahead in the tuner were behind in the step).  So the candidates
 * within GEMM_FINAL_MARGIN of the best (GEMM_FINAL_MAX at most) run
 * again GEMM_FINAL_REPS times each, interleaved in a rotating order so that a drifting clock or an
 * order effect moves them all alike, and the best median wins.  cands /
 * us: the n candidates timed and their first-pass times; *best_p /
 * *best_us_p: in, the first pass's winner; out, the final's. */
static bt_status_t gemm_tune_final(worker_gemm_ctx_t *ctx,
                                   const gemm_plan_t *p,
                                   const cublasLtMatmulAlgo_t *algos,
                                   const void *d_w, gemm_scratch_t *sc,
                                   cudaStream_t stream, const int *cands,
                                   const float *us, int n, int *best_p,
                                   float *best_us_p, int *fin_p,
                                   float *fin_us_p, int *n_fin_p)
{
    int fin[GEMM_FINAL_MAX];
    float t[GEMM_FINAL_MAX][GEMM_FINAL_REPS];
    cudaGraphExec_t ge[GEMM_FINAL_MAX] = {NULL};
    const float limit = *best_us_p * (1.0f + GEMM_FINAL_MARGIN) + 0.2f;
    bool taken[GEMM_TUNE_CANDS_MAX] = {false};
    int n_fin = 0;
    bt_status_t status = BT_OK;

    *n_fin_p = 0;
    /* the finalists, fastest first */
    while (n_fin < GEMM_FINAL_MAX) {
        int k = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && us[i] <= limit && (k < 0 || us[i] < us[k]))
                k = i;
        if (k < 0)
            break;
        taken[k] = true;
        if (gemm_cand_prepare(ctx, p, algos, cands[k], d_w, sc, stream,
                              &ge[n_fin]) != BT_OK) {
            bt_error_clear();
            (void)cudaGetLastError();
            continue; /* timed once already: a transient failure, skip */
        }
        fin[n_fin++] = cands[k];
    }
    for (int r = 0; r < GEMM_FINAL_REPS && status == BT_OK && n_fin >= 2; r++)
        for (int j = 0; j < n_fin && status == BT_OK; j++) {
            const int f = (j + r) % n_fin;
            status = gemm_cand_once(ctx, p, algos, fin[f], d_w, sc, ge[f],
                                    stream, &t[f][r]);
        }
    for (int f = 0; f < n_fin; f++)
        if (ge[f] != NULL)
            cudaGraphExecDestroy(ge[f]);
    if (status != BT_OK || n_fin < 2)
        return status;
    for (int f = 0; f < n_fin; f++) {
        const float m = gemm__median_us(t[f], GEMM_FINAL_REPS, sc, true);
        fin_p[f] = fin[f];
        fin_us_p[f] = m;
        if (f == 0 || m < *best_us_p) {
            *best_p = fin[f];
            *best_us_p = m;
        }
    }
    *n_fin_p = n_fin;
    return BT_OK;
}

/* Sets up the bucket's lead: its own time, or, where even the lead alone
 * cannot be captured, the stream launches instead (logged once). */
static bt_status_t gemm_lead_time(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                                  const void *d_w, gemm_scratch_t *sc,
                                  cudaStream_t stream)
{
    bt_status_t status;

    sc->lead_us = 0.0f;
    status = gemm_cand_time(ctx, p, NULL, -1, d_w, sc, stream, &sc->lead_us);
    if (status != BT_OK && sc->lead == GEMM_LEAD_GRAPH) {
        BT_LOG_INFO("CUDA", "gemm tune: the lead cannot be captured on this "
                    "stream: timed on the stream instead");
        bt_error_clear();
        (void)cudaGetLastError();
        sc->lead = sc->lead_mode = GEMM_LEAD_STREAM;
        status = gemm_cand_time(ctx, p, NULL, -1, d_w, sc, stream,
                                &sc->lead_us);
    }
    return status;
}

/* Relative difference of d_y from sc->d_ref (n values of dt); > 1 when
 * anything is not finite. */
bt_status_t gemm__rel_err(const void *d_y, gemm_scratch_t *sc, size_t n,
                          cuda_dtype_t dt, cudaStream_t stream,
                          double *rel_p)
{
    double h[3];
    bt_status_t status;

    status = cuda_gemv_rel_err(d_y, sc->d_ref, n, dt, sc->d_err, stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(h, sc->d_err, sizeof(h),
                                                cudaMemcpyDeviceToHost,
                                                stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
    if (status != BT_OK)
        return status;
    *rel_p = h[2] > 0 ? 2.0 : sqrt(h[0] / (h[1] > 0 ? h[1] : 1.0));
    return BT_OK;
}

/* Relative L2 difference of variant c's output from cuBLASLt's (d_ref);
 * > 1 when anything is not finite. */
static bt_status_t gemm_cand_check(worker_gemm_ctx_t *ctx,
                                   const gemm_plan_t *p,
                                   const cublasLtMatmulAlgo_t *algos, int c,
                                   const void *d_w, gemm_scratch_t *sc,
                                   cudaStream_t stream, double *rel_p)
{
    size_t n = (size_t)p->n_tok * p->n_out;
    bt_status_t status;

    status = BT_CUDA_STATUS(cudaMemsetAsync(
        sc->d_y, 0xFF, n * cuda_dtype_size(p->out_dt), stream));
    if (status == BT_OK)
        status = gemm_cand_run(ctx, p, algos, c, sc->d_x, d_w, sc->d_y,
                               stream);
    if (status != BT_OK)
        return status;
    return gemm__rel_err(sc->d_y, sc, n, p->out_dt, stream, rel_p);
}

static gemm_plan_t *gemm_plan_find_or_null(worker_gemm_ctx_t *ctx, int n_tok,
                                           int n_out, int n_in,
                                           cuda_dtype_t in_dt,
                                           cuda_dtype_t out_dt);

/* Besides the heuristic's picks, the tuner times split-K variants of its
 * first GEMM_LT_SPLIT_BASES (every K split in gemm_lt_splits and every
 * reduction scheme the algorithm supports): the winners are mostly the
 * heuristic's algorithms with the split set to 1, a little faster at
 * batch 8 (round 13 of docs/PERFORMANCE.md). */

static const int gemm_lt_splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
static const uint32_t gemm_lt_reductions[] = {
    CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};

/* Appends to algos (n_algos of at most GEMM_LT_ALGOS_MAX) the split-K
 * variants of algos[0 .. GEMM_LT_SPLIT_BASES) that cuBLASLt accepts for
 * plan p within the workspace and that are not listed yet. */
void gemm__lt_add_splits(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                         cublasLtMatmulAlgo_t *algos, int *n_algos)
{
    const int n_base = BT_MIN(*n_algos, GEMM_LT_SPLIT_BASES);

    for (int b = 0; b < n_base; b++) {
        int32_t split_ok = 0;
        uint32_t red_mask = 0;
        size_t wr = 0;

        if (cublasLtMatmulAlgoCapGetAttribute(
                &algos[b], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_ok,
                sizeof(split_ok), &wr) != CUBLAS_STATUS_SUCCESS ||
            split_ok == 0)
            continue;
        if (cublasLtMatmulAlgoCapGetAttribute(
                &algos[b], CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask,
                sizeof(red_mask), &wr) != CUBLAS_STATUS_SUCCESS)
            red_mask = 0;
        for (size_t si = 0; si < BT_ARRAY_SIZE(gemm_lt_splits); si++) {
            const int32_t split = gemm_lt_splits[si];
            const size_t n_red =
                split == 1 ? 1 : BT_ARRAY_SIZE(gemm_lt_reductions);
            for (size_t ri = 0; ri < n_red; ri++) {
                const uint32_t red = split == 1 ? CUBLASLT_REDUCTION_SCHEME_NONE
                                                : gemm_lt_reductions[ri];
                cublasLtMatmulHeuristicResult_t chk;
                cublasLtMatmulAlgo_t a = algos[b];
                bool dup = false;

                if (*n_algos == GEMM_LT_ALGOS_MAX)
                    return;
                if (split > 1 && (red_mask & red) == 0)
                    continue;
                if (cublasLtMatmulAlgoConfigSetAttribute(
                        &a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                        sizeof(split)) != CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(
                        &a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                        sizeof(red)) != CUBLAS_STATUS_SUCCESS)
                    continue;
                memset(&chk, 0, sizeof(chk));
                if (cublasLtMatmulAlgoCheck(ctx->handle, p->op, p->a, p->b,
                                            p->d, p->d, &a, &chk) !=
                        CUBLAS_STATUS_SUCCESS ||
                    chk.state != CUBLAS_STATUS_SUCCESS ||
                    chk.workspaceSize > ctx->ws_bytes)
                    continue;
                for (int i = 0; i < *n_algos && !dup; i++)
                    dup = memcmp(&algos[i], &a, sizeof(a)) == 0;
                if (!dup)
                    algos[(*n_algos)++] = a;
            }
        }
    }
}

/* "ltI", or for a split-K variant (I >= n_heur) "ltI/kS" + the reduction
 * scheme's letter (i in place, c compute type, o output type). */
void gemm__lt_name(const cublasLtMatmulAlgo_t *algos, int i, int n_heur,
                   char *buf, size_t size)
{
    int32_t split = 1;
    uint32_t red = 0;
    size_t wr = 0;

    if (i < n_heur ||
        cublasLtMatmulAlgoConfigGetAttribute(
            &algos[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split),
            &wr) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(
            &algos[i], CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
            sizeof(red), &wr) != CUBLAS_STATUS_SUCCESS) {
        snprintf(buf, size, "lt%d", i);
        return;
    }
    snprintf(buf, size, "lt%d/k%d%s", i, (int)split,
             red == CUBLASLT_REDUCTION_SCHEME_INPLACE        ? "i"
             : red == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? "c"
             : red == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? "o"
                                                             : "");
}

/* Candidate cand's name: a GEMV variant's, or gemm__lt_name's. */
static void gemm_cand_name(const cublasLtMatmulAlgo_t *algos, int cand,
                           int n_heur, char *buf, size_t size)
{
    if (cand >= GEMM_CHOICE_LT)
        gemm__lt_name(algos, cand - GEMM_CHOICE_LT, n_heur, buf, size);
    else
        snprintf(buf, size, "%s",
                 cuda_gemv_kernel_name((cuda_gemv_kernel_t)cand));
}

/* Tunes one bucket of a weight shape (scratch ready); adds the entry. */
static bt_status_t gemm_tune_bucket(worker_gemm_ctx_t *ctx, int bucket,
                                    int n_out, int n_in, cuda_dtype_t out_dt,
                                    const void *d_w, gemm_scratch_t *sc,
                                    cudaStream_t stream)
{
    cublasLtMatmulAlgo_t algos[GEMM_LT_ALGOS_MAX];
    cublasLtMatmulHeuristicResult_t res[GEMM_LT_CANDS_BIG];
    const int n_req = bucket > GEMM_TUNE_MAX_TOK ? GEMM_LT_CANDS_BIG
                                                 : GEMM_LT_CANDS;
    int n_algos = 0, n_heur = 0, best = -1, n_ok = 0;
    int cands[GEMM_TUNE_CANDS_MAX];        /* timed, in order */
    float cand_us[GEMM_TUNE_CANDS_MAX];    /* ... their times */
    float best_us = 0.0f;
    char line[2048];
    size_t len = 0;
    gemm_plan_t *p;
    gemm_tuned_t *t;
    bt_status_t status;

    p = gemm_plan_find_or_null(ctx, bucket, n_out, n_in, CUDA_DT_BF16, out_dt);
    if (p == NULL)
        return BT_ERR_CUDA;
    /* cuBLASLt's candidates: the heuristic's first GEMM_LT_CANDS. */
    status = gemm__lt_heuristic(ctx, p, n_req, res, &n_algos);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n_algos; i++)
        algos[i] = res[i].algo;
    if (n_algos == 0)
        algos[n_algos++] = p->algo;
    n_heur = n_algos;
    if (bucket >= 3 && bucket <= GEMM_TUNE_MAX_TOK)
        gemm__lt_add_splits(ctx, p, algos, &n_algos);
    /* The reference output: the heuristic's first algorithm. */
    status = gemm_lt_run(ctx, p, &algos[0], sc->d_x, d_w, sc->d_ref, false,
                         stream);
    if (status != BT_OK)
        return status;
    sc->lead = bucket <= GEMM_TUNE_MAX_TOK ? sc->lead_mode : GEMM_LEAD_NONE;
    if (sc->lead != GEMM_LEAD_NONE) {
        status = gemm_lead_time(ctx, p, d_w, sc, stream);
        if (status != BT_OK)
            return status;
    }

    len += (size_t)snprintf(line + len, sizeof(line) - len, "[");
    for (int c = 0; c < CUDA_GEMV_N_KERNELS + n_algos; c++) {
        int cand = c < CUDA_GEMV_N_KERNELS ? c
                                           : GEMM_CHOICE_LT +
                                                 (c - CUDA_GEMV_N_KERNELS);
        char name[24];
        float us = 0.0f;

        const bool gemv = cand < GEMM_CHOICE_LT;
        if (gemv && (!cuda_gemv_kernel_ok((cuda_gemv_kernel_t)cand, bucket,
                                          n_out, n_in, CUDA_DT_BF16) ||
                     gemm_gemv_disabled(cand)))
            continue;
        gemm_cand_name(algos, cand, n_heur, name, sizeof(name));
        /* our GEMV variants and the split-K variants are checked against
         * the heuristic's first algorithm (the heuristic's own picks are
         * cuBLASLt's to get right) */
        if (gemv || cand - GEMM_CHOICE_LT >= n_heur) {
            double rel = 0.0;
            status = gemm_cand_check(ctx, p, algos, cand, d_w, sc, stream,
                                     &rel);
            if (status != BT_OK) {
                if (gemv)
                    return status;
                bt_error_clear();
                continue; /* a split variant that does not run */
            }
            if (!(rel <= 2e-2)) {
                BT_LOG_WARN("CUDA", "gemm tune: %s disagrees with cuBLASLt "
                            "at t=%d o=%d i=%d (rel err %.3g): dropped",
                            name, bucket, n_out, n_in, rel);
                continue;
            }
        }
        status = gemm_cand_time(ctx, p, algos, cand, d_w, sc, stream, &us);
        if (status != BT_OK) {
            if (cand < GEMM_CHOICE_LT)
                return status;
            bt_error_clear();
            continue; /* a cuBLASLt algorithm that does not run */
        }
        cands[n_ok] = cand;
        cand_us[n_ok] = us;
        n_ok++;
        if (len < sizeof(line))
            len += (size_t)snprintf(line + len, sizeof(line) - len,
                                    "%s%s %.1f", n_ok > 1 ? ", " : "", name,
                                    us);
        if (best < 0 || us < best_us) {
            best = cand;
            best_us = us;
        }
    }
    if (best < 0)
        return BT_ERR_CUDA;
    if (bucket <= GEMM_TUNE_MAX_TOK) {
        int fin[GEMM_FINAL_MAX], n_fin = 0;
        float fin_us[GEMM_FINAL_MAX];
        status = gemm_tune_final(ctx, p, algos, d_w, sc, stream, cands,
                                 cand_us, n_ok, &best, &best_us, fin, fin_us,
                                 &n_fin);
        if (status != BT_OK)
            return status;
        for (int f = 0; f < n_fin && len < sizeof(line); f++) {
            char name[24];
            gemm_cand_name(algos, fin[f], n_heur, name, sizeof(name));
            len += (size_t)snprintf(line + len, sizeof(line) - len,
                                    "%s%s %.2f", f == 0 ? "; final " : ", ",
                                    name, fin_us[f]);
        }
    }
    if (ctx->n_tuned == GEMM_MAX_TUNED)
        return BT_OK; /* full: the static default from now on */
    t = &ctx->tuned[ctx->n_tuned++];
    memset(t, 0, sizeof(*t));
    t->bucket = bucket;
    t->n_out = n_out;
    t->n_in = n_in;
    t->out_dt = out_dt;
    t->choice = best;
    if (best >= GEMM_CHOICE_LT)
        t->algo = algos[best - GEMM_CHOICE_LT];
    t->us = best_us;
    {
        char bname[24];
        gemm_cand_name(algos, best, n_heur, bname, sizeof(bname));
        char lead[48] = "";
        if (sc->lead != GEMM_LEAD_NONE)
            snprintf(lead, sizeof(lead), ", behind a %s lead of %.1f us",
                     sc->lead == GEMM_LEAD_GRAPH ? "graph" : "stream",
                     sc->lead_us);
        BT_LOG_INFO("CUDA", "gemm tune t=%d o=%d i=%d out=%s: %s %.1f us "
                    "(%.2f TB/s of weights) %s us]%s", bucket, n_out, n_in,
                    out_dt == CUDA_DT_F32 ? "f32" : "bf16", bname, best_us,
                    2.0 * n_out * n_in / (best_us * 1e-6) / 1e12, line,
                    lead);
    }
    return BT_OK;
}

/* Tunes a weight shape: every bucket 1..GEMM_TUNE_MAX_TOK (big == 0), or
 * the one prefill token count `big` (cuBLASLt algorithms only).  Errors
 * turn tuning off for the context (logged once) and leave the defaults. */
static void gemm_tune_family(worker_gemm_ctx_t *ctx, int n_out, int n_in,
                             cuda_dtype_t out_dt, const void *d_w, int big,
                             cudaStream_t stream)
{
    gemm_scratch_t sc;
    size_t es = cuda_dtype_size(out_dt);
    const int rows = big > 0 ? big : GEMM_TUNE_MAX_TOK;
    size_t ny = (size_t)rows * n_out;
    bt_status_t status;
    double t0 = bt_time_s();

    ctx->setups++;
    memset(&sc, 0, sizeof(sc));
    status = cuda__dev_malloc(&sc.d_x, (size_t)rows * n_in * 2,
                              "gemm_tune_x");
    if (status == BT_OK)
        status = gemm__scratch_alloc(&sc, ny * es);
    if (status == BT_OK)
        status = cuda_gemv_fill(sc.d_x, (size_t)rows * n_in,
                                0x5eed1234u ^ (uint32_t)n_out, stream);
    /* the lead's input and output: zeros */
    sc.lead_mode = big > 0 || gemm_lead_bytes(n_in) > GEMM_FLUSH_BYTES
                       ? GEMM_LEAD_NONE
                       : GEMM_LEAD_GRAPH;
    if (status == BT_OK && sc.lead_mode != GEMM_LEAD_NONE)
        status = BT_CUDA_STATUS(cudaMemsetAsync(
            sc.d_flush, 0, gemm_lead_bytes(n_in), stream));
    if (big > 0 && status == BT_OK)
        status = gemm_tune_bucket(ctx, big, n_out, n_in, out_dt, d_w, &sc,
                                  stream);
    for (int b = 1; big == 0 && b <= GEMM_TUNE_MAX_TOK && status == BT_OK;
         b <<= 1)
        status = gemm_tune_bucket(ctx, b, n_out, n_in, out_dt, d_w, &sc,
                                  stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
    if (status != BT_OK) {
        BT_LOG_WARN("CUDA", "gemm tune o=%d i=%d failed: autotuning off, "
                    "static defaults from now on", n_out, n_in);
        ctx->tune = false;
        (void)cudaStreamSynchronize(stream);
        (void)cudaGetLastError();
    } else {
        BT_LOG_INFO("CUDA", "gemm tune o=%d i=%d%s: %.0f ms", n_out, n_in,
                    big > 0 ? " (prefill)" : "", (bt_time_s() - t0) * 1e3);
        if (ctx->cache_path != NULL)
            gemm__cache_save(ctx);
    }
    gemm__scratch_free(&sc);
}

static gemm_plan_t *gemm_plan_find_or_null(worker_gemm_ctx_t *ctx, int n_tok,
                                           int n_out, int n_in,
                                           cuda_dtype_t in_dt,
                                           cuda_dtype_t out_dt)
{
    gemm_plan_t *p = NULL;

    if (gemm__plan_find(ctx, n_tok, n_out, n_in, in_dt, out_dt, false, &p) !=
        BT_OK)
        return NULL;
    return p;
}

// ---------------------------------------------------------------------
// The tuner's file (BT_GEMM_CACHE, gemm_cache.h)

/* FNV-1a, folded over a string including its NUL. */
static uint32_t gemm_fnv(uint32_t h, const char *s)
{
    do {
        h = (h ^ (uint8_t)*s) * 16777619u;
    } while (*s++ != '\0');
    return h;
}

/* The file's key: the device (name, compute capability, SMs, L2), the
 * cuBLASLt and runtime versions, the GEMV variants and tuner constants
 * of this build, and the variables that change what the tuner times. */
static bool gemm_cache_key(char *key, size_t size, bool fast_accum)
{
    struct cudaDeviceProp prop;
    char num[64];
    uint32_t build = 2166136261u, env = 2166136261u;
    int dev = 0, rt = 0, n;

    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
        cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    /* the name as one token of the key (sanitized in place) */
    for (char *ch = prop.name; *ch; ch++)
        if (!isalnum((unsigned char)*ch) && *ch != '.' && *ch != '-')
            *ch = '_';
    for (int k = 0; k < CUDA_GEMV_N_KERNELS; k++)
        build = gemm_fnv(build,
                         cuda_gemv_kernel_name((cuda_gemv_kernel_t)k));
    snprintf(num, sizeof(num), "%d/%d/%d/%d/%d/%d/%d/%d/%d/%g/fp8v%d/p%d",
             GEMM_TUNE_MAX_TOK, GEMM_LT_CANDS, GEMM_LT_CANDS_BIG,
             GEMM_LT_SPLIT_BASES, GEMM_BIG_STEP, GEMM_TUNE_REPS,
             GEMM_LEAD_DEFAULT, GEMM_FINAL_MAX, GEMM_FINAL_REPS,
             (double)GEMM_FINAL_MARGIN, GEMM_FP8_CANDS,
             GEMM_FP8_DECODE_TOK_MAX);
    build = gemm_fnv(build, num);
    env = gemm_fnv(gemm_fnv(env, "BT_GEMV_DISABLE"),
                   cuda_switches()->gemv_disable
                       ? cuda_switches()->gemv_disable
                       : "");
    /* FP8 picks timed in exact accumulation are not the default's */
    if (!fast_accum)
        env = gemm_fnv(env, "BT_FP8_FAST_ACCUM=0");
    n = snprintf(key, size, "%s/sm%d%d/%dsm/%dMB-L2/cublasLt-%zu/cudart-%d/"
                 "build-%08x/env-%08x", prop.name, prop.major, prop.minor,
                 prop.multiProcessorCount, prop.l2CacheSize >> 20,
                 cublasLtGetVersion(), rt, build, env);
    return n > 0 && (size_t)n < size;
}

/* Reads the file's entries for ctx->cache_key into out (at most
 * GEMM_MAX_TUNED); a missing file holds none, a malformed one is logged
 * and holds none. */
static int gemm_cache_read(const worker_gemm_ctx_t *ctx,
                           gemm_cache_entry_t *out)
{
    char *text = NULL;
    size_t len = 0;
    int n = 0;

    if (access(ctx->cache_path, F_OK) != 0)
        return 0; /* not written yet: no error to log */
    if (bt_read_file(ctx->cache_path, GEMM_CACHE_MAX_BYTES, &text, &len) !=
        BT_OK) {
        bt_error_clear();
        return 0;
    }
    if (gemm_cache_parse(text, len, ctx->cache_key, out, GEMM_MAX_TUNED,
                         &n) != BT_OK) {
        BT_LOG_WARN("CUDA", "gemm cache %s ignored: %s", ctx->cache_path,
                    bt_error_last());
        bt_error_clear();
        n = 0;
    }
    bt_free(text);
    return n;
}

/* The default tuning cache when BT_GEMM_CACHE is not set (issue 36):
 * $XDG_CACHE_HOME/baton/gemm-HOST.txt, else ~/.cache/baton/gemm-HOST.txt
 * (the host name in it: a home directory shared between hosts keeps one
 * file per host; the key inside still names the GPU and libraries).
 * Makes the directories; false (no cache) when there is no home or they
 * cannot be made. */
static bool gemm_cache_default_path(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char host[128] = "host";
    char dir[4096];
    int n;

    if (xdg != NULL && *xdg == '/')
        n = snprintf(dir, sizeof(dir), "%s/baton", xdg);
    else if (home != NULL && *home == '/')
        n = snprintf(dir, sizeof(dir), "%s/.cache", home);
    else
        return false;
    if (n <= 0 || (size_t)n >= sizeof(dir))
        return false;
    if (xdg == NULL || *xdg != '/') {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return false;
        if (strlen(dir) + sizeof("/baton") > sizeof(dir))
            return false;
        strcat(dir, "/baton");
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return false;
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
        strcpy(host, "host");
    host[sizeof(host) - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    n = snprintf(buf, size, "%s/gemm-%s.txt", dir, host);
    return n > 0 && (size_t)n < size;
}

/* BT_GEMM_CACHE (unset: the per-host default file; "off" or empty: no
 * file): the path, the key and the entries this key has there. */
static void gemm_cache_open(worker_gemm_ctx_t *ctx)
{
    const char *path = cuda_switches()->gemm_cache;
    char def[4096 + 160];

    if (path == NULL) {
        if (!gemm_cache_default_path(def, sizeof(def))) {
            BT_LOG_INFO("CUDA", "no default gemm cache (no writable "
                        "~/.cache/baton); BT_GEMM_CACHE=PATH sets one");
            return;
        }
        path = def;
    }
    if (*path == '\0' || strcmp(path, "off") == 0)
        return;
    if (!gemm_cache_key(ctx->cache_key, sizeof(ctx->cache_key),
                        ctx->fp8_fast_accum)) {
        BT_LOG_WARN("CUDA", "gemm cache %s: no device key, not used", path);
        return;
    }
    ctx->cache_path = bt_strdup(path, "gemm_cache_path");
    ctx->cached = bt_calloc(GEMM_MAX_TUNED, sizeof(*ctx->cached),
                            "gemm_cached");
    if (ctx->cache_path == NULL || ctx->cached == NULL) {
        bt_free(ctx->cache_path);
        bt_free(ctx->cached);
        ctx->cache_path = NULL;
        ctx->cached = NULL;
        return;
    }
    ctx->n_cached = gemm_cache_read(ctx, ctx->cached);
    BT_LOG_INFO("CUDA", "gemm cache %s: %d picks for %s", path,
                ctx->n_cached, ctx->cache_key);
}

const gemm_cache_entry_t *gemm__cache_find(
    const gemm_cache_entry_t *e, int n, int bucket, int n_out, int n_in,
    cuda_dtype_t out_dt, int kind, bool accumulate)
{
    for (int i = 0; i < n; i++)
        if (e[i].bucket == bucket && e[i].n_out == n_out &&
            e[i].n_in == n_in && e[i].out_f32 == (out_dt == CUDA_DT_F32) &&
            e[i].kind == kind && e[i].accumulate == (int)accumulate)
            return &e[i];
    return NULL;
}

/* Installs the file's picks for a weight shape: every bucket 1 ..
 * GEMM_TUNE_MAX_TOK (big == 0) or the prefill bucket big.  False (and
 * nothing installed) unless every pick is there and still valid: a GEMV
 * variant this build has, supporting the shape and not disabled; a
 * cuBLASLt algorithm that cublasLtMatmulAlgoCheck accepts for the shape
 * within the workspace. */
static bool gemm_cache_install(worker_gemm_ctx_t *ctx, int n_out, int n_in,
                               cuda_dtype_t out_dt, int big)
{
    gemm_tuned_t add[GEMM_TUNE_BUCKETS];
    const int first = big > 0 ? big : 1;
    const int last = big > 0 ? big : GEMM_TUNE_MAX_TOK;
    int n_add = 0;

    if (ctx->n_cached == 0)
        return false;
    for (int b = first; b <= last; b *= 2) {
        const gemm_cache_entry_t *e =
            gemm__cache_find(ctx->cached, ctx->n_cached, b, n_out, n_in,
                             out_dt, GEMM_CACHE_KIND_DENSE, false);
        gemm_tuned_t *t = &add[n_add];

        if (e == NULL)
            return false;
        memset(t, 0, sizeof(*t));
        t->bucket = b;
        t->n_out = n_out;
        t->n_in = n_in;
        t->out_dt = out_dt;
        t->us = e->us;
        if (e->lt) {
            cublasLtMatmulHeuristicResult_t chk;
            gemm_plan_t *p = gemm_plan_find_or_null(ctx, b, n_out, n_in,
                                                    CUDA_DT_BF16, out_dt);

            _Static_assert(sizeof(t->algo) == sizeof(e->algo),
                           "cublasLtMatmulAlgo_t is 8 words");
            if (p == NULL) {
                bt_error_clear();
                return false;
            }
            memcpy(&t->algo, e->algo, sizeof(t->algo));
            memset(&chk, 0, sizeof(chk));
            if (cublasLtMatmulAlgoCheck(ctx->handle, p->op, p->a, p->b, p->d,
                                        p->d, &t->algo, &chk) !=
                    CUBLAS_STATUS_SUCCESS ||
                chk.workspaceSize > ctx->ws_bytes)
                return false;
            t->choice = GEMM_CHOICE_LT + atoi(e->choice + 2);
        } else {
            const int k = cuda_gemv_kernel_by_name(e->choice);
            if (k < 0 ||
                !cuda_gemv_kernel_ok((cuda_gemv_kernel_t)k, b, n_out, n_in,
                                     CUDA_DT_BF16) ||
                gemm_gemv_disabled(k))
                return false;
            t->choice = k;
        }
        n_add++;
    }
    if (ctx->n_tuned + n_add > GEMM_MAX_TUNED)
        return false;
    memcpy(&ctx->tuned[ctx->n_tuned], add, (size_t)n_add * sizeof(add[0]));
    ctx->n_tuned += n_add;
    ctx->setups++;
    ctx->cache_hits++;
    BT_LOG_INFO("CUDA", "gemm tune o=%d i=%d%s: %d picks from %s", n_out,
                n_in, big > 0 ? " (prefill)" : "", n_add, ctx->cache_path);
    return true;
}

/* Merges this context's picks into the file: its own entries, then
 * those the file holds now (another process's) for other shapes. */
void gemm__cache_save(worker_gemm_ctx_t *ctx)
{
    gemm_cache_entry_t *all, *disk;
    char *text = NULL;
    size_t len = 0;
    int n = 0, n_disk;

    all = bt_calloc(2 * GEMM_MAX_TUNED, sizeof(*all), "gemm__cache_save");
    if (all == NULL) {
        bt_error_clear();
        return;
    }
    for (int i = 0; i < ctx->n_tuned; i++) {
        const gemm_tuned_t *t = &ctx->tuned[i];
        gemm_cache_entry_t *e = &all[n++];

        e->bucket = t->bucket;
        e->n_out = t->n_out;
        e->n_in = t->n_in;
        e->out_f32 = t->out_dt == CUDA_DT_F32;
        e->kind = t->kind;
        e->accumulate = t->accumulate;
        e->us = t->us;
        if (t->fp8_path == GEMM_FP8_SKINNY) {
            snprintf(e->choice, sizeof(e->choice), "skinny");
        } else if (t->choice >= GEMM_CHOICE_LT) {
            e->lt = 1;
            snprintf(e->choice, sizeof(e->choice), "%ct%d",
                     t->fp8_path == GEMM_FP8_PLAIN ? 'p' : 'l',
                     t->choice - GEMM_CHOICE_LT);
            memcpy(e->algo, &t->algo, sizeof(e->algo));
        } else {
            snprintf(e->choice, sizeof(e->choice), "%s",
                     cuda_gemv_kernel_name((cuda_gemv_kernel_t)t->choice));
        }
    }
    /* the file's entries land after ours and are kept in place where no
     * entry of ours has their shape (the write index never passes the
     * read index) */
    disk = all + n;
    n_disk = gemm_cache_read(ctx, disk);
    for (int i = 0; i < n_disk; i++)
        if (gemm__cache_find(all, n, disk[i].bucket, disk[i].n_out,
                             disk[i].n_in,
                             disk[i].out_f32 ? CUDA_DT_F32 : CUDA_DT_BF16,
                             disk[i].kind, disk[i].accumulate) == NULL)
            all[n++] = disk[i];
    if (gemm_cache_format(ctx->cache_key, all, BT_MIN(n, GEMM_MAX_TUNED),
                          &text, &len) != BT_OK ||
        bt_write_file(ctx->cache_path, text, len) != BT_OK) {
        BT_LOG_WARN("CUDA", "gemm cache %s not saved: %s", ctx->cache_path,
                    bt_error_last());
        bt_error_clear();
    }
    bt_free(text);
    bt_free(all);
}

/* The forced variant (BT_GEMV_FORCE): a cuda_gemv_kernel_t, GEMM_CHOICE_LT
 * for "lt", or -1 when unset or unknown. */
static int gemm_forced(void)
{
    const char *env = cuda_switches()->gemv_force;

    if (env == NULL || *env == '\0')
        return -1;
    if (strcmp(env, "lt") == 0)
        return GEMM_CHOICE_LT;
    return cuda_gemv_kernel_by_name(env);
}

bool gemm__capturing(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;

    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* unknown: do not tune */
    }
    return cs != cudaStreamCaptureStatusNone;
}

const char *worker_gemm_choice(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                               int n_in, cuda_dtype_t out_dt, float *us_p)
{
    static char name[16];
    gemm_tuned_t *t;

    if (n_tok < 1)
        return NULL;
    t = gemm_tuned_find(ctx, n_tok <= GEMM_TUNE_MAX_TOK ? gemm_bucket(n_tok)
                                                        : n_tok,
                        n_out, n_in, out_dt);
    if (t == NULL)
        return NULL;
    if (us_p)
        *us_p = t->us;
    if (t->choice >= GEMM_CHOICE_LT) {
        snprintf(name, sizeof(name), "lt%d", t->choice - GEMM_CHOICE_LT);
        return name;
    }
    return cuda_gemv_kernel_name((cuda_gemv_kernel_t)t->choice);
}

bt_status_t worker_gemm(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                        int n_in, const void *d_x, const void *d_w,
                        cuda_dtype_t in_dt, void *d_y, cuda_dtype_t out_dt,
                        bool accumulate, cudaStream_t stream)
{
    gemm_plan_t *p;
    bt_status_t status;

    BT_ASSERT(n_tok >= 0 && n_out > 0 && n_in > 0);
    if (n_tok == 0)
        return BT_OK;
    if (ctx->use_gemv && in_dt == CUDA_DT_BF16) {
        int forced = gemm_forced();
        gemm_tuned_t *t = NULL;

        if (forced >= 0 && forced < GEMM_CHOICE_LT &&
            cuda_gemv_kernel_ok((cuda_gemv_kernel_t)forced, n_tok, n_out,
                                n_in, in_dt))
            return cuda_gemv_run((cuda_gemv_kernel_t)forced, n_tok, n_out,
                                 n_in, d_x, d_w, d_y, out_dt, accumulate,
                                 &ctx->gemv_ws, stream);
        if (forced < 0) {
            if (ctx->tune && n_tok <= GEMM_TUNE_MAX_TOK)
                t = gemm_tuned_find(ctx, gemm_bucket(n_tok), n_out, n_in,
                                    out_dt);
            if (ctx->tune && t == NULL &&
                ctx->n_tuned + GEMM_TUNE_BUCKETS <= GEMM_MAX_TUNED &&
                gemm_tuned_find(ctx, 1, n_out, n_in, out_dt) == NULL &&
                !gemm__capturing(stream)) {
                if (!gemm_cache_install(ctx, n_out, n_in, out_dt, 0))
                    gemm_tune_family(ctx, n_out, n_in, out_dt, d_w, 0,
                                     stream);
                if (n_tok <= GEMM_TUNE_MAX_TOK)
                    t = gemm_tuned_find(ctx, gemm_bucket(n_tok), n_out, n_in,
                                        out_dt);
            }
            if (t != NULL && t->choice < GEMM_CHOICE_LT &&
                cuda_gemv_kernel_ok((cuda_gemv_kernel_t)t->choice, n_tok,
                                    n_out, n_in, in_dt))
                return cuda_gemv_run((cuda_gemv_kernel_t)t->choice, n_tok,
                                     n_out, n_in, d_x, d_w, d_y, out_dt,
                                     accumulate, &ctx->gemv_ws, stream);
            if (t == NULL && cuda_gemv_ok(n_tok, n_in, in_dt))
                return cuda_gemv(n_tok, n_out, n_in, d_x, d_w, d_y, out_dt,
                                 accumulate, stream); /* static default */
            /* Prefill shapes: cuBLASLt's top algorithms, exact n_tok. */
            if (ctx->tune && n_tok > GEMM_TUNE_MAX_TOK &&
                n_tok % GEMM_BIG_STEP == 0 && n_tok <= GEMM_BIG_MAX) {
                t = gemm_tuned_find(ctx, n_tok, n_out, n_in, out_dt);
                if (t == NULL && ctx->n_tuned < GEMM_MAX_TUNED &&
                    !gemm__capturing(stream)) {
                    if (!gemm_cache_install(ctx, n_out, n_in, out_dt, n_tok))
                        gemm_tune_family(ctx, n_out, n_in, out_dt, d_w, n_tok,
                                         stream);
                    t = gemm_tuned_find(ctx, n_tok, n_out, n_in, out_dt);
                }
            }
        }
        if (t != NULL && t->choice >= GEMM_CHOICE_LT && n_tok == t->bucket) {
            status = gemm__plan_find(ctx, n_tok, n_out, n_in, in_dt, out_dt,
                                     accumulate, &p);
            if (status != BT_OK)
                return status;
            return gemm_lt_run(ctx, p, &t->algo, d_x, d_w, d_y, accumulate,
                               stream);
        }
    }
    status = gemm__plan_find(ctx, n_tok, n_out, n_in, in_dt, out_dt,
                             accumulate, &p);
    if (status != BT_OK)
        return status;
    return gemm_lt_run(ctx, p, &p->algo, d_x, d_w, d_y, accumulate, stream);
}
