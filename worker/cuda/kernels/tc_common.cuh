/*
 * tc_common.cuh - tensor-core building blocks shared by the attention
 * kernels (attn_decode_tc.cu, attn_prefill.cu) and the skinny GEMMs
 * (gemv_tc.cu, gemm_fp8_skinny.cu): 16-byte cp.async copies into shared
 * memory with zero fill, ldmatrix (plain and transposed), mma.m16n8k16
 * bf16 (or f16) -> f32, bf16 (or f16) pair packing, and the skinny GEMMs'
 * split-K epilogue (tc_splitk_store).  Fragment layout of
 * mma.m16n8k16 (lane = 4 g + t): A regs {row g, cols 2t..2t+1}, {row g+8},
 * {row g, cols 2t+8..}, {row g+8, cols 2t+8..}; B regs {rows 2t..2t+1,
 * col g}, {rows 2t+8..}; C {row g, cols 2t, 2t+1}, {row g+8, same}.
 */
#ifndef BT_WORKER_CUDA_KERNELS_TC_COMMON_CUH
#define BT_WORKER_CUDA_KERNELS_TC_COMMON_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "kern_common.cuh"

static __device__ __forceinline__ void tc_cp16(void *smem, const void *gmem,
                                               bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; /* 0: zero-fill, nothing read */

    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(s), "l"(gmem), "r"(n) : "memory");
}

/* tc_cp16 with an L2 cache policy (tc_policy_evict_first: data read
 * once, such as a decode step's K/V, need not push out of L2 what is
 * read again) and a 128-byte L2 prefetch size: the copy also asks L2 to
 * fetch the whole 128-byte line around its chunk from DRAM on a miss
 * (round 23: 256 bytes gained nothing). */
static __device__ __forceinline__ void tc_cp16_l2(void *smem,
                                                  const void *gmem,
                                                  bool valid, uint64_t pol)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;

    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B "
                 "[%0], [%1], 16, %2, %3;\n"
                 :: "r"(s), "l"(gmem), "r"(n), "l"(pol) : "memory");
}

/* An L2 policy that evicts the lines it covers first. */
static __device__ __forceinline__ uint64_t tc_policy_evict_first(void)
{
    uint64_t p;

    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;"
                 : "=l"(p));
    return p;
}

static __device__ __forceinline__ void tc_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void tc_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

/* Four 8x8 matrices of 16-bit elements (or 16 bytes a row of E4M3
 * codes) from shared memory at p. */
static __device__ __forceinline__ void tc_ldm(uint32_t *r, const void *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);

    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                 "{%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

static __device__ __forceinline__ void tc_ldm_t(uint32_t *r, const bf16_t *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);

    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                 "{%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* One mma.sync of shape `shape` (m16n8kK) with f32 accumulators,
 * c += a . b, a and b of PTX type `ab`: the fragments of tc_ldm. */
#define TC_MMA_F32(name, shape, ab)                                         \
    static __device__ __forceinline__ void name(float *c, const uint32_t *a, \
                                                uint32_t b0, uint32_t b1)   \
    {                                                                       \
        asm volatile("mma.sync.aligned." shape ".row.col.f32." ab "." ab   \
                     ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "         \
                     "{%0,%1,%2,%3};\n"                                     \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])       \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), \
                       "r"(b1));                                            \
    }

/* c (16x8 f32) += a (16x16 bf16, row) . b (16x8 bf16, col). */
TC_MMA_F32(tc_mma, "m16n8k16", "bf16")
/* The same fragments in f16 halves (the FP8-KV attention: every E4M3 code
 * is exact in f16). */
TC_MMA_F32(tc_mma_f16, "m16n8k16", "f16")
/* c (16x8 f32) += a (16x32 E4M3, row) . b (32x8 E4M3, col). */
TC_MMA_F32(tc_mma_e4m3, "m16n8k32", "e4m3")

static __device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t tc_pack_f16(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t tc_ld32(const bf16_t *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

/* The epilogue of the skinny split-K GEMMs (gemv_tc.cu, gemm_fp8_skinny.cu):
 * a block's sums c[NT][4] of BM weight rows from row0 by N = 8 NT tokens
 * (warp w: rows 16 w + g and + 8, tokens 8 nt + 2 q and + 1, the C
 * fragment of m16n8k16 and of wgmma's m64 per warpgroup), each times
 * xs[tok] * ws[row] when xs is not NULL (FP8's token and row scales),
 * into y (n_tok, n_out) [+]=.  S == 1: directly.  Else this split's f32
 * partial tile goes to part and the last block of the tile to arrive (an
 * atomic counter per tile in cnt, reset by that block, so the counters
 * are zero again for the next launch and CUDA-graph replays) adds the S
 * partials in split order -- the result does not depend on the order in
 * which blocks finish -- and writes y; *last is a __shared__ int of the
 * caller's. */
template <int NT, int BM, int THREADS, typename OUT>
static __device__ __forceinline__ void tc_splitk_store(
    const float (&c)[NT][4], OUT *y, int n_out, int n_tok, int row0,
    int S, int split, float *part, int *cnt, bool accumulate,
    const float *xs, const float *ws, int *last)
{
    constexpr int N = NT * 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;

    if (S == 1) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + warp * 16 + g + (e & 2 ? 8 : 0);
                const int tok = nt * 8 + 2 * q + (e & 1);
                if (row < n_out && tok < n_tok) {
                    OUT *d = y + (size_t)tok * n_out + row;
                    float v = c[nt][e];
                    if (xs != NULL)
                        v = v * xs[tok] * ws[row];
                    if (accumulate)
                        v += kern_to_f(*d);
                    *d = kern_from_f<OUT>(v);
                }
            }
        return;
    }

    /* split K: partial tile (N x BM f32) of this split */
    float *pt = part + (size_t)blockIdx.x * S * N * BM;
    float *pb = pt + (size_t)split * N * BM;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = warp * 16 + g + (e & 2 ? 8 : 0);
            const int tok = nt * 8 + 2 * q + (e & 1);
            if (tok < n_tok)
                pb[tok * BM + r] = c[nt][e];
        }
    __threadfence();
    __syncthreads();
    if (tid == 0)
        *last = atomicAdd(&cnt[blockIdx.x], 1) == S - 1;
    __syncthreads();
    if (!*last)
        return;
    __threadfence();
    /* four rows of one token a thread, the S partials' loads unrolled
     * (one block reduces the whole tile: keep loads in flight) */
    for (int i = 4 * tid; i < n_tok * BM; i += 4 * THREADS) {
        const int tok = i / BM, r = i - tok * BM;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int s = 0; s < S; s++) {
            const float4 p = __ldcg(reinterpret_cast<const float4 *>(
                pt + (size_t)s * N * BM + i));
            v[0] += p.x;
            v[1] += p.y;
            v[2] += p.z;
            v[3] += p.w;
        }
        if (xs != NULL)
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = v[e] * xs[tok] * ws[min(row0 + r + e, n_out - 1)];
        kern_put_rows4(y, n_out, tok, row0 + r, v, accumulate);
    }
    if (tid == 0)
        cnt[blockIdx.x] = 0;
}

#endif /* BT_WORKER_CUDA_KERNELS_TC_COMMON_CUH */
