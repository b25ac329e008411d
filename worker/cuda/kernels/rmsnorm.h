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

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_RMSNORM_H */
