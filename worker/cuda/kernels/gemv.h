/*
 * gemv.h - skinny bf16 GEMM for decode steps (a few tokens): reads each
 * weight row once with 16-byte loads, at the memory-bandwidth limit,
 * where cuBLASLt's small-N kernels leave bandwidth unused on the
 * per-layer shapes.  worker_gemm() picks it; not called directly.
 */
#ifndef BT_WORKER_CUDA_KERNELS_GEMV_H
#define BT_WORKER_CUDA_KERNELS_GEMV_H

#include <stdbool.h>

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_GEMV_MAX_TOK 2 /* measured: t = 8 lost to cuBLASLt */

/* True when cuda_gemv handles the shape: bf16 inputs, n_in % 8 == 0,
 * 1 <= n_tok <= CUDA_GEMV_MAX_TOK. */
bool cuda_gemv_ok(int n_tok, int n_in, cuda_dtype_t in_dt);

/* y (n_tok, n_out) [+]= x (n_tok, n_in) . w (n_out, n_in)^T, bf16 inputs,
 * f32 accumulation, y in out_dt. */
bt_status_t cuda_gemv(int n_tok, int n_out, int n_in, const void *d_x,
                      const void *d_w, void *d_y, cuda_dtype_t out_dt,
                      bool accumulate, cudaStream_t stream);

/* True when cuda_gemv_norm handles the shape: 1 <= n_tok <=
 * CUDA_GEMV_MAX_TOK, n_in % 256 == 0, n_tok * n_in bf16 fit in 48 KB, and
 * the streaming kernel is selected (BT_GEMV_KERNEL=stream; off by
 * default, see gemv.cu). */
bool cuda_gemv_norm_ok(int n_tok, int n_in);

/* RMSNorm fused into the GEMV input (decode steps): y (n_tok, n_out) =
 * xn . w^T with xn = bf16(g * (x * 1 / sqrtf(mean(x^2) + eps))) computed
 * per block from the f32 residual rows x (n_tok, n_in) exactly as
 * cuda_rmsnorm() (no add) would; g and w bf16, y in out_dt. */
bt_status_t cuda_gemv_norm(int n_tok, int n_out, int n_in, const float *d_x,
                           const void *d_g, float eps, const void *d_w,
                           void *d_y, cuda_dtype_t out_dt,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_GEMV_H */
