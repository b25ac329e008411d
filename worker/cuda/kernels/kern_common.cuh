/*
 * kern_common.cuh - device helpers shared by the kernels of worker/cuda:
 * float conversion of the two activation types (float, bf16), 16-byte
 * vector loads, warp reductions and the dtype dispatch macro.
 */
#ifndef BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH
#define BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../cuda_int.h"

typedef __nv_bfloat16 bf16_t;

static __device__ __forceinline__ float kern_to_f(float x) { return x; }
static __device__ __forceinline__ float kern_to_f(bf16_t x)
{
    return __bfloat162float(x);
}

template <typename T> static __device__ __forceinline__ T kern_from_f(float x);
template <> __device__ __forceinline__ float kern_from_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ bf16_t kern_from_f<bf16_t>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Loads N consecutive elements (N * sizeof(T) a multiple of 16 bytes or
 * smaller power of two; the address must be aligned to that) as floats. */
template <typename T, int N>
static __device__ __forceinline__ void kern_load_vec(const T *p, float *out)
{
    constexpr int BYTES = N * (int)sizeof(T);
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int c = 0; c < BYTES / 16; c++) {
            uint4 u = *reinterpret_cast<const uint4 *>(
                reinterpret_cast<const char *>(p) + 16 * c);
            const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
            for (int i = 0; i < 16 / (int)sizeof(T); i++)
                out[c * (16 / (int)sizeof(T)) + i] = kern_to_f(e[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            out[i] = kern_to_f(p[i]);
    }
}

static __device__ __forceinline__ float kern_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float kern_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the total.  `sh` holds 32 floats. */
static __device__ __forceinline__ float kern_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int n_warps = blockDim.x >> 5;

    v = kern_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : 0.0f;
    return kern_warp_sum(v);
}

/* Runs `...` with `T` bound to the C++ type of cuda_dtype_t `dt`. */
#define KERN_DISPATCH_DT(dt, T, ...)                                        \
    do {                                                                    \
        if ((dt) == CUDA_DT_F32) {                                          \
            typedef float T;                                                \
            __VA_ARGS__;                                                    \
        } else {                                                            \
            typedef bf16_t T;                                               \
            __VA_ARGS__;                                                    \
        }                                                                   \
    } while (0)

#endif /* BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH */
