/*
 * embed.cu - embedding gather: out[i, :] = float(table[ids[i], :]).
 * table (rows, dim) f32 or bf16; ids (n) int32; out (n, dim) f32.
 * Test: build-cuda/tests/kernels/test_embed (make gpu-test runs it).
 */
#include "embed.h"

#include "bt_util.h"
#include "kern_common.cuh"

template <typename T>
static __global__ void embed_kernel(const T *table, const int *ids, int dim,
                                    float *out)
{
    kern_pdl_trigger();
    kern_pdl_wait();
    const T *src = table + (size_t)ids[blockIdx.x] * dim;
    float *dst = out + (size_t)blockIdx.x * dim;

    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dst[i] = kern_to_f(src[i]);
}

bt_status_t cuda_embed(const void *d_table, cuda_dtype_t table_dt,
                       const int *d_ids, int n, int dim, float *d_out,
                       cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && dim > 0);
    if (n == 0)
        return BT_OK;
    KERN_DISPATCH_DT(table_dt, T,
                     kern_launch(embed_kernel<T>, n, 256, 0, stream,
                                 (const T *)d_table, d_ids, dim, d_out));
    return BT_CUDA_LAUNCH_STATUS();
}
