/*
 * allreduce.cu - the one-shot peer-to-peer all-reduce (see allreduce.h).
 *
 * Grid: at most one block per SM (every block resident at once, so a
 * block spinning on a peer's flag never keeps that peer's partner block
 * from running on the same GPU: the partner is on the other GPU, whose
 * stream is also free of other work).  Thread t < n_ranks of a block
 * owns the flag exchange with rank t: a release store (system scope)
 * into the peer's flag word for (block, my rank), then an acquire spin
 * on its own word for (block, t).  Block b's elements are the same on
 * every rank (same grid): thread t of block b holds float4s
 * b * THREADS + t + k * stride, k < VEC_PER_THREAD, and stages float4
 * k * THREADS + t of its block's half.
 */
#include "allreduce.h"

#include "bt_util.h"
#include "kern_common.cuh"

#define AR_HALF4 (CUDA_AR_THREADS * CUDA_AR_VEC_PER_THREAD) /* float4s */

struct ar_args_t {
    cuda_ar_t ar;
    size_t off4;     /* first float4 of this call */
    size_t n4;       /* float4s of this call */
};

static __device__ __forceinline__ void ar_store_release(uint32_t *p,
                                                        uint32_t v)
{
    asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p)
                 : "memory");
}

static __device__ __forceinline__ uint32_t ar_load_acquire(uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];"
                 : "=r"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

/* The barrier between block blockIdx.x of every rank, epoch e: our
 * staged slice is visible to the peers, theirs to us. */
static __device__ __forceinline__ void ar_barrier(const cuda_ar_t &ar,
                                                  uint32_t e)
{
    const int t = threadIdx.x;
    const size_t slot = (size_t)blockIdx.x * CUDA_AR_MAX_RANKS;

    __syncthreads();
    if (t < ar.n_ranks && t != ar.rank) {
        __threadfence_system();
        ar_store_release(ar.d_flags[t] + slot + ar.rank, e);
        /* a peer one call ahead has already stored e + 1 */
        while ((int32_t)(ar_load_acquire(ar.d_flags[ar.rank] + slot + t) -
                         e) < 0) {
        }
    }
    __syncthreads();
}

static __global__ void __launch_bounds__(CUDA_AR_THREADS)
    ar_kernel(ar_args_t a)
{
    const cuda_ar_t &ar = a.ar;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float4 *own = reinterpret_cast<float4 *>(ar.d_buf) + a.off4;
    float4 mine[CUDA_AR_VEC_PER_THREAD];
    __shared__ uint32_t s_epoch;

    if (threadIdx.x == 0)
        s_epoch = ar.d_epoch[blockIdx.x] + 1;
    __syncthreads();
    const uint32_t e = s_epoch;
    const size_t half = ((size_t)blockIdx.x * 2 + (e & 1)) * AR_HALF4;
    float4 *stage = reinterpret_cast<float4 *>(ar.d_stage[ar.rank]) + half;

    /* own slice: registers + our staging half (written by earlier
     * kernels on this stream, so plain loads past L1) */
#pragma unroll
    for (int k = 0; k < CUDA_AR_VEC_PER_THREAD; k++) {
        size_t i = i0 + k * stride;
        if (i < a.n4) {
            mine[k] = __ldcg(own + i);
            __stcg(stage + k * CUDA_AR_THREADS + threadIdx.x, mine[k]);
        }
    }
    ar_barrier(ar, e);
#pragma unroll
    for (int k = 0; k < CUDA_AR_VEC_PER_THREAD; k++) {
        size_t i = i0 + k * stride;
        if (i < a.n4) {
            /* rank order, so every rank sums the same way; a peer's
             * staging bypasses every cache of this GPU (ld.cv) */
            float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int r = 0; r < ar.n_ranks; r++) {
                float4 v = r == ar.rank
                               ? mine[k]
                               : __ldcv(reinterpret_cast<const float4 *>(
                                            ar.d_stage[r]) +
                                        half + k * CUDA_AR_THREADS +
                                        threadIdx.x);
                if (r == 0) {
                    s = v;
                } else {
                    s.x += v.x;
                    s.y += v.y;
                    s.z += v.z;
                    s.w += v.w;
                }
            }
            own[i] = s;
        }
    }
    if (threadIdx.x == 0)
        ar.d_epoch[blockIdx.x] = e;
}

size_t cuda_ar_max_floats(const cuda_ar_t *ar)
{
    return (size_t)4 * ar->n_blocks * AR_HALF4;
}

bt_status_t cuda_allreduce_custom(const cuda_ar_t *ar, size_t n,
                                  cudaStream_t stream)
{
    const size_t cap4 = cuda_ar_max_floats(ar) / 4;
    size_t n4 = n / 4;
    ar_args_t a;

    if (n % 4 != 0 || ar->n_ranks < 1 || ar->n_ranks > CUDA_AR_MAX_RANKS ||
        ar->n_blocks < 1 || ar->n_blocks > CUDA_AR_MAX_BLOCKS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "custom all-reduce: %zu floats over %d ranks, %d "
                        "blocks is not supported", n, ar->n_ranks,
                        ar->n_blocks);
    a.ar = *ar;
    for (size_t off = 0; off < n4; off += cap4) {
        size_t c4 = BT_MIN(cap4, n4 - off);
        /* one float4 per thread while that fills at most the grid cap */
        int blocks = (int)BT_MIN((c4 + CUDA_AR_THREADS - 1) /
                                     CUDA_AR_THREADS,
                                 (size_t)ar->n_blocks);

        a.off4 = off;
        a.n4 = c4;
        ar_kernel<<<blocks, CUDA_AR_THREADS, 0, stream>>>(a);
        bt_status_t status = BT_CUDA_LAUNCH_STATUS();
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}
