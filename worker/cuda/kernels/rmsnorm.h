/*
 * rmsnorm.h - RMSNorm fused with the residual add.
 */
#ifndef BT_WORKER_CUDA_KERNELS_RMSNORM_H
#define BT_WORKER_CUDA_KERNELS_RMSNORM_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For each output row r (src = d_rows ? d_rows[r] : r):
 *   if d_add: x[src] += add[src]            (the residual add, in f32)
 *   out[r] = w * x[src] / sqrt(mean(x[src]^2) + eps)
 * d_x (rows, dim) f32 residual stream, d_add (rows, dim) dt or NULL,
 * d_w (dim) dt, d_out (n_rows, dim) dt.  With d_rows, d_add must be NULL
 * (a gather never writes x). */
bt_status_t cuda_rmsnorm(float *d_x, const void *d_add, const void *d_w,
                         const int *d_rows, int n_rows, int dim, float eps,
                         void *d_out, cuda_dtype_t dt, cudaStream_t stream);

/* The reduction of split-K partials fused with the residual add and the
 * RMSNorm that follows it (worker_gemm_kslices' consumer):
 *   x[r] += part[0][r] + ... + part[n_part - 1][r]   (in that order)
 *   out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps)     (when d_out)
 * d_x (n_rows, dim) f32; d_part n_part slices of (n_rows, dim) f32,
 * part_stride floats apart; d_w (dim) dt; d_out (n_rows, dim) dt or NULL
 * (then only x is updated and d_w is not read). */
bt_status_t cuda_rmsnorm_parts(float *d_x, const float *d_part, int n_part,
                               size_t part_stride, const void *d_w,
                               int n_rows, int dim, float eps, void *d_out,
                               cuda_dtype_t dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_RMSNORM_H */
