/*
 * sample.cu - greedy token selection: one block per logits row, each
 * thread keeps (best value, lowest index), then a warp and block merge.
 * logits (rows, vocab) f32 -> ids (rows) int32.  NaN never wins.
 * Test: build-cuda/tests/kernels/test_sample (make gpu-test runs it).
 */
#include "sample.h"

#include <math.h>

#include "bt_util.h"
#include "kern_common.cuh"

static __device__ __forceinline__ void argmax_merge(float *v, int *i,
                                                    float ov, int oi)
{
    if (ov > *v || (ov == *v && oi < *i)) {
        *v = ov;
        *i = oi;
    }
}

static __global__ void argmax_kernel(const float *logits, int vocab, int *ids)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *row = logits + (size_t)blockIdx.x * vocab;
    float best = -INFINITY;
    int bi = vocab; /* "none yet": larger than any index */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        argmax_merge(&best, &bi, row[j], j);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_merge(&best, &bi, ov, oi);
    }
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : vocab;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_merge(&best, &bi, ov, oi);
        }
        if (lane == 0)
            ids[blockIdx.x] = bi < vocab ? bi : 0;
    }
}

bt_status_t cuda_argmax(const float *d_logits, int n_rows, int vocab,
                        int *d_ids, cudaStream_t stream)
{
    BT_ASSERT(n_rows >= 0 && vocab > 0);
    if (n_rows == 0)
        return BT_OK;
    argmax_kernel<<<n_rows, 512, 0, stream>>>(d_logits, vocab, d_ids);
    return BT_CUDA_LAUNCH_STATUS();
}
