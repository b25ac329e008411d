/*
 * gemv_tc.cu - the "tc" variant of kernels/gemv.h: a skinny tensor-core
 * GEMM y (t, o) [+]= x (t, i) . w (o, i)^T for 1..64 tokens (decode
 * batches, draft levels, speculative verification), bf16 in, f32
 * accumulation, y bf16 or f32.
 *
 * Why: at 8-64 tokens cuBLASLt reads the Llama-3-8B projection weights
 * at 1.9-3.4 TB/s (H200, 2026-12-01), the per-row GEMVs do T x the FMAs
 * on CUDA cores, and the mma1/mma2 variants re-read x from L2 for every
 * 16-32 weight rows (0.6-1.0 TB/s at 64 tokens).  Here a block owns 128
 * weight rows and streams them through shared memory once, with x's
 * matching K slice beside them, so x is read n_out / 128 times in all
 * (at 64 tokens half the weight bytes, from L2) and every weight byte
 * exactly once.
 *
 * Block: 8 warps, 128 rows x N tokens (N = 8 NT, tokens padded with
 * zeros), K in tiles of 64 through a TC_STAGES-deep cp.async ring
 * (16-byte copies; 128-byte rows swizzled: chunk c of row r at c ^ (r &
 * 7), so ldmatrix reads 8 rows from 8 bank groups).  Warp w multiplies
 * rows 16w..16w+15 by all N tokens with mma.m16n8k16 (weights as A, x
 * as B: x rows are [token][k], i.e. B "col", ldmatrix without .trans).
 * The weight tiles of the first stages are issued before the PDL wait
 * (they never depend on the previous kernel), x's after it.
 *
 * Split K: when n_out / 128 blocks cannot fill the GPU (2 per SM), the
 * grid's y dimension cuts K into S ranges.  Each block writes its f32
 * partial tile to the caller's workspace, and the last block of a tile
 * to arrive (an atomic counter per tile, reset by that block, so the
 * counters are zero again for the next launch and CUDA-graph replays)
 * adds the S partials in split order -- the result does not depend on
 * the order in which blocks finish -- and writes y.  Without a
 * workspace (or too small a one) S = 1.
 *
 * Test: test_gemm (variant "tc", with and without a workspace); timing:
 * bench_kernels --gemv; worker_gemm's autotuner picks it per shape.
 */
#include "gemv.h"

#include "bt_util.h"
#include "kern_common.cuh"
#include "tc_common.cuh"

#define TC_BM 128     /* weight rows per block */
#define TC_BK 64      /* K per stage */
#define TC_THREADS 256
#define TC_STAGES 4
#define TC_MIN_KT 4   /* K tiles per split at least */

template <int NT> struct tc_smem {
    static constexpr int W = TC_BM * TC_BK;       /* elements per stage */
    static constexpr int X = NT * 8 * TC_BK;
    static constexpr size_t BYTES = (size_t)TC_STAGES * (W + X) * 2;
};

/* Element offset of 16-byte chunk ch of row r in a swizzled tile. */
static __device__ __forceinline__ int tc_swz(int r, int ch)
{
    return r * TC_BK + ((ch ^ (r & 7)) << 3);
}

template <int NT, typename OUT>
static __global__ void __launch_bounds__(TC_THREADS, 2)
gemv_tc_kernel(int n_tok, int n_out, int n_in, int kt_split,
               const bf16_t *__restrict__ x, const bf16_t *__restrict__ w,
               OUT *y, bool accumulate, float *part, int *cnt)
{
    constexpr int N = NT * 8;
    constexpr int WE = tc_smem<NT>::W, XE = tc_smem<NT>::X;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    __shared__ int last;
    bf16_t *sw = reinterpret_cast<bf16_t *>(tc_sm);
    bf16_t *sx = sw + TC_STAGES * WE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * TC_BM;
    const int S = gridDim.y, split = blockIdx.y;
    const int kt0 = split * kt_split;
    const int nk = max(0, min(n_in / TC_BK - kt0, kt_split));

    /* K tile kt0 + i of the weights / of x into stage i % TC_STAGES */
    auto issue_w = [&](int i) {
        if (i >= nk)
            return;
        bf16_t *dst = sw + (i % TC_STAGES) * WE;
        const size_t kc = (size_t)(kt0 + i) * TC_BK;
#pragma unroll
        for (int j = 0; j < TC_BM * 8 / TC_THREADS; j++) {
            const int c = tid + j * TC_THREADS, r = c >> 3, ch = c & 7;
            const bool ok = row0 + r < n_out;
            tc_cp16(dst + tc_swz(r, ch),
                    w + (size_t)(ok ? row0 + r : 0) * n_in + kc + ch * 8, ok);
        }
    };
    auto issue_x = [&](int i) {
        if (i >= nk)
            return;
        bf16_t *dst = sx + (i % TC_STAGES) * XE;
        const size_t kc = (size_t)(kt0 + i) * TC_BK;
        for (int c = tid; c < N * 8; c += TC_THREADS) {
            const int r = c >> 3, ch = c & 7;
            const bool ok = r < n_tok;
            tc_cp16(dst + tc_swz(r, ch),
                    x + (size_t)(ok ? r : 0) * n_in + kc + ch * 8, ok);
        }
    };

    for (int i = 0; i < TC_STAGES - 1; i++) {
        issue_w(i);
        tc_cp_commit();
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    for (int i = 0; i < TC_STAGES - 1; i++)
        issue_x(i);
    tc_cp_commit();

    float c[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            c[nt][e] = 0.0f;

    for (int i = 0; i < nk; i++) {
        /* stage i landed (the prologue's groups all at i = 0; then the
         * one committed TC_STAGES - 1 iterations ago); everyone is done
         * with the stage the next issue overwrites */
        if (i == 0)
            tc_cp_wait<0>();
        else
            tc_cp_wait<TC_STAGES - 2>();
        __syncthreads();
        issue_w(i + TC_STAGES - 1);
        issue_x(i + TC_STAGES - 1);
        tc_cp_commit();

        const bf16_t *ws = sw + (i % TC_STAGES) * WE + warp * 16 * TC_BK;
        const bf16_t *xs = sx + (i % TC_STAGES) * XE;
#pragma unroll
        for (int kp = 0; kp < 2; kp++) {
            /* A: rows 0-15 of the warp, k steps 2 kp and 2 kp + 1 */
            uint32_t a0[4], a1[4];
            const int ar = lane & 15;
            tc_ldm(a0, ws + tc_swz(ar, 4 * kp + (lane >> 4)));
            tc_ldm(a1, ws + tc_swz(ar, 4 * kp + 2 + (lane >> 4)));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* B: tokens 8 nt..8 nt+7, chunks 4 kp..4 kp+3 = (b0, b1)
                 * of both k steps */
                uint32_t b[4];
                const int br = nt * 8 + (lane & 7);
                tc_ldm(b, xs + tc_swz(br, 4 * kp + (lane >> 3)));
                tc_mma(c[nt], a0, b[0], b[1]);
                tc_mma(c[nt], a1, b[2], b[3]);
            }
        }
    }

    /* C fragment: rows 16 warp + g (+8), tokens 8 nt + 2 q (+1) */
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
                    if (accumulate)
                        v += kern_to_f(*d);
                    *d = kern_from_f<OUT>(v);
                }
            }
        return;
    }

    /* split K: partial tile (N x TC_BM f32) of this split */
    float *pt = part + (size_t)blockIdx.x * S * N * TC_BM;
    float *pb = pt + (size_t)split * N * TC_BM;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = warp * 16 + g + (e & 2 ? 8 : 0);
            const int tok = nt * 8 + 2 * q + (e & 1);
            if (tok < n_tok)
                pb[tok * TC_BM + r] = c[nt][e];
        }
    __threadfence();
    __syncthreads();
    if (tid == 0)
        last = atomicAdd(&cnt[blockIdx.x], 1) == S - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    for (int i = tid; i < n_tok * TC_BM; i += TC_THREADS) {
        const int tok = i / TC_BM, row = row0 + (i - tok * TC_BM);
        if (row >= n_out)
            continue;
        float v = 0.0f;
        for (int s = 0; s < S; s++)
            v += __ldcg(pt + (size_t)s * N * TC_BM + i);
        OUT *d = y + (size_t)tok * n_out + row;
        if (accumulate)
            v += kern_to_f(*d);
        *d = kern_from_f<OUT>(v);
    }
    if (tid == 0)
        cnt[blockIdx.x] = 0;
}

// ---------------------------------------------------------------------
// Launch

static int tc_nt(int n_tok)
{
    return n_tok <= 8 ? 1 : n_tok <= 16 ? 2 : n_tok <= 32 ? 4 : 8;
}

bool cuda_gemv_tc_ok(int n_tok, int n_out, int n_in)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_MMA_MAX_TOK && n_out >= 1 &&
           n_in >= TC_BK && n_in % TC_BK == 0;
}

/* The split count for the shape: enough blocks for 2 per SM, at least
 * TC_MIN_KT K tiles each, partials within the workspace. */
static int tc_splits(int n_tok, int n_out, int n_in,
                     const cuda_gemv_ws_t *ws, int n_sm)
{
    const int tiles = (int)BT_DIV_UP(n_out, TC_BM);
    const int kt = n_in / TC_BK;
    const size_t tile_bytes = (size_t)tc_nt(n_tok) * 8 * TC_BM * 4;
    int s;

    if (ws == NULL || ws->d_part == NULL || ws->d_cnt == NULL ||
        tiles > ws->n_cnt)
        return 1;
    s = BT_MAX(1, BT_MIN(2 * n_sm / tiles, kt / TC_MIN_KT));
    while (s > 1 && (size_t)tiles * s * tile_bytes > ws->part_bytes)
        s--;
    return s;
}

template <int NT, typename OUT>
static cudaError_t tc_launch_t(int n_tok, int n_out, int n_in,
                               const bf16_t *x, const bf16_t *w, OUT *y,
                               bool acc, const cuda_gemv_ws_t *ws,
                               cudaStream_t st)
{
    static uint64_t attr_done; /* bit per device */
    static int sm_of[64];      /* multiprocessors per device, 0: unknown */
    auto k = gemv_tc_kernel<NT, OUT>;
    int dev = 0, n_sm = 0;
    cudaError_t err = cudaGetDevice(&dev);

    if (err != cudaSuccess)
        return err;
    if (dev >= 64 || !(attr_done >> dev & 1)) {
        err = cudaFuncSetAttribute(
            k, cudaFuncAttributeMaxDynamicSharedMemorySize,
            (int)tc_smem<NT>::BYTES);
        if (err != cudaSuccess)
            return err;
        if (dev < 64)
            attr_done |= 1ull << dev;
    }
    if (dev < 64)
        n_sm = sm_of[dev];
    if (n_sm == 0) {
        err = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount,
                                     dev);
        if (err != cudaSuccess)
            return err;
        if (dev < 64)
            sm_of[dev] = n_sm;
    }
    const int kt = n_in / TC_BK;
    int s = tc_splits(n_tok, n_out, n_in, ws, n_sm);
    const int kt_split = (int)BT_DIV_UP(kt, s);
    s = (int)BT_DIV_UP(kt, kt_split); /* no empty splits */
    kern_launch(k, dim3((unsigned)BT_DIV_UP(n_out, TC_BM), (unsigned)s),
                dim3(TC_THREADS), tc_smem<NT>::BYTES, st, n_tok, n_out, n_in,
                kt_split, x, w, y, acc, s > 1 ? ws->d_part : (float *)NULL,
                s > 1 ? ws->d_cnt : (int *)NULL);
    return cudaSuccess;
}

template <typename OUT>
static cudaError_t tc_launch(int n_tok, int n_out, int n_in, const bf16_t *x,
                             const bf16_t *w, OUT *y, bool acc,
                             const cuda_gemv_ws_t *ws, cudaStream_t st)
{
    switch (tc_nt(n_tok)) {
    case 1: return tc_launch_t<1, OUT>(n_tok, n_out, n_in, x, w, y, acc, ws, st);
    case 2: return tc_launch_t<2, OUT>(n_tok, n_out, n_in, x, w, y, acc, ws, st);
    case 4: return tc_launch_t<4, OUT>(n_tok, n_out, n_in, x, w, y, acc, ws, st);
    default: return tc_launch_t<8, OUT>(n_tok, n_out, n_in, x, w, y, acc, ws, st);
    }
}

cudaError_t cuda_gemv_tc(int n_tok, int n_out, int n_in, const void *d_x,
                         const void *d_w, void *d_y, cuda_dtype_t out_dt,
                         bool accumulate, const cuda_gemv_ws_t *ws,
                         cudaStream_t stream)
{
    cudaError_t err = cudaSuccess;

    KERN_DISPATCH_DT(out_dt, OUT, err = tc_launch<OUT>(
        n_tok, n_out, n_in, (const bf16_t *)d_x, (const bf16_t *)d_w,
        (OUT *)d_y, accumulate, ws, stream));
    return err;
}

cudaError_t cuda_gemv_tc_prepare(void)
{
    cudaError_t err = cudaSuccess;

#define TC_ATTR(NT, OUT)                                                    \
    if (err == cudaSuccess)                                                 \
        err = cudaFuncSetAttribute(gemv_tc_kernel<NT, OUT>,                 \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)tc_smem<NT>::BYTES)
    TC_ATTR(1, float);
    TC_ATTR(2, float);
    TC_ATTR(4, float);
    TC_ATTR(8, float);
    TC_ATTR(1, bf16_t);
    TC_ATTR(2, bf16_t);
    TC_ATTR(4, bf16_t);
    TC_ATTR(8, bf16_t);
#undef TC_ATTR
    return err;
}
