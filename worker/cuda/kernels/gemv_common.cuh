/*
 * gemv_common.cuh - device pieces shared by the rows GEMV (gemv.cu) and
 * the fused MLP (gemv_mlp.cu): the 8-element chunk dot product, bulk L2
 * prefetches, and the RMSNorm staged into shared memory in front of a
 * GEMV.  Each kernel that uses them keeps the same arithmetic order, so
 * the fused kernels stay bit-identical to the unfused ones.
 */
#ifndef BT_WORKER_CUDA_KERNELS_GEMV_COMMON_CUH
#define BT_WORKER_CUDA_KERNELS_GEMV_COMMON_CUH

#include "kern_common.cuh"

/* Multiply-adds one 8-element weight chunk into the T accumulators: x
 * chunk c of each token row.  PLAIN_X: x through ordinary loads (shared
 * memory, or global data written inside the same kernel, which the
 * read-only path may not see); else __ldg. */
template <int T, bool PLAIN_X = false>
static __device__ __forceinline__ void gemv_chunk(const uint4 &wv,
                                                  const bf16_t *x, int n_in,
                                                  int c, float *acc)
{
    float wf[8];
    const bf16_t *we = reinterpret_cast<const bf16_t *>(&wv);
#pragma unroll
    for (int e = 0; e < 8; e++)
        wf[e] = __bfloat162float(we[e]);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xp =
            reinterpret_cast<const uint4 *>(x + (size_t)t * n_in) + c;
        uint4 xv = PLAIN_X ? *xp : __ldg(xp);
        const bf16_t *xe = reinterpret_cast<const bf16_t *>(&xv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[t] += wf[e] * __bfloat162float(xe[e]);
    }
}

/* Issues an L2 prefetch of `bytes` (a multiple of 16) at p (16-byte
 * aligned) through the bulk-copy engine: no registers, no completion to
 * wait for; the lines land in L2 while the issuing warp does other work.
 * Pieces of at most 32 KB. */
static __device__ __forceinline__ void gemv_prefetch_l2(const void *p,
                                                        int bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char *c = reinterpret_cast<const char *>(p);
    for (int off = 0; off < bytes; off += 32768) {
        int n = min(32768, bytes - off);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                     :: "l"(c + off), "r"(n) : "memory");
    }
#endif
}

/* Chunks of the norm weights g a thread loads before the PDL wait
 * (gemv_norm_gpre): the first GEMV_NORM_GPRE of its chunks in
 * gemv_norm_stage's order, so the staging's second pass waits on no
 * DRAM load (round 13 took the same load off rmsnorm.cu's path). */
#define GEMV_NORM_GPRE 2

static __device__ __forceinline__ void gemv_norm_gpre(
    int n_in, const bf16_t *g, uint4 (&gpre)[GEMV_NORM_GPRE])
{
#pragma unroll
    for (int k = 0; k < GEMV_NORM_GPRE; k++) {
        const int i = (threadIdx.x + k * blockDim.x) * 8;
        gpre[k] = i < n_in ? __ldg(reinterpret_cast<const uint4 *>(g + i))
                           : make_uint4(0, 0, 0, 0);
    }
}

/* Stages the RMSNorm of the f32 rows xf (T, n_in) into xs (T, n_in) bf16:
 * xs = bf16(g * (x * 1 / sqrtf(mean(x^2) + eps))), the arithmetic of
 * cuda_rmsnorm() (no add); gpre: g's first chunks (gemv_norm_gpre).
 * n_in % 8 == 0; whole block; ends with __syncthreads(). */
template <int T>
static __device__ __forceinline__ void gemv_norm_stage(
    int n_in, const float *xf, const bf16_t *g, float eps, bf16_t *xs,
    float *red, const uint4 (&gpre)[GEMV_NORM_GPRE])
{
#pragma unroll 1
    for (int t = 0; t < T; t++) {
        const float *xr = xf + (size_t)t * n_in;
        float ss = 0.0f;
        for (int i = threadIdx.x * 8; i < n_in; i += blockDim.x * 8) {
            float4 a = *reinterpret_cast<const float4 *>(xr + i);
            float4 b = *reinterpret_cast<const float4 *>(xr + i + 4);
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        }
        ss = kern_block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / (float)n_in + eps);
        auto put = [&](int i, const uint4 &gv) {
            float4 a = *reinterpret_cast<const float4 *>(xr + i);
            float4 b = *reinterpret_cast<const float4 *>(xr + i + 4);
            const bf16_t *ge = reinterpret_cast<const bf16_t *>(&gv);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            uint4 o;
            bf16_t *oe = reinterpret_cast<bf16_t *>(&o);
#pragma unroll
            for (int e = 0; e < 8; e++)
                oe[e] = __float2bfloat16_rn(__bfloat162float(ge[e]) *
                                            (inv * xv[e]));
            *reinterpret_cast<uint4 *>(xs + (size_t)t * n_in + i) = o;
        };
#pragma unroll
        for (int k = 0; k < GEMV_NORM_GPRE; k++) {
            const int i = (threadIdx.x + k * blockDim.x) * 8;
            if (i < n_in)
                put(i, gpre[k]);
        }
        for (int i = (threadIdx.x + GEMV_NORM_GPRE * blockDim.x) * 8;
             i < n_in; i += blockDim.x * 8)
            put(i, *reinterpret_cast<const uint4 *>(g + i));
    }
    __syncthreads();
}

#endif /* BT_WORKER_CUDA_KERNELS_GEMV_COMMON_CUH */
