/*
 * gemv_tc.cu - the "tc" and "wg" variants of kernels/gemv.h: a skinny
 * tensor-core GEMM y (t, o) [+]= x (t, i) . w (o, i)^T for 1..64 (tc) or
 * 1..128 (wg) tokens (decode batches, draft levels, speculative
 * verification), bf16 in, f32 accumulation, y bf16 or f32.
 *
 * Why: at 8-64 tokens cuBLASLt reads the Llama-3-8B projection weights
 * well below the bandwidth limit, the per-row GEMVs do T x the FMAs on
 * CUDA cores, and the mma1/mma2 variants re-read x from L2 for every
 * 16-32 weight rows.  Here a block owns 128
 * weight rows and streams them through shared memory once, with x's
 * matching K slice beside them, so x is read n_out / 128 times in all
 * (at 64 tokens half the weight bytes, from L2) and every weight byte
 * exactly once.
 *
 * Block: 8 warps, 128 rows x N tokens (N = 8 NT, tokens padded with
 * zeros), K in tiles of 64 through a 3-4 deep cp.async ring (16-byte
 * copies; 128-byte rows swizzled: chunk c of row r at c ^ (r & 7), so
 * ldmatrix reads 8 rows from 8 bank groups, and the layout is wgmma's
 * 128-byte swizzle).  tc: warp w multiplies rows 16w..16w+15 by all N
 * tokens with mma.m16n8k16 (weights as A, x as B: x rows are [token][k],
 * i.e. B "col", ldmatrix without .trans).  wg (sm_90a): warpgroup g runs
 * wgmma m64nNk16 on rows 64g..64g+63 with both operands read from the
 * stage by descriptor (kernels/wgmma.cuh), same accumulator layout.  The
 * weight tiles of the first stages are issued before the PDL wait (they
 * never depend on the previous kernel), x's after it.
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
 * Measured (H200, round 8 of docs/PERFORMANCE.md): wg = tc within 2-10%
 * at 8-64 tokens, both at or below cuBLASLt except the 128K-row
 * classifier; so neither the mma.sync issue rate, nor the split
 * reduction (cluster/DSMEM variant: slower), nor x's L2 reads (256-row
 * wg blocks: slower) is what holds these shapes under 4 TB/s.
 *
 * Test: test_gemm (variants "tc" and "wg", with and without a
 * workspace); timing: bench_kernels --gemv; worker_gemm's autotuner
 * picks either per shape.
 */
#include "gemv.h"

#include "bt_util.h"
#include "kern_common.cuh"
#include "tc_common.cuh"
#include "wgmma.cuh"

#define TC_BK 64      /* K per stage */
#define TC_THREADS 256
#define TC_MIN_KT 4   /* K tiles per split at least */
#define TC_ALIGN 1024 /* stage bases: the 128-byte swizzle atom of wgmma */

/* Shape of one block: 128 weight rows (tc: 8 warps x 16; WG: 2
 * warpgroups x m64) by N = 8 NT tokens (padded); two blocks a
 * multiprocessor, so 3 stages at 128 tokens (2 x 97 KB). */
template <int NT> struct tc_cfg {
    static constexpr int BM = 128;
    static constexpr int STAGES = NT > 8 ? 3 : 4;
    static constexpr int W = BM * TC_BK;           /* elements per stage */
    static constexpr int X = NT * 8 * TC_BK;
    static constexpr size_t BYTES =
        (size_t)STAGES * (W + X) * 2 + TC_ALIGN;
};

/* Element offset of 16-byte chunk ch of row r in a swizzled tile. */
static __device__ __forceinline__ int tc_swz(int r, int ch)
{
    return r * TC_BK + ((ch ^ (r & 7)) << 3);
}

/* WG: the products run as wgmma (both operands straight from the
 * swizzled stages, no ldmatrix), else ldmatrix + mma.m16n8k16. */
template <int NT, typename OUT, bool WG>
static __global__ void __launch_bounds__(TC_THREADS, 2)
gemv_tc_kernel(int n_tok, int n_out, int n_in, int kt_split,
               const bf16_t *__restrict__ x, const bf16_t *__restrict__ w,
               OUT *y, bool accumulate, float *part, int *cnt)
{
    typedef tc_cfg<NT> C;
    constexpr int N = NT * 8, BM = C::BM, STAGES = C::STAGES;
    constexpr int WE = C::W, XE = C::X;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    __shared__ int last;
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(tc_sm);
    bf16_t *sw = reinterpret_cast<bf16_t *>(
        tc_sm + ((TC_ALIGN - (sm0 & (TC_ALIGN - 1))) & (TC_ALIGN - 1)));
    bf16_t *sx = sw + STAGES * WE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * BM;
    const int S = gridDim.y, split = blockIdx.y;
    const int kt0 = split * kt_split;
    const int nk = max(0, min(n_in / TC_BK - kt0, kt_split));

    /* K tile kt0 + i of the weights / of x into stage i % STAGES */
    auto issue_w = [&](int i) {
        if (i >= nk)
            return;
        bf16_t *dst = sw + (i % STAGES) * WE;
        const size_t kc = (size_t)(kt0 + i) * TC_BK;
#pragma unroll
        for (int j = 0; j < BM * 8 / TC_THREADS; j++) {
            const int c = tid + j * TC_THREADS, r = c >> 3, ch = c & 7;
            const bool ok = row0 + r < n_out;
            tc_cp16(dst + tc_swz(r, ch),
                    w + (size_t)(ok ? row0 + r : 0) * n_in + kc + ch * 8, ok);
        }
    };
    auto issue_x = [&](int i) {
        if (i >= nk)
            return;
        bf16_t *dst = sx + (i % STAGES) * XE;
        const size_t kc = (size_t)(kt0 + i) * TC_BK;
        for (int c = tid; c < N * 8; c += TC_THREADS) {
            const int r = c >> 3, ch = c & 7;
            const bool ok = r < n_tok;
            tc_cp16(dst + tc_swz(r, ch),
                    x + (size_t)(ok ? r : 0) * n_in + kc + ch * 8, ok);
        }
    };

    for (int i = 0; i < STAGES - 1; i++) {
        issue_w(i);
        tc_cp_commit();
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    for (int i = 0; i < STAGES - 1; i++)
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
         * one committed STAGES - 1 iterations ago); everyone is done
         * with the stage the next issue overwrites */
        if (i == 0)
            tc_cp_wait<0>();
        else
            tc_cp_wait<STAGES - 2>();
        if (WG)
            wg_fence_proxy(); /* the copies, before wgmma reads them */
        __syncthreads();
        issue_w(i + STAGES - 1);
        issue_x(i + STAGES - 1);
        tc_cp_commit();

        if constexpr (WG) {
            /* warpgroup warp / 4: rows 64 (warp / 4) .. +63, all tokens;
             * its warp w % 4 holds rows 16 w .. 16 w + 15 of the tile,
             * as in the mma.sync layout below */
            const unsigned a0 = (unsigned)__cvta_generic_to_shared(
                sw + (i % STAGES) * WE + (warp >> 2) * 64 * TC_BK);
            const unsigned b0 = (unsigned)__cvta_generic_to_shared(
                sx + (i % STAGES) * XE);
            wg_fence_acc<NT>(c);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++)
                wg_mma<NT>::run(c, wg_desc(a0 + 32 * kk),
                                wg_desc(b0 + 32 * kk));
            wg_commit();
            wg_wait<0>(); /* the stage is refilled next iteration */
            wg_fence_acc<NT>(c);
        } else {
            const bf16_t *ws = sw + (i % STAGES) * WE + warp * 16 * TC_BK;
            const bf16_t *xs = sx + (i % STAGES) * XE;
#pragma unroll
            for (int kp = 0; kp < 2; kp++) {
                /* A: rows 0-15 of the warp, k steps 2 kp and 2 kp + 1 */
                uint32_t a0[4], a1[4];
                const int ar = lane & 15;
                tc_ldm(a0, ws + tc_swz(ar, 4 * kp + (lane >> 4)));
                tc_ldm(a1, ws + tc_swz(ar, 4 * kp + 2 + (lane >> 4)));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    /* B: tokens 8 nt..8 nt+7, chunks 4 kp..4 kp+3 =
                     * (b0, b1) of both k steps */
                    uint32_t b[4];
                    const int br = nt * 8 + (lane & 7);
                    tc_ldm(b, xs + tc_swz(br, 4 * kp + (lane >> 3)));
                    tc_mma(c[nt], a0, b[0], b[1]);
                    tc_mma(c[nt], a1, b[2], b[3]);
                }
            }
        }
    }

    tc_splitk_store<NT, BM, TC_THREADS>(c, y, n_out, n_tok, row0, S, split,
                                        part, cnt, accumulate, NULL, NULL,
                                        &last);
}

// ---------------------------------------------------------------------
// Launch

bool cuda_gemv_tc_ok(int n_tok, int n_out, int n_in)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_MMA_MAX_TOK && n_out >= 1 &&
           n_in >= TC_BK && n_in % TC_BK == 0;
}

bool cuda_gemv_wg_ok(int n_tok, int n_out, int n_in)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_WG_MAX_TOK && n_out >= 1 &&
           n_in >= TC_BK && n_in % TC_BK == 0 && cuda_wgmma_available();
}

/* The split count for the shape: enough blocks to fill the GPU
 * (2 per SM), at least TC_MIN_KT K tiles each, partials within
 * the workspace. */
template <int NT>
static int tc_splits(int n_out, int n_in, const cuda_gemv_ws_t *ws,
                     int n_sm)
{
    typedef tc_cfg<NT> C;
    const int tiles = (int)BT_DIV_UP(n_out, C::BM);
    const int kt = n_in / TC_BK;
    const size_t tile_bytes = (size_t)NT * 8 * C::BM * 4;
    int s;

    if (ws == NULL || ws->d_part == NULL || ws->d_cnt == NULL ||
        tiles > ws->n_cnt)
        return 1;
    s = BT_MAX(1, BT_MIN(2 * n_sm / tiles, kt / TC_MIN_KT));
    while (s > 1 && (size_t)tiles * s * tile_bytes > ws->part_bytes)
        s--;
    return s;
}

template <int NT, typename OUT, bool WG>
static cudaError_t tc_launch_t(int n_tok, int n_out, int n_in,
                               const bf16_t *x, const bf16_t *w, OUT *y,
                               bool acc, const cuda_gemv_ws_t *ws,
                               cudaStream_t st)
{
    static uint64_t attr_done; /* bit per device */
    typedef tc_cfg<NT> C;
    auto k = gemv_tc_kernel<NT, OUT, WG>;
    const int n_sm = kern_sm_count();
    cudaError_t err = kern_smem_limit_once(k, C::BYTES, &attr_done);

    if (err != cudaSuccess)
        return err;
    if (n_sm <= 0)
        return cudaErrorInvalidValue;
    const int kt = n_in / TC_BK;
    int s = tc_splits<NT>(n_out, n_in, ws, n_sm);
    const int kt_split = (int)BT_DIV_UP(kt, s);
    s = (int)BT_DIV_UP(kt, kt_split); /* no empty splits */
    kern_launch(k, dim3((unsigned)BT_DIV_UP(n_out, C::BM), (unsigned)s),
                dim3(TC_THREADS), C::BYTES, st, n_tok, n_out, n_in, kt_split,
                x, w, y, acc, s > 1 ? ws->d_part : (float *)NULL,
                s > 1 ? ws->d_cnt : (int *)NULL);
    return cudaSuccess;
}

template <typename OUT, bool WG>
static cudaError_t tc_launch(int n_tok, int n_out, int n_in, const bf16_t *x,
                             const bf16_t *w, OUT *y, bool acc,
                             const cuda_gemv_ws_t *ws, cudaStream_t st)
{
#define TC_CASE(NT)                                                         \
    return tc_launch_t<NT, OUT, WG>(n_tok, n_out, n_in, x, w, y, acc, ws, st)
    switch (kern_tok_tiles(n_tok)) {
    case 1: TC_CASE(1);
    case 2: TC_CASE(2);
    case 4: TC_CASE(4);
    case 8: TC_CASE(8);
    default:
        if constexpr (WG) /* mma.sync stops at 64 (cuda_gemv_tc_ok) */
            TC_CASE(16);
        return cudaErrorInvalidValue;
    }
#undef TC_CASE
}

cudaError_t cuda_gemv_tc(int n_tok, int n_out, int n_in, const void *d_x,
                         const void *d_w, void *d_y, cuda_dtype_t out_dt,
                         bool accumulate, bool wgmma,
                         const cuda_gemv_ws_t *ws, cudaStream_t stream)
{
    const bf16_t *x = (const bf16_t *)d_x, *w = (const bf16_t *)d_w;
    cudaError_t err = cudaSuccess;

    if (wgmma)
        KERN_DISPATCH_DT(out_dt, OUT, (err = tc_launch<OUT, true>(
            n_tok, n_out, n_in, x, w, (OUT *)d_y, accumulate, ws, stream)));
    else
        KERN_DISPATCH_DT(out_dt, OUT, (err = tc_launch<OUT, false>(
            n_tok, n_out, n_in, x, w, (OUT *)d_y, accumulate, ws, stream)));
    return err;
}

cudaError_t cuda_gemv_tc_prepare(void)
{
    cudaError_t err = cudaSuccess;

#define TC_ATTR(NT, OUT, WG)                                                \
    if (err == cudaSuccess)                                                 \
        err = cudaFuncSetAttribute(gemv_tc_kernel<NT, OUT, WG>,             \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)tc_cfg<NT>::BYTES)
#define TC_ATTRS(OUT, WG)                                                   \
    TC_ATTR(1, OUT, WG);                                                    \
    TC_ATTR(2, OUT, WG);                                                    \
    TC_ATTR(4, OUT, WG);                                                    \
    TC_ATTR(8, OUT, WG)
    TC_ATTRS(float, false);
    TC_ATTRS(bf16_t, false);
    if (cuda_wgmma_available()) {
        TC_ATTRS(float, true);
        TC_ATTRS(bf16_t, true);
        TC_ATTR(16, float, true);
        TC_ATTR(16, bf16_t, true);
    }
#undef TC_ATTRS
#undef TC_ATTR
    return err;
}
