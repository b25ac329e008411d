/*
 * rmsnorm.cu - RMSNorm with the residual add fused in front:
 *   x += add; out = w * x * rsqrt(mean(x^2) + eps)
 * x (rows, dim) f32 (the residual stream), add/w/out in the activation
 * dtype (f32 or bf16), one block per row, f32 sums.
 * Test: build-cuda/tests/kernels/test_rmsnorm (make gpu-test runs it).
 */
#include "rmsnorm.h"

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

bt_status_t cuda_rmsnorm(float *d_x, const void *d_add, const void *d_w,
                         const int *d_rows, int n_rows, int dim, float eps,
                         void *d_out, cuda_dtype_t dt, cudaStream_t stream)
{
    int threads = dim >= 1024 ? 512 : 128;

    BT_ASSERT(n_rows >= 0 && dim > 0);
    BT_ASSERT(d_rows == NULL || d_add == NULL);
    if (n_rows == 0)
        return BT_OK;
    KERN_DISPATCH_DT(dt, T,
                     kern_launch(rmsnorm_kernel<T>, n_rows, threads, 0, stream,
                                 d_x, (const T *)d_add, (const T *)d_w,
                                 d_rows, dim, eps, (T *)d_out));
    return BT_CUDA_LAUNCH_STATUS();
}
