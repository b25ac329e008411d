/*
 * gemm.c - worker_gemm(): row-major y = x w^T through cuBLASLt.
 *
 * cuBLASLt is column-major, so the row-major product y (t, o) = x (t, i)
 * w (o, i)^T is computed as the column-major D (o, t) = op(A) B with
 * A = w seen as (i, o) column-major and transposed, B = x seen as (i, t):
 * m = n_out, n = n_tok, k = n_in.  Descriptors and the heuristic's pick
 * are built the first time a shape is seen and kept (llm.c
 * matmul_cublaslt, minus its globals).
 */
#include "gemm.h"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kernels/gemv.h"

#define GEMM_MAX_PLANS 256

/* One planned shape. */
typedef struct {
    int n_tok;
    int n_out;
    int n_in;
    cuda_dtype_t in_dt;
    cuda_dtype_t out_dt;
    bool accumulate;
    cublasLtMatmulDesc_t op;       /* compute type, transposes */
    cublasLtMatrixLayout_t a;      /* w */
    cublasLtMatrixLayout_t b;      /* x */
    cublasLtMatrixLayout_t d;      /* y */
    cublasLtMatmulAlgo_t algo;     /* the heuristic's first choice */
} gemm_plan_t;

struct worker_gemm_ctx_s {
    cublasLtHandle_t handle;
    void *d_ws;                    /* workspace, ws_bytes */
    size_t ws_bytes;
    gemm_plan_t *plans;            /* (GEMM_MAX_PLANS) */
    int n_plans;
    bool use_gemv;                 /* skinny shapes to cuda_gemv (BT_GEMV) */
};

static bt_status_t gemm_check(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return BT_OK;
    return BT_ERROR(BT_ERR_CUDA, "CUDA", "cuBLASLt %s failed: %s (%d)", what,
                    cublasLtGetStatusString(st), (int)st);
}

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
    status = gemm_check(cublasLtCreate(&ctx->handle), "create");
    if (status != BT_OK)
        goto err_free_plans;
    status = cuda__dev_malloc(&ctx->d_ws, ws_bytes, "gemm_workspace");
    if (status != BT_OK)
        goto err_destroy_handle;
    ctx->ws_bytes = ws_bytes;
    {
        const char *env = getenv("BT_GEMV"); /* 0: cuBLASLt for all */
        ctx->use_gemv = env == NULL || strcmp(env, "0") != 0;
    }
    *ctx_p = ctx;
    return BT_OK;

err_destroy_handle:
    cublasLtDestroy(ctx->handle);
err_free_plans:
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
    cuda__dev_free(&ctx->d_ws);
    cublasLtDestroy(ctx->handle);
    bt_free(ctx->plans);
    bt_free(ctx);
    *ctx_p = NULL;
}

static cudaDataType_t gemm_cuda_type(cuda_dtype_t dt)
{
    return dt == CUDA_DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

/* Builds the descriptors of one shape and asks the heuristic. */
static bt_status_t gemm_plan_build(worker_gemm_ctx_t *ctx, gemm_plan_t *p)
{
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    bt_status_t status;

    status = gemm_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F,
                                                 CUDA_R_32F), "desc");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatrixLayoutCreate(
        &p->a, gemm_cuda_type(p->in_dt), p->n_in, p->n_out, p->n_in),
        "layout A");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatrixLayoutCreate(
        &p->b, gemm_cuda_type(p->in_dt), p->n_in, p->n_tok, p->n_in),
        "layout B");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatrixLayoutCreate(
        &p->d, gemm_cuda_type(p->out_dt), p->n_out, p->n_tok, p->n_out),
        "layout D");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    if (status != BT_OK)
        goto err;
    status = gemm_check(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->ws_bytes,
        sizeof(ctx->ws_bytes)), "pref workspace");
    if (status != BT_OK)
        goto err_pref;
    status = gemm_check(cublasLtMatmulAlgoGetHeuristic(
        ctx->handle, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &n_res),
        "heuristic");
    if (status != BT_OK)
        goto err_pref;
    if (n_res == 0) {
        status = BT_ERROR(BT_ERR_CUDA, "CUDA",
                          "cuBLASLt has no algorithm for %d x %d x %d "
                          "(in %s, out %s)", p->n_tok, p->n_out, p->n_in,
                          p->in_dt == CUDA_DT_F32 ? "f32" : "bf16",
                          p->out_dt == CUDA_DT_F32 ? "f32" : "bf16");
        goto err_pref;
    }
    p->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return BT_OK;

err_pref:
    cublasLtMatmulPreferenceDestroy(pref);
err:
    gemm_plan_cleanup(p);
    return status;
}

static bt_status_t gemm_plan_find(worker_gemm_ctx_t *ctx, int n_tok,
                                  int n_out, int n_in, cuda_dtype_t in_dt,
                                  cuda_dtype_t out_dt, bool accumulate,
                                  gemm_plan_t **plan_p)
{
    gemm_plan_t *p;
    bt_status_t status;

    for (int i = 0; i < ctx->n_plans; i++) {
        p = &ctx->plans[i];
        if (p->n_tok == n_tok && p->n_out == n_out && p->n_in == n_in &&
            p->in_dt == in_dt && p->out_dt == out_dt &&
            p->accumulate == accumulate) {
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
    status = gemm_plan_build(ctx, p);
    if (status != BT_OK)
        return status;
    ctx->n_plans++;
    *plan_p = p;
    return BT_OK;
}

bool worker_gemm_gemv_enabled(const worker_gemm_ctx_t *ctx)
{
    return ctx->use_gemv;
}

bt_status_t worker_gemm(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                        int n_in, const void *d_x, const void *d_w,
                        cuda_dtype_t in_dt, void *d_y, cuda_dtype_t out_dt,
                        bool accumulate, cudaStream_t stream)
{
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    gemm_plan_t *p;
    bt_status_t status;

    BT_ASSERT(n_tok >= 0 && n_out > 0 && n_in > 0);
    if (n_tok == 0)
        return BT_OK;
    /* Decode steps of a few tokens: the bandwidth-bound GEMV kernel. */
    if (ctx->use_gemv && cuda_gemv_ok(n_tok, n_in, in_dt))
        return cuda_gemv(n_tok, n_out, n_in, d_x, d_w, d_y, out_dt,
                         accumulate, stream);
    status = gemm_plan_find(ctx, n_tok, n_out, n_in, in_dt, out_dt,
                            accumulate, &p);
    if (status != BT_OK)
        return status;
    return gemm_check(cublasLtMatmul(ctx->handle, p->op, &alpha, d_w, p->a,
                                     d_x, p->b, &beta, d_y, p->d, d_y, p->d,
                                     &p->algo, ctx->d_ws, ctx->ws_bytes,
                                     stream), "matmul");
}
