/*
 * swiglu.cu - SwiGLU: out[t, j] = silu(g) * u with g = gu[t, j],
 * u = gu[t, hidden + j]; gu (n, 2*hidden), out (n, hidden), f32 or bf16,
 * computed in f32.  Eight elements per thread when hidden allows.
 * Test: build-cuda/tests/kernels/test_swiglu (make gpu-test runs it).
 */
#include "swiglu.h"

#include "bt_util.h"
#include "kern_common.cuh"

template <typename T>
static __global__ void swiglu_kernel(const T *gu, int n, int hidden, T *out,
                                     int late)
{
    size_t total = (size_t)n * hidden;

    if (!late) /* cuda__pdl_late: trigger by ending */
        kern_pdl_trigger();
    kern_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / hidden;
        size_t j = i - t * hidden;
        const T *row = gu + t * 2 * hidden;
        out[i] = kern_from_f<T>(kern_swiglu_f(kern_to_f(row[j]),
                                         kern_to_f(row[hidden + j])));
    }
}

/* 8 bf16 per thread, 16-byte loads and stores (hidden % 8 == 0). */
static __global__ void swiglu_vec_kernel(const bf16_t *gu, int n, int hidden,
                                         bf16_t *out, int late)
{
    int per_row = hidden / 8;
    size_t total = (size_t)n * per_row;

    if (!late) /* cuda__pdl_late: trigger by ending */
        kern_pdl_trigger();
    kern_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / per_row;
        size_t j = (i - t * per_row) * 8;
        const bf16_t *row = gu + t * 2 * hidden;
        float g[8], u[8];
        uint4 r;
        bf16_t *o = reinterpret_cast<bf16_t *>(&r);

        kern_load_vec<bf16_t, 8>(row + j, g);
        kern_load_vec<bf16_t, 8>(row + hidden + j, u);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[k] = __float2bfloat16_rn(kern_swiglu_f(g[k], u[k]));
        *reinterpret_cast<uint4 *>(out + t * hidden + j) = r;
    }
}

bt_status_t cuda_swiglu(const void *d_gu, int n, int hidden, void *d_out,
                        cuda_dtype_t dt, cudaStream_t stream)
{
    size_t total = (size_t)n * hidden;
    int blocks;

    BT_ASSERT(n >= 0 && hidden > 0);
    if (n == 0)
        return BT_OK;
    if (dt == CUDA_DT_BF16 && hidden % 8 == 0) {
        blocks = (int)BT_MIN((total / 8 + 255) / 256, (size_t)4096);
        kern_launch(swiglu_vec_kernel, blocks, 256, 0, stream,
                    (const bf16_t *)d_gu, n, hidden, (bf16_t *)d_out,
                    cuda__pdl_late);
    } else {
        blocks = (int)BT_MIN((total + 255) / 256, (size_t)4096);
        KERN_DISPATCH_DT(dt, T,
                         kern_launch(swiglu_kernel<T>, blocks, 256, 0, stream,
                                     (const T *)d_gu, n, hidden,
                                     (T *)d_out, cuda__pdl_late));
    }
    return BT_CUDA_LAUNCH_STATUS();
}
