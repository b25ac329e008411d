/*
 * fp8.h - the FP8 (OCP E4M3, common/bt_fp8.h) kernels of the cuda
 * backend's precision fp8: quantizing weights and GEMM inputs
 * (quant_fp8.cu), the scaled epilogue of the cuBLASLt FP8 GEMM
 * (quant_fp8.cu), the FP8 GEMV of decode steps of 1-8 tokens
 * (gemv_fp8.cu; a 1-token form makes its own input) and the skinny
 * FP8 GEMM of 1-64 (gemm_fp8_skinny.cu; gemm_fp8.c routes 2-32 tokens
 * to it where wgmma runs, the GEMV being the fallback).
 *
 * The GEMM they compute is the cpu reference's (worker/cpu/cpu_fp8.c,
 * cpu__fp8_gemm_ref): y[t, n] = (sum_j xq[t, j] * wq[n, j]) * xs[t] * ws[n],
 * xq and wq E4M3 values, the sum in float32, xs the input scale (static
 * per tensor, or absmax / 448 of the row), ws the weight scale of output
 * row n.  Quantization rounds exactly as the cpu does (bt_f32_to_e4m3 of
 * x * (1 / s)), so the codes are the same bytes.  The GEMV's sums are
 * f32 (exact products, f32 adds); the tensor cores' FP8 MMAs (the skinny
 * GEMM's wgmma, cuBLASLt) add in less precision (~1e-4 relative, below
 * the bf16 rounding of y: PERFORMANCE.md "FP8 on the GPU").
 *
 * E4M3 matrices are stored row-major with rows padded with zero codes to
 * cuda_fp8_ld(k) bytes (a multiple of 16): every row starts 16-byte
 * aligned for the GEMV's vector loads, and cuBLASLt's FP8 kernels want
 * 16-byte aligned leading dimensions.  The zeros add nothing to a sum.
 */
#ifndef BT_WORKER_CUDA_KERNELS_FP8_H
#define BT_WORKER_CUDA_KERNELS_FP8_H

#include <stdbool.h>
#include <stdint.h>

#include "../cuda_int.h"
#include "gemv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens the FP8 GEMV takes in one launch (decode steps of 1-8). */
#define CUDA_GEMV_FP8_MAX_TOK 8

/* Tokens the skinny FP8 GEMM takes in one launch (decode steps of 9-64;
 * it takes 1-8 as well). */
#define CUDA_GEMM_FP8_SKINNY_MAX_TOK 64

/* Row stride in bytes (= codes) of an E4M3 matrix of k columns. */
static inline int cuda_fp8_ld(int k)
{
    return (k + 15) & ~15;
}

/* Weights: the f32 rows d_w (rows, k) become E4M3 codes d_q (rows, ld,
 * zero padded) with a scale per row, d_ws[r] = absmax / 448 of the row
 * (bt_fp8_scale), the cpu's quantization of a bf16/f32 checkpoint. */
bt_status_t cuda_fp8_quant_weight(const float *d_w, int rows, int k, int ld,
                                  uint8_t *d_q, float *d_ws,
                                  cudaStream_t stream);

/* GEMM inputs: the rows of d_x (n_tok, k; bf16 or f32 as dt) quantized
 * with in_scale (> 0: static per tensor) or per token (0: absmax / 448
 * of the row), the scale of each row into d_xs (n_tok).  Writes the
 * codes into d_q (n_tok, ld) when not NULL (the cuBLASLt path) and their
 * values as bf16 (exact: every E4M3 value is a bf16) into d_xv (n_tok,
 * ld) when not NULL (the GEMV path); the padding columns are zeros. */
bt_status_t cuda_fp8_quant_act(const void *d_x, cuda_dtype_t dt, int n_tok,
                               int k, int ld, float in_scale, uint8_t *d_q,
                               void *d_xv, float *d_xs, cudaStream_t stream);

/* cuda_fp8_quant_act of the bf16 rows an RMSNorm gives: bf16(g * (x *
 * 1 / sqrtf(mean(x^2) + eps))) of the f32 residual rows d_x (n_tok, k)
 * with the bf16 weights d_g, rmsnorm.cu's arithmetic (no add) -- the
 * norm and the quantization in one kernel. */
bt_status_t cuda_fp8_norm_quant(const float *d_x, const void *d_g, float eps,
                                int n_tok, int k, int ld, float in_scale,
                                uint8_t *d_q, void *d_xv, float *d_xs,
                                cudaStream_t stream);

/* cuda_fp8_quant_act of the rows a SwiGLU gives: bf16(silu(g) * u) of the
 * bf16 gate|up rows d_gu (n_tok, 2 k), bit for bit cuda_swiglu's values
 * -- the SwiGLU and the quantization in one kernel. */
bt_status_t cuda_fp8_glu_quant(const void *d_gu, int n_tok, int k, int ld,
                               float in_scale, uint8_t *d_q, void *d_xv,
                               float *d_xs, cudaStream_t stream);

/* The conversions of the kernels above (kernels/fp8_cvt.cuh: Hopper's
 * cvt instructions, bit for bit bt_f32_to_e4m3 / bt_e4m3_to_f32) on n raw
 * floats d_x, for tests: d_q[i] the code of d_x[i] four at a time (the
 * quantization's helper; a last partial group one at a time), d_q1[i]
 * (when not NULL) through the one-value helper (the KV cache's), d_xv[i]
 * (when not NULL) d_q[i]'s value as bf16 bits through the codes -> bf16
 * helper.  Any n >= 0. */
bt_status_t cuda_fp8_cvt_check(const float *d_x, int n, uint8_t *d_q,
                               uint8_t *d_q1, uint16_t *d_xv,
                               cudaStream_t stream);

/* The epilogue of the cuBLASLt FP8 GEMM where cuBLASLt cannot apply the
 * scale vectors itself (gemm.c's fallback): y[t, n] (=, or += when
 * accumulate) acc[t, n] * xs[t] * ws[n] for t < n_tok, n < n_out; acc
 * f32 with ld_acc floats a row, y (n_tok, n_out) in out_dt. */
bt_status_t cuda_fp8_scale_out(const float *d_acc, int ld_acc,
                               const float *d_xs, const float *d_ws,
                               int n_tok, int n_out, void *d_y,
                               cuda_dtype_t out_dt, bool accumulate,
                               cudaStream_t stream);

/* True when cuda_gemv_fp8 takes the shape: 1 <= n_tok <=
 * CUDA_GEMV_FP8_MAX_TOK, ld a positive multiple of 16. */
bool cuda_gemv_fp8_ok(int n_tok, int ld);

/* The FP8 GEMV: y (n_tok, n_out) [+]= (xq . wq^T) * xs[t] * ws[n], with
 * d_xq (n_tok, ld) the input codes (cuda_fp8_quant_act) and, for one
 * token, d_xv (1, ld) their bf16 values or NULL; d_wq (n_out, ld) E4M3
 * codes, f32 sums, y in out_dt.  One token with values: a warp per row
 * on the f32 FMAs; else tensor-core MMAs over 16-row blocks (gemv_fp8.cu
 * says why). */
bt_status_t cuda_gemv_fp8(int n_tok, int n_out, int ld, const uint8_t *d_xq,
                          const void *d_xv, const float *d_xs,
                          const uint8_t *d_wq, const float *d_ws, void *d_y,
                          cuda_dtype_t out_dt, bool accumulate,
                          cudaStream_t stream);

/* What feeds an fp8 linear: the bf16 row itself (cuda_fp8_quant_act),
 * the RMSNorm of the f32 residual row with bf16 weights
 * (cuda_fp8_norm_quant) or the SwiGLU of the bf16 gate|up row
 * (cuda_fp8_glu_quant). */
typedef enum {
    CUDA_FP8_IN_ROWS = 0,
    CUDA_FP8_IN_NORM,
    CUDA_FP8_IN_GLU
} cuda_fp8_in_t;

/* True when cuda_gemv_fp8_fused takes the input: n_in a multiple of 8,
 * ld = cuda_fp8_ld(n_in), n_in <= 32768 (the row in shared memory),
 * d_in (and d_g for the norm) 16-byte aligned. */
bool cuda_gemv_fp8_fused_ok(cuda_fp8_in_t in, const void *d_in,
                            const void *d_g, int n_in, int ld);

/* The 1-token FP8 GEMV with its input made inside: y (1, n_out) [+]=
 * (xq . wq^T) * xs * ws[n] where xq, xs are what the producer of `in`
 * (cuda_fp8_norm_quant with d_g, eps / cuda_fp8_glu_quant /
 * cuda_fp8_quant_act of bf16, on the row d_in of n_in columns, in_scale)
 * would give cuda_gemv_fp8's 1-token kernel: one kernel instead of two,
 * the same outputs bit for bit where the producer takes its vector
 * kernel (n_in <= 16384; gemv_fp8.cu).  Writes no codes nor scale.
 * The first launch of each kind raises its shared-memory limit
 * (cuda_gemv_fp8_fused_prepare does it ahead, outside any capture). */
bt_status_t cuda_gemv_fp8_fused(cuda_fp8_in_t in, const void *d_in,
                                const void *d_g, float eps, int n_in, int ld,
                                float in_scale, const uint8_t *d_wq,
                                const float *d_ws, int n_out, void *d_y,
                                cuda_dtype_t out_dt, bool accumulate,
                                cudaStream_t stream);

/* Raises the fused GEMV's shared-memory limits (host code, outside any
 * capture; once per device, before the first launch). */
bt_status_t cuda_gemv_fp8_fused_prepare(void);

/* True when cuda_gemm_fp8_skinny takes the shape: 1 <= n_tok <=
 * CUDA_GEMM_FP8_SKINNY_MAX_TOK, n_out >= 1, ld a positive multiple of
 * 16. */
bool cuda_gemm_fp8_skinny_ok(int n_tok, int n_out, int ld);

/* The skinny FP8 GEMM: y (n_tok, n_out) [+]= (xq . wq^T) * xs[t] *
 * ws[n], cuda_gemv_fp8's contract with d_xq (n_tok, ld) the input codes
 * (only n_tok rows read), on the tensor cores' E4M3 MMAs: 128 weight
 * rows a block, read once; split K through ws (the tc GEMV's scratch,
 * kernels/gemv.h; NULL: no split) when the rows cannot fill the GPU
 * (gemm_fp8_skinny.cu says how).  wgmma: the products on wgmma where
 * cuda_wgmma_available() (sm_90a), else (and false: tests) on
 * mma.m16n8k32.  Capturable: no allocation, no sync. */
bt_status_t cuda_gemm_fp8_skinny(int n_tok, int n_out, int ld,
                                 const uint8_t *d_xq, const float *d_xs,
                                 const uint8_t *d_wq, const float *d_ws,
                                 void *d_y, cuda_dtype_t out_dt,
                                 bool accumulate, bool wgmma,
                                 const cuda_gemv_ws_t *ws,
                                 cudaStream_t stream);

/* Raises the skinny FP8 GEMM's shared-memory limits (host code, outside
 * any capture; once per device, before the first launch). */
bt_status_t cuda_gemm_fp8_skinny_prepare(void);

/* True when cuda_gemm_fp8_skinny(..., wgmma = true, ...) runs on wgmma's
 * native E4M3 MMAs here (an sm_90a build on a compute-capability-9
 * device); false: its mma.m16n8k32 fallback, slower than the FP8 GEMV at
 * 1-8 tokens. */
bool cuda_gemm_fp8_skinny_native(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_FP8_H */
