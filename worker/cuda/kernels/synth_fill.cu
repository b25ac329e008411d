/*
 * synth_fill.cu - device fill of synthesized weights (see synth_fill.h).
 * The mixing, the value formula and the bf16/f16 rounding are the host's
 * (worker/model/model_synth.c, model.c) in integer arithmetic, so the
 * bytes match bit for bit; tests/gpu compares them.
 */
#include "synth_fill.h"

#include <cuda_fp16.h>

#include "bt_util.h"
#include "kern_common.cuh"

#define SF_CHUNK 65536
#define SF_GOLDEN 0x9e3779b97f4a7c15ull

static __device__ __forceinline__ uint64_t sf_mix(uint64_t x)
{
    x += SF_GOLDEN;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static __device__ __forceinline__ float sf_value(uint64_t seed, int id,
                                                 int64_t index, float scale)
{
    uint64_t chunk = (uint64_t)(index / SF_CHUNK);
    uint64_t o = (uint64_t)(index % SF_CHUNK);
    uint64_t s = sf_mix(seed ^ sf_mix(((uint64_t)id << 32) ^ chunk));
    uint64_t r;

    s += (o + 1) * SF_GOLDEN;
    r = s;
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
    r ^= r >> 31;
    float sum = (float)((r & 0xffff) + ((r >> 16) & 0xffff) +
                        ((r >> 32) & 0xffff) + (r >> 48));
    return __fmul_rn(sum - 2.0f * 65535.0f, scale);
}

/* model_f32_to_bf16 / model_bf16_to_f32 (no NaN here). */
static __device__ __forceinline__ float sf_round_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

/* model_f32_to_f16 then model_f16_to_f32 (finite, small values). */
static __device__ __forceinline__ float sf_round_f16(float f)
{
    return __half2float(__float2half_rn(f));
}

template <typename D>
static __global__ void sf_kernel(cuda_synth_args_t a, float scale, D *dst)
{
    const int64_t n = a.rows * a.cols;

    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / a.cols, c = i % a.cols;
        float v = 1.0f;

        if (!a.ones) {
            v = sf_value(a.seed, a.id, (a.row0 + r) * a.full_cols + a.col0 + c,
                         scale);
            if (a.dtype == CUDA_SRC_BF16)
                v = sf_round_bf16(v);
            else if (a.dtype == CUDA_SRC_F16)
                v = sf_round_f16(v);
        }
        dst[i] = kern_from_f<D>(v);
    }
}

bt_status_t cuda_synth_fill(const cuda_synth_args_t *args, void *d_dst,
                            cuda_dtype_t dst_dt, cudaStream_t stream)
{
    /* the host's constant, folded the same way (float arithmetic) */
    const float scale = 0.02f * 1.7320508f / 65536.0f;
    int64_t n = args->rows * args->cols;
    int blocks = (int)BT_MIN((n + 255) / 256, (int64_t)65536);

    if (n <= 0)
        return BT_OK;
    KERN_DISPATCH_DT(dst_dt, D, {
        sf_kernel<D><<<blocks, 256, 0, stream>>>(*args, scale, (D *)d_dst);
    });
    return BT_CUDA_LAUNCH_STATUS();
}
