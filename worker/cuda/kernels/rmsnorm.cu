/*
 * rmsnorm.cu - RMSNorm with the residual add fused in front:
 *   x += add; out = w * x * rsqrt(mean(x^2) + eps)
 * x (rows, dim) f32 (the residual stream), add/w/out in the activation
 * dtype (f32 or bf16), one block per row, f32 sums.  dim % 4 == 0 (every
 * model): the vector kernel (16-byte loads, the row held in registers);
 * the scalar one otherwise.
 * Test: build-cuda/tests/kernels/test_rmsnorm (make gpu-test runs it).
 */
#include "rmsnorm.h"

#include <stdint.h>

#include "bt_util.h"
#include "kern_common.cuh"

template <typename T>
static __global__ void rmsnorm_kernel(float *x, const T *add, const T *w,
                                      const int *rows, int dim, float eps,
                                      T *out)
{
    __shared__ float sh[32];
    kern_pdl_trigger();
    kern_pdl_wait();
    int src = rows ? rows[blockIdx.x] : blockIdx.x;
    float *xr = x + (size_t)src * dim;
    T *o = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;

    if (add) {
        const T *a = add + (size_t)src * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = xr[i] + kern_to_f(a[i]);
            xr[i] = v;
            ss += v * v;
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = xr[i];
            ss += v * v;
        }
    }
    ss = kern_block_sum(ss, sh);
    /* Same arithmetic as the CPU reference: 1 / sqrtf(ss / n + eps). */
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = kern_from_f<T>(kern_to_f(w[i]) * (inv * xr[i]));
}

/* Four consecutive T as floats (16-byte aligned f32, 8-byte bf16). */
static __device__ __forceinline__ float4 rms_ld4(const float *p)
{
    return *reinterpret_cast<const float4 *>(p);
}
static __device__ __forceinline__ float4 rms_ld4(const bf16_t *p)
{
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ void rms_st4(float *p, float4 v)
{
    *reinterpret_cast<float4 *>(p) = v;
}
static __device__ __forceinline__ void rms_st4(bf16_t *p, float4 v)
{
    uint2 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
    h[0] = __floats2bfloat162_rn(v.x, v.y);
    h[1] = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2 *>(p) = u;
}

/* Vectorised: 256 threads per row, each keeps NV float4 of the row in
 * registers (x read once, 16-byte loads, all NV in flight), so a row
 * costs one read of x (+ add) and one write of out.  dim % 4 == 0,
 * dim <= 1024 NV.  Same arithmetic as rmsnorm_kernel (sums in another
 * order). */
#define RMS_VEC_THREADS 256
template <typename T, int NV>
static __global__ void __launch_bounds__(RMS_VEC_THREADS)
rmsnorm_vec_kernel(float *x, const T *add, const T *w, const int *rows,
                   int dim, float eps, T *out)
{
    __shared__ float sh[32];
    float4 g[NV];
    kern_pdl_trigger();
    /* The weights never depend on the kernels before this one: loaded
     * before the wait, so their latency is off the path that follows the
     * reduction (a dependent load after the block sum was one of its
     * three memory round trips: round 13). */
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * RMS_VEC_THREADS) * 4;
        g[j] = i < dim ? rms_ld4(w + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    kern_pdl_wait();
    const int src = rows ? rows[blockIdx.x] : blockIdx.x;
    float *xr = x + (size_t)src * dim;
    T *o = out + (size_t)blockIdx.x * dim;
    float4 v[NV];
    float ss = 0.0f;

#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * RMS_VEC_THREADS) * 4;
        v[j] = i < dim ? rms_ld4(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (add) {
        const T *a = add + (size_t)src * dim;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int i = (threadIdx.x + j * RMS_VEC_THREADS) * 4;
            if (i < dim) {
                float4 d = rms_ld4(a + i);
                v[j].x += d.x;
                v[j].y += d.y;
                v[j].z += d.z;
                v[j].w += d.w;
                rms_st4(xr + i, v[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NV; j++)
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z +
              v[j].w * v[j].w;
    ss = kern_block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * RMS_VEC_THREADS) * 4;
        if (i < dim) {
            float4 r;
            r.x = g[j].x * (inv * v[j].x);
            r.y = g[j].y * (inv * v[j].y);
            r.z = g[j].z * (inv * v[j].z);
            r.w = g[j].w * (inv * v[j].w);
            rms_st4(o + i, r);
        }
    }
}

/* The vector kernel's register count NV for dim, or 0 when it does not
 * apply (dim % 4, alignment, dim > 8192). */
static int rmsnorm_vec_nv(const void *x, const void *add, const void *w,
                          const void *out, int dim, size_t es)
{
    const size_t al = 4 * es;

    if (dim % 4 != 0 || dim > 8192 ||
        (uintptr_t)x % 16 != 0 || (uintptr_t)add % al != 0 ||
        (uintptr_t)w % al != 0 || (uintptr_t)out % al != 0 ||
        ((size_t)dim * es) % al != 0)
        return 0;
    int nv = (int)BT_DIV_UP(dim, 4 * RMS_VEC_THREADS);
    return nv <= 1 ? 1 : nv <= 2 ? 2 : nv <= 4 ? 4 : 8;
}

bt_status_t cuda_rmsnorm(float *d_x, const void *d_add, const void *d_w,
                         const int *d_rows, int n_rows, int dim, float eps,
                         void *d_out, cuda_dtype_t dt, cudaStream_t stream)
{
    int threads = dim >= 1024 ? 512 : 128;
    int nv;

    BT_ASSERT(n_rows >= 0 && dim > 0);
    BT_ASSERT(d_rows == NULL || d_add == NULL);
    if (n_rows == 0)
        return BT_OK;
    nv = rmsnorm_vec_nv(d_x, d_add, d_w, d_out, dim, cuda_dtype_size(dt));
    if (nv > 0) {
#define RMS_VEC(NV)                                                         \
        KERN_DISPATCH_DT(dt, T,                                             \
            kern_launch(rmsnorm_vec_kernel<T, NV>, n_rows, RMS_VEC_THREADS, \
                        0, stream, d_x, (const T *)d_add, (const T *)d_w,   \
                        d_rows, dim, eps, (T *)d_out))
        switch (nv) {
        case 1: RMS_VEC(1); break;
        case 2: RMS_VEC(2); break;
        case 4: RMS_VEC(4); break;
        default: RMS_VEC(8); break;
        }
#undef RMS_VEC
        return BT_CUDA_LAUNCH_STATUS();
    }
    KERN_DISPATCH_DT(dt, T,
                     kern_launch(rmsnorm_kernel<T>, n_rows, threads, 0, stream,
                                 d_x, (const T *)d_add, (const T *)d_w,
                                 d_rows, dim, eps, (T *)d_out));
    return BT_CUDA_LAUNCH_STATUS();
}
