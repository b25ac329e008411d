/*
 * gemm.h - the one cuBLASLt wrapper of the CUDA backend.
 *
 * y (n_tok, n_out) = x (n_tok, n_in) . w (n_out, n_in)^T  [+ y if
 * accumulate], row-major, the layout of every projection in the model.
 * x and w share a dtype (bf16 or f32); y may be that dtype or f32 (the
 * residual stream and the logits are f32).  Accumulation is f32; the f32
 * path uses plain FP32 compute (no TF32) so the exactness mode is exact.
 *
 * The context owns the cuBLASLt handle, the workspace and a cache of the
 * heuristic's algorithm per shape, so a shape is planned once and the
 * call is safe inside CUDA graph capture.  Skinny bf16 shapes (<= 128
 * tokens) are autotuned between the GEMV variants of kernels/gemv.h and
 * cuBLASLt the first time their weight shape is used outside capture
 * (gemm.c says how; BT_GEMM_TUNE=0 off, BT_GEMV_FORCE=NAME forces a
 * variant; BT_GEMM_CACHE=PATH keeps the picks across processes, see
 * gemm_cache.h).  Not thread-safe.
 */
#ifndef BT_WORKER_CUDA_GEMM_H
#define BT_WORKER_CUDA_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct worker_gemm_ctx_s worker_gemm_ctx_t;

/* Creates the handle and a device workspace of ws_bytes (32 MiB is
 * plenty on Hopper). */
bt_status_t worker_gemm_ctx_create(size_t ws_bytes,
                                   worker_gemm_ctx_t **ctx_p);
void worker_gemm_ctx_destroy(worker_gemm_ctx_t **ctx_p);

/* Enqueues the product on `stream`.  BT_ERR_CUDA when cuBLASLt has no
 * algorithm for the shape (logged once per shape). */
bt_status_t worker_gemm(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                        int n_in, const void *d_x, const void *d_w,
                        cuda_dtype_t in_dt, void *d_y, cuda_dtype_t out_dt,
                        bool accumulate, cudaStream_t stream);

/* The autotuned choice for n_tok tokens of a bf16 weight shape ("rows",
 * "mma1", "lt0" = cuBLASLt's heuristic algorithm 0, ...) and its median
 * time in us (*us_p, may be NULL), or NULL when not tuned (n_tok > 128:
 * the prefill shape n_tok exactly).  The name is a
 * static buffer, valid until the next call. */
const char *worker_gemm_choice(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                               int n_in, cuda_dtype_t out_dt, float *us_p);

/* Plans built and weight shapes tuned so far: a call that changes it
 * did host work (and GPU timing runs) besides its product. */
uint64_t worker_gemm_setups(const worker_gemm_ctx_t *ctx);

/* Weight shapes whose tuned picks came from the BT_GEMM_CACHE file
 * instead of timing runs (gemm.c; 0 without the variable). */
int worker_gemm_cache_hits(const worker_gemm_ctx_t *ctx);

/* True when worker_gemm sends skinny shapes to the GEMV kernels (not
 * disabled with BT_GEMV=0); the backend then also fuses RMSNorm into them
 * (cuda_gemv_norm). */
bool worker_gemm_gemv_enabled(const worker_gemm_ctx_t *ctx);

/* ---- FP8 (precision fp8; kernels/fp8.h says the layout) ----
 * y (n_tok, n_out) [+]= (xq . wq^T) * xs[t] * ws[n]: E4M3 inputs and
 * weights with rows of ld bytes (cuda_fp8_ld of n_in), f32 sums, y in
 * out_dt.  One token takes the FP8 GEMV, which reads the bf16 values
 * (d_xv) of its input when they are given, else the codes (d_xq); 2 up
 * to GEMM_FP8_SKINNY_ROUTE_MAX the skinny FP8 GEMM (kernels/fp8.h; the
 * GEMV up to CUDA_GEMV_FP8_MAX_TOK where wgmma does not run), which
 * reads the codes of the n_tok rows and splits K through the context's
 * own scratch; more take cuBLASLt's FP8 GEMM, which reads the codes
 * (d_xq: n_tok rounded up to 16 rows must be there, the extra ones may
 * be read and their products dropped).  Where cuBLASLt applies xs
 * and ws as scale vectors itself (probed once per context at the first
 * uncaptured call, logged once) the GEMM writes y directly, its
 * algorithm tuned per prefill shape (gemm_fp8.c); else it writes f32 sums
 * into the scratch d_acc (acc_floats: at least 16 x cuda_fp8_ld(n_out),
 * more makes fewer calls; else the GEMV takes every shape) and a scaling
 * epilogue writes y.  Safe inside graph capture once the shape was seen
 * (plans are built at first use, host work only). */
typedef struct {
    const uint8_t *d_xq;   /* (n_tok, ld) input codes (NULL: a 1-token
                              GEMV input given as d_xv) */
    const void *d_xv;      /* (1, ld) their bf16 values, or NULL */
    const float *d_xs;     /* (n_tok) input scales */
    const uint8_t *d_wq;   /* (n_out, ld) weight codes */
    const float *d_ws;     /* (n_out) weight scales */
    float *d_acc;          /* f32 sums scratch */
    size_t acc_floats;
    bool gemv;             /* worker_gemm_fp8_gemv's answer for the
                              shape: the caller asked it to know which
                              input form to make, so the GEMM takes it
                              rather than asking again */
} worker_gemm_fp8_t;

/* True when the FP8 GEMV or the skinny FP8 GEMM must take this shape
 * (false: cuBLASLt); the caller passes the answer to
 * worker_gemm_fp8 in worker_gemm_fp8_t.gemv.  Plans the cuBLASLt shape on
 * first use. */
bool worker_gemm_fp8_gemv(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                          int ld, size_t acc_floats);
bt_status_t worker_gemm_fp8(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                            int ld, const worker_gemm_fp8_t *a, void *d_y,
                            cuda_dtype_t out_dt, bool accumulate,
                            cudaStream_t stream);

/* True when worker_gemm_fp8 with these arguments takes cuBLASLt with the
 * scale vectors inside the GEMM (false: the GEMV, or f32 sums and the
 * scaling epilogue).  Plans (and may probe and tune, outside capture)
 * as that call would; for tests and logs. */
bool worker_gemm_fp8_uses_vec(worker_gemm_ctx_t *ctx, int n_tok, int n_out,
                              int ld, const worker_gemm_fp8_t *a,
                              cuda_dtype_t out_dt, bool accumulate,
                              cudaStream_t stream);

/* Tests: on, worker_gemm_fp8 takes the f32 sums + scaling epilogue path
 * even where cuBLASLt applies the scale vectors (the fallback's check). */
void worker_gemm_fp8_force_epilogue(worker_gemm_ctx_t *ctx, bool on);

/* Tests (A/B timing): on, 9..CUDA_GEMM_FP8_SKINNY_MAX_TOK tokens take
 * cuBLASLt's FP8 GEMM, as before the skinny GEMM, wherever cuBLASLt has
 * an algorithm for the shape.  Read by worker_gemm_fp8_gemv: ask it
 * again after a change. */
void worker_gemm_fp8_force_cublaslt(worker_gemm_ctx_t *ctx, bool on);

/* True when worker_gemm_fp8 with n_tok tokens and these arguments takes
 * the skinny FP8 GEMM (for tests and logs). */
bool worker_gemm_fp8_uses_skinny(const worker_gemm_ctx_t *ctx, int n_tok,
                                 const worker_gemm_fp8_t *a);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_GEMM_H */
