/*
 * convert.h - element type conversion of weights on the device (the
 * loader's F32/F16/BF16 to the backend's bf16 or f32).
 */
#ifndef BT_WORKER_CUDA_KERNELS_CONVERT_H
#define BT_WORKER_CUDA_KERNELS_CONVERT_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Source element types; the values match model_dtype_t. */
typedef enum {
    CUDA_SRC_F32 = 0,
    CUDA_SRC_F16 = 1,
    CUDA_SRC_BF16 = 2
} cuda_src_dtype_t;

/* d_dst[i] = convert(d_src[i]) for i < n (bf16 rounds to nearest even). */
bt_status_t cuda_convert(const void *d_src, cuda_src_dtype_t src_dt,
                         size_t n, void *d_dst, cuda_dtype_t dst_dt,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_CONVERT_H */
