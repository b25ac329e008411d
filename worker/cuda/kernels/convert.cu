/*
 * convert.cu - weight conversion: F32/F16/BF16 (n) -> f32 or bf16 (n).
 * Runs once at load; grid-stride loop.
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
