/*
 * gemv_tma.cu - the "tma" variant of kernels/gemv.h: a skinny GEMM y (t, o)
 * [+]= x (t, i) . w (o, i)^T for 1..128 tokens on Hopper's asynchronous
 * units, bf16 in, f32 accumulation, y bf16 or f32.
 *
 * Why: at 8-128 tokens (decode batches, speculative verification) every
 * byte of the weights must be read once at the bandwidth limit, but the
 * ring kernels of gemv_tc.cu (tc, wg) spend their warps issuing 16-byte
 * cp.async copies and meeting at __syncthreads() every 64 K, and cuBLASLt
 * reads the Llama-3-8B qkv / o matrices at only 2.0-2.4 TB/s at 64 tokens
 * (H200, round 8 of docs/PERFORMANCE.md).  Here the three jobs are
 * separated as FlashAttention-3 / CUTLASS's warp-specialized kernels do:
 *
 * - Producer (warpgroup 0, one thread): per 64-wide K tile, two TMA tensor
 *   copies (cp.async.bulk.tensor) -- the 128 x 64 weight tile and x's
 *   N x 64 slice -- land in a stage of a 6-12 deep ring, written in the
 *   128-byte swizzle that wgmma's descriptors read (kernels/wgmma.cuh),
 *   completing on the stage's "full" mbarrier with the byte count.  Rows
 *   past n_out and tokens past n_tok are zero-filled by the copy engine.
 * - Consumers (warpgroups 1 and 2, 64 weight rows each): wait on "full",
 *   four wgmma m64nNk16 per stage, keep one group in flight, and arrive
 *   on the previous stage's "empty" mbarrier once its group completed.
 * - Persistent stream-K: one block per SM; the (row tile, K tile) units,
 *   row tile major, are cut into equal contiguous ranges, one per block,
 *   so every SM streams the same number of weight bytes whatever the
 *   tile count (48 row tiles of qkv would leave 36 of 132 SMs idle).  A
 *   tile whose K range crosses a block boundary is finished by the last
 *   of its blocks to arrive (atomic counter per tile, reset by that
 *   block): each writes its f32 partial to one of two slots of its own in
 *   the caller's workspace (its first and its last segment), and the last
 *   adds them in block order, so the result does not depend on which
 *   block finishes first.  Without a workspace the ranges are whole
 *   tiles and nothing is split.
 *
 * The weight copies of the first stages are issued before the PDL wait
 * (weights never depend on the previous kernel), x's after it.
 * BT_TMA_SPLIT=0 turns the split off (whole tiles per block; A/B);
 * BT_TMA_PER_SM=2 runs two 104 KB-ring blocks an SM (<= 64 tokens);
 * BT_TMA_EPI=owner finishes a split tile in its first block, which waits
 * for the others' partials (no atomic or partial on its critical path;
 * relies on every block being resident at once).  Both not yet run on a
 * device.
 * Measured (H200, round 10 of docs/PERFORMANCE.md): streams weights as
 * fast as cuBLASLt (4.5 vs 4.7 TB/s fitted) but costs ~7 us more a
 * launch (14.2 vs 7.3), so the autotuner leaves it out unless
 * BT_GEMV_TMA=1.
 * Test: test_gemm (variant "tma", with and without a workspace);
 * timing: bench_kernels --gemv.  sm_90a only (cuda_wgmma_available()).
 */
#include "gemv.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "wgmma.cuh"

#define TMA_BM 128 /* weight rows per tile: two consumer warpgroups */
#define TMA_BK 64  /* K per stage: one 128-byte swizzle row */
#define TMA_THREADS 384
#define TMA_MAX_STAGES 12
#define TMA_MIN_UNITS 4 /* K tiles per block at least (split mode) */

/* PER_SM blocks a multiprocessor: one with a 216 KB ring (the default),
 * or two with 104 KB each (BT_TMA_PER_SM=2, up to 64 tokens: the
 * registers of 768 threads), which lets two producers share the SM's
 * copy engine and the next kernel's blocks start beside a late one. */
template <int NT, int PER_SM> struct tma_cfg {
    static constexpr int RING = PER_SM == 1 ? 216 * 1024 : 104 * 1024;
    static constexpr int N = NT * 8;
    static constexpr int W_BYTES = TMA_BM * TMA_BK * 2;
    static constexpr int X_BYTES = N * TMA_BK * 2; /* NT KB: 1024-aligned */
    static constexpr int STAGE = W_BYTES + X_BYTES;
    static constexpr int STAGES =
        RING / STAGE < TMA_MAX_STAGES ? RING / STAGE : TMA_MAX_STAGES;
    static constexpr size_t BYTES = (size_t)STAGES * STAGE + 1024;
};

// ---------------------------------------------------------------------
// TMA (sm_90); the mbarriers are wgmma.cuh's mbar_*

/* L2 policies: the weights are read once (evict first), x is read by
 * every block (evict last). */
static __device__ __forceinline__ uint64_t tma_policy(bool keep)
{
    uint64_t p = 0;
#if WG_ENABLED
    if (keep)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;"
                     : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;"
                     : "=l"(p));
#endif
    return p;
}

/* Box (c0 = K offset, c1 = row offset) of the 2-D tensor map into dst,
 * completing on bar, with L2 policy pol. */
static __device__ __forceinline__ void tma_load(void *dst,
                                                const CUtensorMap *map,
                                                int c0, int c1,
                                                uint64_t *bar, uint64_t pol)
{
#if WG_ENABLED
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier"
                 "::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}],"
                 " [%4], %5;"
                 :: "r"(mbar_smem(dst)), "l"((uint64_t)map), "r"(c0),
                    "r"(c1), "r"(mbar_smem(bar)), "l"(pol) : "memory");
#endif
}

/* Named barrier of the 256 consumer threads (id 1; 0 is __syncthreads). */
static __device__ __forceinline__ void tma_consumers_sync(void)
{
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

// ---------------------------------------------------------------------
// Work split (the same arithmetic on every thread of every block)

typedef struct {
    int tiles;   /* row tiles of TMA_BM */
    int kt;      /* K tiles of TMA_BK */
    int blocks;  /* grid */
    int split;   /* 1: equal unit ranges (stream-K), 0: whole tiles */
    int owner;   /* split tiles finished by their first block (below) */
} tma_work_t;

/* First unit (tile * kt + K tile) of block b; b == blocks: the end. */
static __device__ __forceinline__ long long tma_start(const tma_work_t &w,
                                                      int b)
{
    if (w.split)
        return (long long)b * w.tiles * w.kt / w.blocks;
    return (long long)((long long)b * w.tiles / w.blocks) * w.kt;
}

/* The block whose range holds unit u (split mode): the largest b with
 * floor(b U / G) <= u. */
static __device__ __forceinline__ int tma_block_of(const tma_work_t &w,
                                                   long long u)
{
    const long long U = (long long)w.tiles * w.kt;
    return (int)(((u + 1) * w.blocks - 1) / U);
}

/* Partial slot of tile t's segment in block b: 2 b for the segment that
 * holds the block's first unit, 2 b + 1 for its last. */
static __device__ __forceinline__ int tma_slot(const tma_work_t &w, int b,
                                               int t)
{
    return 2 * b + (tma_start(w, b) / w.kt == t ? 0 : 1);
}

// ---------------------------------------------------------------------
// Kernel

template <int NT, typename OUT, int PER_SM>
static __global__ void __launch_bounds__(TMA_THREADS, PER_SM)
gemv_tma_kernel(const __grid_constant__ CUtensorMap map_w,
                const __grid_constant__ CUtensorMap map_x, tma_work_t wk,
                int n_tok, int n_out, OUT *y, bool accumulate, float *part,
                int *cnt)
{
    typedef tma_cfg<NT, PER_SM> C;
    constexpr int N = C::N, STAGES = C::STAGES;
    extern __shared__ __align__(1024) unsigned char tma_sm[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ int last;
    const uint32_t sm0 = mbar_smem(tma_sm);
    unsigned char *ring = tma_sm + ((1024 - (sm0 & 1023)) & 1023);
    const int b = blockIdx.x;
    const long long u0 = tma_start(wk, b), u1 = tma_start(wk, b + 1);
    const int wg = threadIdx.x >> 7;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer: one thread walks the block's units.  The weight
         * tiles of the first stages go out before the PDL wait. */
        if (threadIdx.x == 0) {
            const int pre = (int)min((long long)STAGES, u1 - u0);
            const uint64_t pw = tma_policy(false), px = tma_policy(true);
            wg_tma_prefetch(&map_w);
            wg_tma_prefetch(&map_x);
            for (int i = 0; i < pre; i++) {
                const long long u = u0 + i;
                mbar_expect(&full[i], C::STAGE);
                tma_load(ring + i * C::STAGE, &map_w,
                         (int)(u % wk.kt) * TMA_BK,
                         (int)(u / wk.kt) * TMA_BM, &full[i], pw);
            }
            kern_pdl_wait();
            kern_pdl_trigger(); /* as the consumers: the next kernel may
                                   launch once every block is past its
                                   wait, not when this thread is done */
            for (int i = 0; i < pre; i++)
                tma_load(ring + i * C::STAGE + C::W_BYTES, &map_x,
                         (int)((u0 + i) % wk.kt) * TMA_BK, 0, &full[i], px);
            for (long long it = pre; u0 + it < u1; it++) {
                const long long u = u0 + it;
                const int s = (int)(it % STAGES);
                const uint32_t ph = (uint32_t)(it / STAGES) & 1;
                unsigned char *st = ring + s * C::STAGE;
                mbar_wait(&empty[s], ph ^ 1);
                mbar_expect(&full[s], C::STAGE);
                tma_load(st, &map_w, (int)(u % wk.kt) * TMA_BK,
                         (int)(u / wk.kt) * TMA_BM, &full[s], pw);
                tma_load(st + C::W_BYTES, &map_x, (int)(u % wk.kt) * TMA_BK,
                         0, &full[s], px);
            }
        } else {
            kern_pdl_trigger();
        }
        return;
    }

    /* Consumers.  Warp w (0..3) of warpgroup cw holds rows
     * 64 cw + 16 w + g (+ 8) of the tile, tokens 8 j + 2 q (+ 1). */
    kern_pdl_wait();
    kern_pdl_trigger();
    const int cw = wg - 1, ctid = threadIdx.x - 128;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2, q = lane & 3;
    long long it = 0;
    float c[NT][4];

    for (long long u = u0; u < u1;) {
        const int tile = (int)(u / wk.kt);
        const long long seg_end = min(u1, (long long)(tile + 1) * wk.kt);
        const bool whole = u == (long long)tile * wk.kt &&
                           seg_end == (long long)(tile + 1) * wk.kt;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                c[j][e] = 0.0f;
        for (const long long seg0 = it; u < seg_end; u++, it++) {
            const int s = (int)(it % STAGES);
            const uint32_t ph = (uint32_t)(it / STAGES) & 1;
            const uint32_t a0 = mbar_smem(ring + s * C::STAGE) +
                                cw * 64 * TMA_BK * 2;
            const uint32_t b0 = mbar_smem(ring + s * C::STAGE + C::W_BYTES);
            mbar_wait(&full[s], ph);
            wg_fence_acc<NT>(c);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < TMA_BK / 16; kk++)
                wg_mma<NT>::run(c, wg_desc(a0 + 32 * kk),
                                wg_desc(b0 + 32 * kk));
            wg_commit();
            wg_wait<1>(); /* the previous stage's products are done */
            wg_fence_acc<NT>(c);
            if (it > seg0 && lane == 0)
                mbar_arrive(&empty[(it - 1) % STAGES]);
        }
        wg_wait<0>();
        wg_fence_acc<NT>(c);
        if (lane == 0)
            mbar_arrive(&empty[(it - 1) % STAGES]);

        const int rbase = cw * 64 + warp * 16 + g;
        /* accumulator c[j][e]: token ftok(j, e), row frow(e) of the tile;
         * pidx: its float in a partial tile (N x BM, token major) */
        auto ftok = [&](int j, int e) { return 8 * j + 2 * q + (e & 1); };
        auto frow = [&](int e) { return rbase + (e & 2 ? 8 : 0); };
        auto pidx = [&](int j, int e) { return ftok(j, e) * TMA_BM + frow(e); };
        const int bf = whole ? b : tma_block_of(wk, (long long)tile * wk.kt);
        const int n_seg = whole ? 1
                        : tma_block_of(wk, (long long)(tile + 1) * wk.kt - 1) -
                              bf + 1;
        /* y from the registers (a whole tile, or an owner's sum) */
        auto write_direct = [&]() {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = tile * TMA_BM + frow(e);
                    const int tok = ftok(j, e);
                    if (row < n_out && tok < n_tok) {
                        OUT *d = y + (size_t)tok * n_out + row;
                        float v = c[j][e];
                        if (accumulate)
                            v += kern_to_f(*d);
                        *d = kern_from_f<OUT>(v);
                    }
                }
        };
        if (n_seg == 1) {
            write_direct();
            continue;
        }
        if (wk.owner && b == bf) {
            /* Owner (BT_TMA_EPI=owner): the tile's first block computes
             * its segment last (the tile starts inside its range, the
             * others' segments open theirs), so it waits for the other
             * n_seg - 1 counts, adds their partials to its registers in
             * block order and writes y: no partial of its own, no
             * atomic on the critical path.  Needs every block resident
             * at once (one or two per SM, grid <= their count). */
            if (ctid == 0) {
                volatile int *vc = cnt + tile;
                while (*vc < n_seg - 1)
                    __nanosleep(64);
            }
            tma_consumers_sync();
            __threadfence();
            for (int k = 1; k < n_seg; k++) {
                const float *pk =
                    part + (size_t)tma_slot(wk, bf + k, tile) * N * TMA_BM;
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (ftok(j, e) < n_tok)
                            c[j][e] += __ldcg(pk + pidx(j, e));
            }
            write_direct();
            if (ctid == 0)
                cnt[tile] = 0;
            continue;
        }

        /* Split tile: this segment's partial (N x BM f32) to its slot. */
        float *pb = part + (size_t)tma_slot(wk, b, tile) * N * TMA_BM;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (ftok(j, e) < n_tok)
                    pb[pidx(j, e)] = c[j][e];
        __threadfence();
        tma_consumers_sync();
        if (wk.owner) { /* the owner adds it (its slot is 2 b: a first
                           segment) */
            if (ctid == 0)
                atomicAdd(&cnt[tile], 1);
            continue;
        }
        if (ctid == 0)
            last = atomicAdd(&cnt[tile], 1) == n_seg - 1;
        tma_consumers_sync();
        if (!last)
            continue;
        __threadfence();
        /* Thread ctid adds float4 number ctid + 256 j (j < NT: N x BM
         * floats in all) of every partial; the NT loads of a partial,
         * and two partials, are in flight together. */
        float4 acc[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        /* two partials in flight, except where registers are short (128
         * tokens; 64 with two blocks an SM) */
        constexpr int KU = NT >= 16 || (PER_SM == 2 && NT >= 8) ? 1 : 2;
#pragma unroll KU
        for (int k = 0; k < n_seg; k++) {
            const float4 *pk = reinterpret_cast<const float4 *>(
                part + (size_t)tma_slot(wk, bf + k, tile) * N * TMA_BM);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int i4 = ctid + 256 * j;
                if (i4 * 4 / TMA_BM < n_tok) {
                    const float4 p = __ldcg(pk + i4);
                    acc[j].x += p.x;
                    acc[j].y += p.y;
                    acc[j].z += p.z;
                    acc[j].w += p.w;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int i = 4 * (ctid + 256 * j);
            const int tok = i / TMA_BM, r = i - tok * TMA_BM;
            const float v[4] = {acc[j].x, acc[j].y, acc[j].z, acc[j].w};
            if (tok < n_tok)
                kern_put_rows4(y, n_out, tok, tile * TMA_BM + r, v,
                               accumulate);
        }
        if (ctid == 0)
            cnt[tile] = 0;
    }
}

// ---------------------------------------------------------------------
// Host side

/* Map of a row-major bf16 matrix (rows, cols) read in boxes of
 * box_rows x TMA_BK, 128-byte swizzled, zeros outside. */
static bool tma_map(CUtensorMap *m, const void *p, int rows, int cols,
                    int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = wg_tensor_map_encoder();
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {TMA_BK, (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};

    if (fn == NULL || ((uintptr_t)p & 15) != 0)
        return false;
    return fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(p),
              dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The A/B switches of the file header, read once. */
typedef struct {
    bool no_split;   /* BT_TMA_SPLIT=0 */
    bool owner;      /* BT_TMA_EPI=owner */
    bool two_per_sm; /* BT_TMA_PER_SM=2 */
} tma_env_t;

static const tma_env_t *tma_env(void)
{
    static tma_env_t env;
    static bool read;

    if (!read) {
        const char *e;

        env.no_split = (e = getenv("BT_TMA_SPLIT")) && strcmp(e, "0") == 0;
        env.owner = (e = getenv("BT_TMA_EPI")) && strcmp(e, "owner") == 0;
        env.two_per_sm = (e = getenv("BT_TMA_PER_SM")) && strcmp(e, "2") == 0;
        read = true;
    }
    return &env;
}

bool cuda_gemv_tma_ok(int n_tok, int n_out, int n_in)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_WG_MAX_TOK && n_out >= 1 &&
           n_in >= TMA_BK && n_in % TMA_BK == 0 && cuda_wgmma_available() &&
           wg_tensor_map_encoder() != NULL;
}

template <int NT, typename OUT, int PER_SM>
static cudaError_t tma_launch_t(int n_tok, int n_out, int n_in,
                                const bf16_t *x, const bf16_t *w, OUT *y,
                                bool acc, const cuda_gemv_ws_t *ws,
                                cudaStream_t st)
{
    static uint64_t attr_done; /* bit per device */
    typedef tma_cfg<NT, PER_SM> C;
    auto k = gemv_tma_kernel<NT, OUT, PER_SM>;
    const int n_sm = kern_sm_count() * PER_SM; /* block slots */
    CUtensorMap mw, mx;
    tma_work_t wk;
    cudaError_t err = kern_smem_limit_once(k, C::BYTES, &attr_done);

    if (err != cudaSuccess)
        return err;
    if (n_sm <= 0 || !tma_map(&mw, w, n_out, n_in, TMA_BM) ||
        !tma_map(&mx, x, n_tok, n_in, C::N))
        return cudaErrorInvalidValue;
    wk.tiles = (int)BT_DIV_UP(n_out, TMA_BM);
    wk.kt = n_in / TMA_BK;
    const long long units = (long long)wk.tiles * wk.kt;
    const long long g_split =
        BT_MAX(1LL, BT_MIN((long long)n_sm, units / TMA_MIN_UNITS));
    wk.split = !tma_env()->no_split && ws != NULL && ws->d_part != NULL &&
               ws->d_cnt != NULL &&
               wk.tiles <= ws->n_cnt &&
               (size_t)2 * g_split * C::N * TMA_BM * sizeof(float) <=
                   ws->part_bytes;
    wk.blocks = wk.split ? (int)g_split : BT_MIN(n_sm, wk.tiles);
    wk.owner = wk.split && tma_env()->owner;
    kern_launch(k, dim3((unsigned)wk.blocks), dim3(TMA_THREADS), C::BYTES,
                st, mw, mx, wk, n_tok, n_out, y, acc,
                wk.split ? ws->d_part : (float *)NULL,
                wk.split ? ws->d_cnt : (int *)NULL);
    return cudaSuccess;
}

cudaError_t cuda_gemv_tma(int n_tok, int n_out, int n_in, const void *d_x,
                          const void *d_w, void *d_y, cuda_dtype_t out_dt,
                          bool accumulate, const cuda_gemv_ws_t *ws,
                          cudaStream_t stream)
{
    const bf16_t *x = (const bf16_t *)d_x, *w = (const bf16_t *)d_w;
    cudaError_t err = cudaErrorInvalidValue;

#define TMA_CASE(NT, PER_SM)                                                \
    KERN_DISPATCH_DT(out_dt, OUT, (err = tma_launch_t<NT, OUT, PER_SM>(     \
        n_tok, n_out, n_in, x, w, (OUT *)d_y, accumulate, ws, stream)))
    const int nt = kern_tok_tiles(n_tok);
    if (tma_env()->two_per_sm && nt <= 8) { /* registers: <= 64 tokens */
        switch (nt) {
        case 1: TMA_CASE(1, 2); break;
        case 2: TMA_CASE(2, 2); break;
        case 4: TMA_CASE(4, 2); break;
        default: TMA_CASE(8, 2); break;
        }
    } else {
        switch (nt) {
        case 1: TMA_CASE(1, 1); break;
        case 2: TMA_CASE(2, 1); break;
        case 4: TMA_CASE(4, 1); break;
        case 8: TMA_CASE(8, 1); break;
        default: TMA_CASE(16, 1); break;
        }
    }
#undef TMA_CASE
    return err;
}

cudaError_t cuda_gemv_tma_prepare(void)
{
    cudaError_t err = cudaSuccess;

    if (!cuda_wgmma_available())
        return cudaSuccess;
#define TMA_ATTR(NT, OUT, PER_SM)                                           \
    if (err == cudaSuccess)                                                 \
        err = cudaFuncSetAttribute(gemv_tma_kernel<NT, OUT, PER_SM>,        \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)tma_cfg<NT, PER_SM>::BYTES)
#define TMA_ATTRS(OUT)                                                      \
    TMA_ATTR(1, OUT, 1);                                                    \
    TMA_ATTR(2, OUT, 1);                                                    \
    TMA_ATTR(4, OUT, 1);                                                    \
    TMA_ATTR(8, OUT, 1);                                                    \
    TMA_ATTR(16, OUT, 1);                                                   \
    TMA_ATTR(1, OUT, 2);                                                    \
    TMA_ATTR(2, OUT, 2);                                                    \
    TMA_ATTR(4, OUT, 2);                                                    \
    TMA_ATTR(8, OUT, 2)
    TMA_ATTRS(float);
    TMA_ATTRS(bf16_t);
#undef TMA_ATTRS
#undef TMA_ATTR
    return err;
}
