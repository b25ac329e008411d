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

/* Folds an RMSNorm's weights g (cols, bf16) into the bf16 matrix d_w
 * (rows, cols) that multiplies the norm's output: w[r][c] = bf16(w[r][c]
 * g[c]) (round to nearest even), so rmsnorm(x, g) . w^T becomes
 * (x / rms(x)) . w'^T (cuda_gemv_norm with d_g NULL).  reset_g: then sets
 * g to 1 (in stream order after the fold), for the unfused path's
 * cuda_rmsnorm.  Call once per matrix, reset_g on the last matrix that
 * folds g. */
bt_status_t cuda_fold_norm(void *d_w, size_t rows, int cols, void *d_g,
                           bool reset_g, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_CONVERT_H */
