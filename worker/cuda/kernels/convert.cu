/*
 * convert.cu - weight conversion: F32/F16/BF16 (n) -> f32 or bf16 (n),
 * and an RMSNorm's weights folded into the bf16 matrix that consumes its
 * output (cuda_fold_norm).  Run once at load; grid-stride loops.
 */
#include "convert.h"

#include <cuda_fp16.h>

#include "bt_util.h"
#include "kern_common.cuh"

template <typename S> static __device__ __forceinline__ float conv_in(S x);
template <> __device__ __forceinline__ float conv_in<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ float conv_in<__half>(__half x)
{
    return __half2float(x);
}
template <> __device__ __forceinline__ float conv_in<bf16_t>(bf16_t x)
{
    return __bfloat162float(x);
}

template <typename S, typename D>
static __global__ void convert_kernel(const S *src, size_t n, D *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = kern_from_f<D>(conv_in<S>(src[i]));
}

bt_status_t cuda_convert(const void *d_src, cuda_src_dtype_t src_dt,
                         size_t n, void *d_dst, cuda_dtype_t dst_dt,
                         cudaStream_t stream)
{
    int blocks = (int)BT_MIN((n + 255) / 256, (size_t)8192);

    if (n == 0)
        return BT_OK;
    KERN_DISPATCH_DT(dst_dt, D, {
        if (src_dt == CUDA_SRC_F32)
            convert_kernel<float, D><<<blocks, 256, 0, stream>>>(
                (const float *)d_src, n, (D *)d_dst);
        else if (src_dt == CUDA_SRC_F16)
            convert_kernel<__half, D><<<blocks, 256, 0, stream>>>(
                (const __half *)d_src, n, (D *)d_dst);
        else
            convert_kernel<bf16_t, D><<<blocks, 256, 0, stream>>>(
                (const bf16_t *)d_src, n, (D *)d_dst);
    });
    return BT_CUDA_LAUNCH_STATUS();
}

/* w[r][c] = bf16(w[r][c] * g[c]) over rows x cols; then (block 0) g = 1
 * -- after every block has read g: a second launch does it. */
static __global__ void fold_norm_kernel(bf16_t *w, size_t rows, int cols,
                                        const bf16_t *g)
{
    const size_t n = rows * (size_t)cols;

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = __float2bfloat16_rn(__bfloat162float(w[i]) *
                                   __bfloat162float(g[i % cols]));
}

static __global__ void fill_one_kernel(bf16_t *g, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x)
        g[i] = __float2bfloat16_rn(1.0f);
}

bt_status_t cuda_fold_norm(void *d_w, size_t rows, int cols, void *d_g,
                           bool reset_g, cudaStream_t stream)
{
    const size_t n = rows * (size_t)cols;
    const int blocks = (int)BT_MIN((n + 255) / 256, (size_t)8192);

    if (n == 0)
        return BT_OK;
    fold_norm_kernel<<<blocks, 256, 0, stream>>>((bf16_t *)d_w, rows, cols,
                                                 (const bf16_t *)d_g);
    if (reset_g)
        fill_one_kernel<<<(cols + 255) / 256, 256, 0, stream>>>(
            (bf16_t *)d_g, cols);
    return BT_CUDA_LAUNCH_STATUS();
}
