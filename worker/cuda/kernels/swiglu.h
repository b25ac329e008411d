/*
 * swiglu.h - the SwiGLU gate of the feed-forward block.
 */
#ifndef BT_WORKER_CUDA_KERNELS_SWIGLU_H
#define BT_WORKER_CUDA_KERNELS_SWIGLU_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[t, j] = silu(gu[t, j]) * gu[t, hidden + j]
 * d_gu (n, 2*hidden) dt: the fused gate|up projection; d_out (n, hidden). */
bt_status_t cuda_swiglu(const void *d_gu, int n, int hidden, void *d_out,
                        cuda_dtype_t dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_SWIGLU_H */
