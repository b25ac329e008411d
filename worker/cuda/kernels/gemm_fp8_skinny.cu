/*
 * gemm_fp8_skinny.cu - the skinny FP8 GEMM of decode steps (fp8.h):
 * y (t, n) [+]= (xq . wq^T) * xs[t] * ws[n], E4M3 input codes xq (n_tok,
 * ld) and weight codes wq (n_out, ld), f32 accumulators (the FP8 MMA's
 * adds: fp8.h), y bf16 or f32 (+= the residual), 1-64 tokens.  gemv_tc.cu's design with FP8 operands.
 * gemm_fp8.c routes 2-32 tokens here (GEMM_FP8_SKINNY_ROUTE_MAX:
 * measured; 2-8 only where wgmma runs) and, in pieces of 64, the shapes
 * cuBLASLt has no algorithm for.
 *
 * Why: at 9-32 tokens cuBLASLt's FP8 GEMM reads the Llama-3-8B weights
 * well below the bandwidth limit (its kernels are tiled for prefill),
 * and the FP8 GEMV (gemv_fp8.cu) converts codes to f16 by moving bits
 * and stops at 8 tokens; at 2-8 its 16-row blocks and the conversions
 * leave it 22-45% behind this kernel (H100, test_cuda_fp8's "fp8 small"
 * rows), at 1 token they are even and the fused GEMV keeps it.  Here a
 * block owns 128 weight rows and streams them through shared memory
 * once, with x's K slice beside them (read n_out / 128 times in all,
 * from L2), and the tensor cores multiply the codes as they are, no
 * conversion: wgmma m64nNk32 E4M3 (sm_90a).  (The
 * warp-level mma.m16n8k32 E4M3 is native on sm_89 only: on sm_90 ptxas
 * converts the codes to f16 and runs HMMA -- cutlass issue 1986 -- so it
 * is the fallback of builds and devices without wgmma.)
 *
 * Block: 8 warps, 128 rows x N tokens (N = 8 NT, NT = 1, 2, 4, 8; the
 * tokens past n_tok and the rows past n_out are zero-filled copies, their
 * results dropped).  K in tiles of 128 bytes (= 128 codes = 4 k32 MMAs)
 * through a 4-deep cp.async ring (16-byte copies; a chunk past ld is
 * zero-filled, so any ld % 16 == 0 works; 128-byte rows swizzled: chunk
 * c of row r at c ^ (r & 7), so ldmatrix reads 8 rows from 8 bank
 * groups; with 1024-byte aligned stages this is wgmma's 128-byte
 * swizzle).  wg: warpgroup g runs wgmma m64nNk32 on rows 64 g..64 g + 63
 * with both operands read from the stage by descriptor (kernels/
 * wgmma.cuh; a k32 step of codes is 32 bytes, as a bf16 k16 step, so
 * the descriptors are gemv_tc's).  mma (fallback): warp w multiplies
 * rows 16 w..16 w + 15 by all N tokens with mma.m16n8k32, weights as A,
 * x as B (x rows are [token][k], B "col": ldmatrix without .trans); the
 * 8-bit fragments of m16n8k32 are, byte for byte, the 16-bit ones of
 * m16n8k16 (A: row g resp. g + 8, bytes 4t..4t+3 of the first resp.
 * second 16 bytes of the k32 step; B: token g, the same bytes), so
 * ldmatrix.x4.b16 loads them unchanged and the addressing is gemv_tc's.
 * Both leave warp w with rows 16 w + g (+8), tokens 8 j + 2 t (+1).
 * The weight tiles of the first stages are issued before the PDL wait
 * (they never depend on the previous kernel), x's after it.
 *
 * Split K: when n_out / 128 blocks cannot fill the GPU (2 per SM: the o
 * and down projections' 32 blocks), the grid's y dimension cuts K into
 * S ranges of at least SK_MIN_KT tiles.  Each block writes its f32
 * partial tile to the workspace (cuda_gemv_ws_t, the one gemv_tc uses:
 * both touch it only after their PDL wait), and the last block of a tile
 * to arrive (an atomic counter per tile, reset by that block, so the
 * counters are zero again for the next launch and CUDA-graph replays)
 * adds the S partials in split order -- the result does not depend on
 * the order in which blocks finish -- and scales and writes y.  Without
 * a workspace (or too small a one) S = 1.  Lost (2026-12-07, H100,
 * `test_cuda_fp8 --skinny`, bench_cuda A B B A): the S blocks as one
 * cluster adding the partials through distributed shared memory.  It
 * flattened the growth with tokens (o at 16 / 32 / 64 tokens 15.8 /
 * 19.5 / 26.5 -> 17.9 / 18.9 / 22.7 us) but slowed the small counts
 * (down at 16 29.8 -> 37.0: the cluster's co-residency and barriers):
 * batch 16 @2k 4.93 -> 5.35 ms, 32 6.03 -> 6.29, 64 equal.
 *
 * Test: build-DIR/gpu/test_cuda_fp8 (against cpu__fp8_gemm_ref, the path
 * "skinny", timed against cuBLASLt at 16/32/64 tokens).
 */
#include "fp8.h"

#include "bt_util.h"
#include "kern_common.cuh"
#include "tc_common.cuh"
#include "wgmma.cuh"

#define SK_BK 128     /* K bytes (codes) per stage: 4 k32 MMAs */
#define SK_BM 128     /* weight rows per block */
#define SK_THREADS 256
#define SK_STAGES 4
#define SK_MIN_KT 4   /* K tiles per split at least */
#define SK_ALIGN 1024 /* stage bases: the 128-byte swizzle atom of wgmma */

/* Bytes of one block's ring: 4 stages of 128 weight rows and N = 8 NT
 * token rows of 128 bytes (98 KB at 64 tokens: two blocks an SM). */
template <int NT> struct sk_cfg {
    static constexpr int N = NT * 8;
    static constexpr int W = SK_BM * SK_BK; /* weight bytes per stage */
    static constexpr int X = N * SK_BK;     /* input bytes per stage */
    static constexpr size_t BYTES = (size_t)SK_STAGES * (W + X) + SK_ALIGN;
};

/* Byte offset of 16-byte chunk ch of row r in a swizzled tile. */
static __device__ __forceinline__ int sk_swz(int r, int ch)
{
    return r * SK_BK + ((ch ^ (r & 7)) << 4);
}

/* WG: the products run as wgmma (both operands straight from the
 * swizzled stages, no ldmatrix), else ldmatrix + mma.m16n8k32. */
template <int NT, typename OUT, bool WG>
static __global__ void __launch_bounds__(SK_THREADS, 2)
gemm_fp8_skinny_kernel(int n_tok, int n_out, int ld, int kt_split,
                       const uint8_t *__restrict__ xq,
                       const float *__restrict__ xs,
                       const uint8_t *__restrict__ w,
                       const float *__restrict__ ws, OUT *y,
                       bool accumulate, float *part, int *cnt)
{
    typedef sk_cfg<NT> C;
    constexpr int N = C::N, WB = C::W, XB = C::X;
    extern __shared__ __align__(128) unsigned char sk_sm[];
    __shared__ int last;
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(sk_sm);
    uint8_t *sw =
        sk_sm + ((SK_ALIGN - (sm0 & (SK_ALIGN - 1))) & (SK_ALIGN - 1));
    uint8_t *sx = sw + SK_STAGES * WB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * SK_BM;
    const int S = gridDim.y, split = blockIdx.y;
    const int kt0 = split * kt_split;
    const int nk = max(0, min((int)BT_DIV_UP(ld, SK_BK) - kt0, kt_split));

    /* K tile kt0 + i of the weights / of x into stage i % SK_STAGES;
     * chunks past ld, rows past n_out and tokens past n_tok zero-filled
     * (nothing read) */
    auto issue_w = [&](int i) {
        if (i >= nk)
            return;
        uint8_t *dst = sw + (i % SK_STAGES) * WB;
        const int kc = (kt0 + i) * SK_BK;
#pragma unroll
        for (int j = 0; j < SK_BM * 8 / SK_THREADS; j++) {
            const int c = tid + j * SK_THREADS, r = c >> 3, ch = c & 7;
            const bool ok = row0 + r < n_out && kc + ch * 16 < ld;
            tc_cp16(dst + sk_swz(r, ch),
                    ok ? w + (size_t)(row0 + r) * ld + kc + ch * 16 : w, ok);
        }
    };
    auto issue_x = [&](int i) {
        if (i >= nk)
            return;
        uint8_t *dst = sx + (i % SK_STAGES) * XB;
        const int kc = (kt0 + i) * SK_BK;
        for (int c = tid; c < N * 8; c += SK_THREADS) {
            const int r = c >> 3, ch = c & 7;
            const bool ok = r < n_tok && kc + ch * 16 < ld;
            tc_cp16(dst + sk_swz(r, ch),
                    ok ? xq + (size_t)r * ld + kc + ch * 16 : xq, ok);
        }
    };

    for (int i = 0; i < SK_STAGES - 1; i++) {
        issue_w(i);
        tc_cp_commit();
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    for (int i = 0; i < SK_STAGES - 1; i++)
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
         * one committed SK_STAGES - 1 iterations ago); everyone is done
         * with the stage the next issue overwrites */
        if (i == 0)
            tc_cp_wait<0>();
        else
            tc_cp_wait<SK_STAGES - 2>();
        if (WG)
            wg_fence_proxy(); /* the copies, before wgmma reads them */
        __syncthreads();
        issue_w(i + SK_STAGES - 1);
        issue_x(i + SK_STAGES - 1);
        tc_cp_commit();

        if constexpr (WG) {
            /* warpgroup warp / 4: rows 64 (warp / 4) .. +63, all tokens;
             * its warp w % 4 holds rows 16 w .. 16 w + 15 of the tile,
             * as in the mma.sync layout below */
            const uint64_t da = wg_desc((unsigned)__cvta_generic_to_shared(
                sw + (i % SK_STAGES) * WB + (warp >> 2) * 64 * SK_BK));
            const uint64_t db = wg_desc((unsigned)__cvta_generic_to_shared(
                sx + (i % SK_STAGES) * XB));
            wg_fence_acc<NT>(c);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < SK_BK / 32; kk++)
                wg_mma_e4m3<NT>::run(c, wg_desc_add(da, 32 * kk),
                                     wg_desc_add(db, 32 * kk));
            wg_commit();
            wg_wait<0>(); /* the stage is refilled next iteration */
            wg_fence_acc<NT>(c);
        } else {
            const uint8_t *wsm =
                sw + (i % SK_STAGES) * WB + warp * 16 * SK_BK;
            const uint8_t *xsm = sx + (i % SK_STAGES) * XB;
#pragma unroll
            for (int kp = 0; kp < 2; kp++) {
                /* A: rows 0-15 of the warp, k32 steps 2 kp (chunks 4 kp,
                 * 4 kp + 1) and 2 kp + 1: lanes 0-15 address rows 0-15 of
                 * the step's first chunk, lanes 16-31 of its second, so
                 * the four matrices are a0..a3 of m16n8k32 */
                uint32_t a0[4], a1[4];
                const int ar = lane & 15;
                tc_ldm(a0, wsm + sk_swz(ar, 4 * kp + (lane >> 4)));
                tc_ldm(a1, wsm + sk_swz(ar, 4 * kp + 2 + (lane >> 4)));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    /* B: tokens 8 nt..8 nt+7, chunks 4 kp..4 kp+3 =
                     * (b0, b1) of both k32 steps */
                    uint32_t b[4];
                    const int br = nt * 8 + (lane & 7);
                    tc_ldm(b, xsm + sk_swz(br, 4 * kp + (lane >> 3)));
                    tc_mma_e4m3(c[nt], a0, b[0], b[1]);
                    tc_mma_e4m3(c[nt], a1, b[2], b[3]);
                }
            }
        }
    }

    tc_splitk_store<NT, SK_BM, SK_THREADS>(c, y, n_out, n_tok, row0, S,
                                           split, part, cnt, accumulate,
                                           xs, ws, &last);
}

// ---------------------------------------------------------------------
// Launch

bool cuda_gemm_fp8_skinny_ok(int n_tok, int n_out, int ld)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMM_FP8_SKINNY_MAX_TOK &&
           n_out >= 1 && ld > 0 && ld % 16 == 0;
}

/* The split count for the shape: enough blocks to fill the GPU
 * (2 per SM), at least SK_MIN_KT K tiles each, partials within
 * the workspace. */
template <int NT>
static int sk_splits(int n_out, int ld, const cuda_gemv_ws_t *ws, int n_sm)
{
    const int tiles = (int)BT_DIV_UP(n_out, SK_BM);
    const int kt = (int)BT_DIV_UP(ld, SK_BK);
    const size_t tile_bytes = (size_t)sk_cfg<NT>::N * SK_BM * 4;
    int s;

    if (ws == NULL || ws->d_part == NULL || ws->d_cnt == NULL ||
        tiles > ws->n_cnt)
        return 1;
    s = BT_MAX(1, BT_MIN(2 * n_sm / tiles, kt / SK_MIN_KT));
    while (s > 1 && (size_t)tiles * s * tile_bytes > ws->part_bytes)
        s--;
    return s;
}

template <int NT, typename OUT, bool WG>
static cudaError_t sk_launch_t(int n_tok, int n_out, int ld,
                               const uint8_t *xq, const float *xs,
                               const uint8_t *w, const float *wsc, OUT *y,
                               bool acc, const cuda_gemv_ws_t *ws,
                               cudaStream_t st)
{
    static uint64_t attr_done; /* bit per device */
    typedef sk_cfg<NT> C;
    auto k = gemm_fp8_skinny_kernel<NT, OUT, WG>;
    const int n_sm = kern_sm_count();
    cudaError_t err = kern_smem_limit_once(k, C::BYTES, &attr_done);

    if (err != cudaSuccess)
        return err;
    if (n_sm <= 0)
        return cudaErrorInvalidValue;
    const int kt = (int)BT_DIV_UP(ld, SK_BK);
    int s = sk_splits<NT>(n_out, ld, ws, n_sm);
    const int kt_split = (int)BT_DIV_UP(kt, s);
    s = (int)BT_DIV_UP(kt, kt_split); /* no empty splits */
    kern_launch(k, dim3((unsigned)BT_DIV_UP(n_out, SK_BM), (unsigned)s),
                dim3(SK_THREADS), C::BYTES, st, n_tok, n_out, ld, kt_split,
                xq, xs, w, wsc, y, acc,
                s > 1 ? ws->d_part : (float *)NULL,
                s > 1 ? ws->d_cnt : (int *)NULL);
    return cudaSuccess;
}

template <typename OUT, bool WG>
static cudaError_t sk_launch(int n_tok, int n_out, int ld, const uint8_t *xq,
                             const float *xs, const uint8_t *w,
                             const float *wsc, OUT *y, bool acc,
                             const cuda_gemv_ws_t *ws, cudaStream_t st)
{
#define SK_CASE(NT)                                                         \
    return sk_launch_t<NT, OUT, WG>(n_tok, n_out, ld, xq, xs, w, wsc, y, acc,  \
                                ws, st)
    switch (kern_tok_tiles(n_tok)) {
    case 1: SK_CASE(1);
    case 2: SK_CASE(2);
    case 4: SK_CASE(4);
    case 8: SK_CASE(8);
    default:
        return cudaErrorInvalidValue;
    }
#undef SK_CASE
}

bt_status_t cuda_gemm_fp8_skinny(int n_tok, int n_out, int ld,
                                 const uint8_t *d_xq, const float *d_xs,
                                 const uint8_t *d_wq, const float *d_ws,
                                 void *d_y, cuda_dtype_t out_dt,
                                 bool accumulate, bool wgmma,
                                 const cuda_gemv_ws_t *ws,
                                 cudaStream_t stream)
{
    cudaError_t err = cudaSuccess;

    if (!cuda_gemm_fp8_skinny_ok(n_tok, n_out, ld) || d_xq == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "skinny fp8 GEMM of %d tokens x %d rows (ld %d)",
                        n_tok, n_out, ld);
    if (wgmma && cuda_wgmma_available())
        KERN_DISPATCH_DT(out_dt, OUT,
                         (err = sk_launch<OUT, true>(
                              n_tok, n_out, ld, d_xq, d_xs, d_wq, d_ws,
                              (OUT *)d_y, accumulate, ws, stream)));
    else
        KERN_DISPATCH_DT(out_dt, OUT,
                         (err = sk_launch<OUT, false>(
                              n_tok, n_out, ld, d_xq, d_xs, d_wq, d_ws,
                              (OUT *)d_y, accumulate, ws, stream)));
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}

bool cuda_gemm_fp8_skinny_native(void)
{
    return cuda_wgmma_available();
}

bt_status_t cuda_gemm_fp8_skinny_prepare(void)
{
    cudaError_t err = cudaSuccess;

#define SK_ATTR(NT, OUT, WG)                                                \
    if (err == cudaSuccess)                                                 \
        err = cudaFuncSetAttribute(gemm_fp8_skinny_kernel<NT, OUT, WG>,     \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)sk_cfg<NT>::BYTES)
#define SK_ATTRS(OUT, WG)                                                   \
    SK_ATTR(1, OUT, WG);                                                    \
    SK_ATTR(2, OUT, WG);                                                    \
    SK_ATTR(4, OUT, WG);                                                    \
    SK_ATTR(8, OUT, WG)
    SK_ATTRS(float, false);
    SK_ATTRS(bf16_t, false);
    if (cuda_wgmma_available()) {
        SK_ATTRS(float, true);
        SK_ATTRS(bf16_t, true);
    }
#undef SK_ATTRS
#undef SK_ATTR
    return BT_CUDA_STATUS(err);
}
