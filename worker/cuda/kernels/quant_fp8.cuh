/*
 * quant_fp8.cuh - what the FP8 input producers share: quant_fp8.cu's
 * one-block kernels (qf8_vec_kernel) and the 1-token GEMV that makes its
 * input itself (gemv_fp8.cu, cuda_gemv_fp8_fused).  The produced values
 * and the block reductions are these functions in both, so the fused
 * GEMV computes bit for bit the two-kernel path's numbers.
 */
#ifndef BT_WORKER_CUDA_KERNELS_QUANT_FP8_CUH
#define BT_WORKER_CUDA_KERNELS_QUANT_FP8_CUH

#include "kern_common.cuh"

/* Threads of qf8_vec_kernel; the fused GEMV's block has as many, so the
 * RMSNorm's sum of squares is added in the same order (thread t sums
 * chunks t, t + QF8_VEC_THREADS, ... of 8 values, then kern_block_sum). */
#define QF8_VEC_THREADS 512

/* The values the bf16 kernels store (rmsnorm.cu, swiglu.cu), as floats:
 * every producer makes its rows through these. */
static __device__ __forceinline__ float qf8_norm_val(float g, float ninv,
                                                     float x)
{
    return __bfloat162float(__float2bfloat16_rn(g * (ninv * x)));
}
static __device__ __forceinline__ float qf8_glu_val(float gate, float up)
{
    return __bfloat162float(__float2bfloat16_rn(kern_swiglu_f(gate, up)));
}

/* Max over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets it.  `sh` holds 32 floats. */
static __device__ __forceinline__ float qf8_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;

    v = kern_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return kern_warp_max(v);
}

#endif /* BT_WORKER_CUDA_KERNELS_QUANT_FP8_CUH */
