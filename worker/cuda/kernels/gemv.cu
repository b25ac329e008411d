/*
 * gemv.cu - skinny bf16 GEMMs y (t, o) [+]= x (t, i) . w (o, i)^T for
 * decode steps: bf16 x and w, f32 accumulation, y bf16 or f32.  The
 * variants (gemv.h) and why each exists:
 * - rows / rows8: one warp per output row; lanes walk the row in 16-byte
 *   chunks (8 bf16), 4 (8) chunks per lane loaded ahead of the ones being
 *   multiplied (software pipeline), x chunks from L1; a warp-shuffle sum per
 *   token.  Many short-lived warps: ramp-up and tail cost on 30-50 MB
 *   matrices.
 * - stream: fixed grid of 2 blocks/SM, registers only (round 2, slower).
 * - ring / bulk: persistent (one 8-warp block per SM), each warp streams
 *   its contiguous share of the block's rows through a private ring of
 *   4 KB shared-memory stages, so up to ~200 KB per SM is in flight from
 *   the first instruction (the first stages are issued before the PDL
 *   wait) without spending registers on it.
 * - mma1 / mma2: the ring on tensor cores for 1..64 tokens (see the kernel).
 * - tc: a skinny tensor-core GEMM for 1..64 tokens in gemv_tc.cu.
 * Every kernel is launched with programmatic dependent launch
 * (kern_launch): the first weight loads are issued before kern_pdl_wait().
 * Test: build-DIR/gpu/test_gemm (every variant against the CPU reference);
 * timing: build-DIR/gpu/bench_kernels.
 */
#include "gemv.h"

#include "bt_util.h"
#include "../cuda_switches.h"
#include "kern_common.cuh"
#include "tc_common.cuh"

#define GEMV_WARPS 8
/* Where the rows kernel triggers its dependents (PDL). */
#define GEMV_TRIG_AFTER_WAIT 0
#define GEMV_TRIG_EARLY 1
#define GEMV_TRIG_LATE 2
#define GEMV_UNROLL 4

/* Multiply-adds one 8-element weight chunk into the T accumulators. */
template <int T, bool SMEM_X = false>
static __device__ __forceinline__ void gemv_chunk(const uint4 &wv,
                                                  const bf16_t *x, int n_in,
                                                  int c, float *acc)
{
    float wf[8];
    const bf16_t *we = reinterpret_cast<const bf16_t *>(&wv);
#pragma unroll
    for (int e = 0; e < 8; e++)
        wf[e] = __bfloat162float(we[e]);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xp =
            reinterpret_cast<const uint4 *>(x + (size_t)t * n_in) + c;
        uint4 xv = SMEM_X ? *xp : __ldg(xp);
        const bf16_t *xe = reinterpret_cast<const bf16_t *>(&xv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[t] += wf[e] * __bfloat162float(xe[e]);
    }
}

/* Issues an L2 prefetch of `bytes` (a multiple of 16) at p (16-byte
 * aligned) through the bulk-copy engine: no registers, no completion to
 * wait for; the lines land in L2 while the issuing warp does other work.
 * Pieces of at most 32 KB. */
static __device__ __forceinline__ void gemv_prefetch_l2(const void *p,
                                                        int bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char *c = reinterpret_cast<const char *>(p);
    for (int off = 0; off < bytes; off += 32768) {
        int n = min(32768, bytes - off);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                     :: "l"(c + off), "r"(n) : "memory");
    }
#endif
}

/* Chunks of the norm weights g a thread loads before the PDL wait
 * (gemv_norm_gpre): the first GEMV_NORM_GPRE of its chunks in
 * gemv_norm_stage's order, so the staging's second pass waits on no
 * DRAM load (round 13 took the same load off rmsnorm.cu's path). */
#define GEMV_NORM_GPRE 2

static __device__ __forceinline__ void gemv_norm_gpre(
    int n_in, const bf16_t *g, uint4 (&gpre)[GEMV_NORM_GPRE])
{
#pragma unroll
    for (int k = 0; k < GEMV_NORM_GPRE; k++) {
        const int i = (threadIdx.x + k * blockDim.x) * 8;
        gpre[k] = i < n_in ? __ldg(reinterpret_cast<const uint4 *>(g + i))
                           : make_uint4(0, 0, 0, 0);
    }
}

/* Stages the RMSNorm of the f32 rows xf (T, n_in) into xs (T, n_in) bf16:
 * xs = bf16(g * (x * 1 / sqrtf(mean(x^2) + eps))), the arithmetic of
 * cuda_rmsnorm() (no add); gpre: g's first chunks (gemv_norm_gpre).  The
 * x chunks of those first GEMV_NORM_GPRE rounds stay in registers from
 * the sum of squares to the scaling at one token (n_in <= 4096 at 256
 * threads: all of them), so the scaling waits on no second load of x:
 * one L2 round trip on the path from the PDL wait to the first product
 * (keep false, never passed now: both passes load x, as before round
 * 16).
 * n_in % 8 == 0; whole block; ends with __syncthreads(). */
template <int T>
static __device__ __forceinline__ void gemv_norm_stage(
    int n_in, const float *xf, const bf16_t *g, float eps, bf16_t *xs,
    float *red, const uint4 (&gpre)[GEMV_NORM_GPRE], bool keep)
{
    /* keep: honoured at one token only (at two the registers spill) */
    constexpr bool CAN_KEEP = T == 1;

#pragma unroll 1
    for (int t = 0; t < T; t++) {
        const float *xr = xf + (size_t)t * n_in;
        float xk[GEMV_NORM_GPRE][8];
        float ss = 0.0f;
        auto sq = [&](const float (&v)[8]) {
            ss += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
            ss += v[4] * v[4] + v[5] * v[5] + v[6] * v[6] + v[7] * v[7];
        };
        auto load = [&](int i, float (&v)[8]) {
            float4 a = *reinterpret_cast<const float4 *>(xr + i);
            float4 b = *reinterpret_cast<const float4 *>(xr + i + 4);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        };
        if (CAN_KEEP) {
#pragma unroll
            for (int k = 0; k < GEMV_NORM_GPRE; k++) {
                const int i = (threadIdx.x + k * blockDim.x) * 8;
                if (i < n_in)
                    load(i, xk[k]);
            }
#pragma unroll
            for (int k = 0; k < GEMV_NORM_GPRE; k++) {
                const int i = (threadIdx.x + k * blockDim.x) * 8;
                if (i < n_in)
                    sq(xk[k]);
            }
        }
        const int kept = CAN_KEEP ? GEMV_NORM_GPRE : 0;
        for (int i = (threadIdx.x + kept * blockDim.x) * 8; i < n_in;
             i += blockDim.x * 8) {
            float v[8];
            load(i, v);
            sq(v);
        }
        ss = kern_block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / (float)n_in + eps);
        auto put = [&](int i, const uint4 &gv, const float (&xv)[8]) {
            const bf16_t *ge = reinterpret_cast<const bf16_t *>(&gv);
            uint4 o;
            bf16_t *oe = reinterpret_cast<bf16_t *>(&o);
#pragma unroll
            for (int e = 0; e < 8; e++)
                oe[e] = __float2bfloat16_rn(__bfloat162float(ge[e]) *
                                            (inv * xv[e]));
            *reinterpret_cast<uint4 *>(xs + (size_t)t * n_in + i) = o;
        };
#pragma unroll
        for (int k = 0; k < GEMV_NORM_GPRE; k++) {
            const int i = (threadIdx.x + k * blockDim.x) * 8;
            if (i < n_in) {
                if (!CAN_KEEP || !keep) /* the second load (round 15) */
                    load(i, xk[k]);
                put(i, gpre[k], xk[k]);
            }
        }
        for (int i = (threadIdx.x + GEMV_NORM_GPRE * blockDim.x) * 8;
             i < n_in; i += blockDim.x * 8) {
            float v[8];
            load(i, v);
            put(i, *reinterpret_cast<const uint4 *>(g + i), v);
        }
    }
    __syncthreads();
}

/* Software-pipelined: the next U chunks of the row are loaded
 * while the current ones are multiplied, so each lane keeps up to 2 x U x
 * 16 bytes in flight.  Everything before kern_pdl_wait() touches weights
 * only (they never depend on the previous kernel), so with programmatic
 * dependent launch it overlaps the kernels before this one:
 * - blocks [0, pf_blocks) (the first wave) prefetch the first pf_bytes of
 *   their rows into L2 with one bulk prefetch per warp (gemv_prefetch_l2;
 *   lost its A/B, so launched with pf_bytes 0: gemv_rows_launch);
 * - every warp loads its first U chunks.
 * kern_pdl_trigger() comes at entry (GEMV_TRIG_EARLY, the default in
 * late-trigger steps: gemv_trigger), after the wait (GEMV_TRIG_AFTER_WAIT,
 * other steps: the next kernel launches only once this one is past its
 * wait, so at most one GEMV ahead prefetches) or once the warp has issued
 * its last loads (GEMV_TRIG_LATE: lost its A/B, no longer passed).
 * NORM: x is the RMSNorm of the f32 rows xf with weights g (cuda_gemv_norm),
 * staged per block into shared memory (T x n_in bf16, dynamic).
 * GLU (cuda_gemv_norm_glu): w is a fused gate|up matrix (2 n_out, n_in),
 * y[t, j] = silu(g) * u of gate row j's and up row n_out + j's sums, each
 * rounded to OUT first, as the unfused GEMV then swiglu.cu (the same lanes
 * sum the same chunks of each row: the same bits).  GEMV_GLU_WARP: one
 * warp streams both rows; GEMV_GLU_PAIR: warps 2i and 2i + 1 of a block
 * take the gate and the up row of one pair (the unfused kernel's rows a
 * warp and waves) and meet in shared memory at the end. */
#define GEMV_GLU_OFF 0
#define GEMV_GLU_WARP 1
#define GEMV_GLU_PAIR 2
template <int T, typename OUT, int U = GEMV_UNROLL, bool NORM = false,
          int GLU = GEMV_GLU_OFF>
static __global__ void __launch_bounds__(GEMV_WARPS * 32,
                                         U > 4 ? 2 : (T <= 2 ? 4 : 2))
gemv_kernel(int n_out, int n_in, const bf16_t *x, const float *xf,
            const bf16_t *g, float eps, const bf16_t *w, OUT *y,
            bool accumulate, int pf_bytes, int pf_blocks, int trig,
            int rpw, bool norm_keep)
{
    extern __shared__ __align__(16) unsigned char gemv_sm[];
    __shared__ float red[32];
    __shared__ float sh_pair[GEMV_WARPS][T]; /* GEMV_GLU_PAIR's row sums */
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    /* This warp's rows [row0, row0 + nrows): one stream of n_tot chunks
     * (rpw > 1 only when n_ch % (32 U) == 0, so a step of 32 U chunks
     * never straddles two rows). */
    const int pair = blockIdx.x * (GEMV_WARPS / 2) + (wib >> 1);
    const int row0 = GLU == GEMV_GLU_PAIR
                         ? (wib & 1 ? n_out : 0) + pair
                         : (blockIdx.x * GEMV_WARPS + wib) * rpw;
    const int nrows = GLU == GEMV_GLU_PAIR   ? (pair < n_out ? 1 : 0)
                      : GLU == GEMV_GLU_WARP ? (row0 < n_out ? 2 : 0)
                                             : max(0, min(rpw, n_out - row0));
    const int n_ch = n_in / 8;
    const int n_tot = nrows * n_ch;
    const uint4 *wr = reinterpret_cast<const uint4 *>(
        w + (size_t)(nrows > 0 ? row0 : 0) * n_in);
    /* GLU: the up row, chunks n_ch .. 2 n_ch - 1 of the stream */
    const uint4 *wu = reinterpret_cast<const uint4 *>(
        w + (size_t)(GLU == GEMV_GLU_WARP && nrows > 0 ? n_out + row0 : 0) *
                n_in);
    auto wp = [&](int c) {
        return GLU == GEMV_GLU_WARP && c >= n_ch ? wu + (c - n_ch) : wr + c;
    };
    float acc[T], gsum[T];
    uint4 cur[U];

    /* KPROF slots: 0 qkv (norm), 1 gate/up (norm + SwiGLU), 2 o, 3 down,
     * 4 other shapes (the classifier) */
    const int kslot = NORM && GLU == GEMV_GLU_OFF ? 0
                      : GLU != GEMV_GLU_OFF       ? 1
                      : n_in > 8192               ? 3
                      : n_out <= 8192             ? 2
                                                  : 4;
    (void)kslot;
    KPROF(kslot, 0);
    if (trig == GEMV_TRIG_EARLY)
        kern_pdl_trigger();
    if (pf_bytes > 0 && (int)blockIdx.x < pf_blocks && lane == 0 &&
        nrows > 0) {
        if (GLU == GEMV_GLU_WARP) {
            gemv_prefetch_l2(wr, min(pf_bytes / 2, n_ch * 16) & ~15);
            gemv_prefetch_l2(wu, min(pf_bytes / 2, n_ch * 16) & ~15);
        } else {
            gemv_prefetch_l2(wr, min(pf_bytes, n_tot * 16));
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = lane + 32 * u;
        cur[u] = c < n_tot ? __ldcs(wp(c)) : make_uint4(0, 0, 0, 0);
    }
    uint4 gpre[GEMV_NORM_GPRE];
    if (NORM)
        gemv_norm_gpre(n_in, g, gpre);
    kern_pdl_wait();
    KPROF(kslot, 1);
    if (trig == GEMV_TRIG_AFTER_WAIT)
        kern_pdl_trigger();
    if (NORM) {
        bf16_t *xs = reinterpret_cast<bf16_t *>(gemv_sm);
        gemv_norm_stage<T>(n_in, xf, g, eps, xs, red, gpre, norm_keep);
        x = xs;
    }
    KPROF(kslot, 2);
    if (nrows == 0 && GLU != GEMV_GLU_PAIR)
        return; /* (PAIR: every warp meets the others at the end) */
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;

    /* Warp-sums the row sums of row0 + r into y (GLU: keeps the gate's,
     * then writes silu(gate) * up). */
    /* token `lane`'s entry of a per-token array (static indices only,
     * so the array stays in registers) */
    auto lane_of = [&](const float *v) {
        float o = 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t == lane)
                o = v[t];
        return o;
    };
    /* y[lane][col] = silu(gate) * up, each sum rounded to OUT first */
    auto put_glu = [&](float gv, float uv, int col) {
        gv = kern_to_f(kern_from_f<OUT>(gv));
        uv = kern_to_f(kern_from_f<OUT>(uv));
        y[(size_t)lane * n_out + col] =
            kern_from_f<OUT>(kern_swiglu_f(gv, uv));
    };
    auto flush = [&](int r) {
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[t] = kern_warp_sum(acc[t]);
        if (GLU == GEMV_GLU_PAIR) {
            if (lane < T)
                sh_pair[wib][lane] = lane_of(acc);
            __syncthreads();
            if ((wib & 1) == 0 && lane < T && pair < n_out)
                put_glu(sh_pair[wib][lane], sh_pair[wib + 1][lane], pair);
            return;
        }
        if (GLU == GEMV_GLU_WARP && r == 0) {
#pragma unroll
            for (int t = 0; t < T; t++) {
                gsum[t] = acc[t];
                acc[t] = 0.0f;
            }
            return;
        }
        if (GLU == GEMV_GLU_WARP && lane < T) {
            put_glu(lane_of(gsum), lane_of(acc), row0);
        } else if (GLU == GEMV_GLU_OFF && lane < T) {
            float v = lane_of(acc);
            OUT *dst = y + (size_t)lane * n_out + row0 + r;
            if (accumulate)
                v += kern_to_f(*dst);
            *dst = kern_from_f<OUT>(v);
        }
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[t] = 0.0f;
    };
    int crow = 0;
    for (int c0 = lane; c0 < n_tot; c0 += 32 * U) {
        uint4 nxt[U];
        const int c1 = c0 + 32 * U;
        const int r = rpw > 1 || GLU == GEMV_GLU_WARP ? (c0 - lane) / n_ch
                                                      : 0;
        const int cb = c0 - r * n_ch; /* chunk index within the row */
#pragma unroll
        for (int u = 0; u < U; u++)
            nxt[u] = c1 + 32 * u < n_tot ? __ldcs(wp(c1 + 32 * u))
                                         : make_uint4(0, 0, 0, 0);
        if (r != crow) {
            flush(crow);
            crow = r;
        }
        if (cb + 32 * (U - 1) < n_ch) {
#pragma unroll
            for (int u = 0; u < U; u++)
                gemv_chunk<T, NORM>(cur[u], x, n_in, cb + 32 * u, acc);
        } else {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (cb + 32 * u < n_ch)
                    gemv_chunk<T, NORM>(cur[u], x, n_in, cb + 32 * u, acc);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            cur[u] = nxt[u];
    }
    KPROF(kslot, 3);
    if (trig == GEMV_TRIG_LATE)
        kern_pdl_trigger();
    flush(crow);
    KPROF(kslot, 4);
}

/* Streaming GEMV for n_in % 256 == 0: a fixed grid of two 8-warp blocks
 * per multiprocessor (all resident at once: no tail wave).  With W warps,
 * warp w takes rows w, w + W, w + 2W, ... (W chosen so every warp has the
 * same number of rows, to within one), so at any moment the GPU reads one
 * compact window of the matrix (TLB- and DRAM-friendly).  A warp reads its
 * rows as one stream of "lines" (32 lanes x 16 bytes; a row is n_in / 256
 * lines), double-buffered GEMV_LINES at a time across row boundaries, so
 * 8 to 16 lines per warp are in flight from the first load to the last;
 * the first lines load before kern_pdl_wait().  A tuner candidate
 * ("stream"), and the fused norm's kernel where the ring kernel does not
 * take the shape under BT_GEMV_NORM=ring. */
#define GEMV_LINES 8
#define GEMV_STREAM_BLOCKS_PER_SM 2

template <int T, typename OUT, bool NORM>
static __global__ void __launch_bounds__(GEMV_WARPS * 32,
                                         GEMV_STREAM_BLOCKS_PER_SM)
gemv_stream_kernel(int n_out, int n_in, int n_warps, const bf16_t *x,
                   const float *xf, const bf16_t *g, float eps,
                   const bf16_t *w, OUT *y, bool accumulate)
{
    extern __shared__ __align__(16) unsigned char gemv_sm[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int lpr = n_in / 256;       /* lines per row */
    const size_t rs = (size_t)n_in / 8; /* 16-byte chunks per row */
    const int n_rows = gw < n_out ? (n_out - gw + n_warps - 1) / n_warps : 0;
    const int n_lines = n_rows * lpr;
    const uint4 *wb = reinterpret_cast<const uint4 *>(w) + lane;
    int lrow = gw, lc = 0; /* next line to load */
    uint4 cur[GEMV_LINES], nxt[GEMV_LINES];
    float acc[T];

    kern_pdl_trigger();
#pragma unroll
    for (int u = 0; u < GEMV_LINES; u++) {
        cur[u] = make_uint4(0, 0, 0, 0);
        if (u < n_lines) {
            cur[u] = __ldcs(wb + (size_t)lrow * rs + lc * 32);
            if (++lc == lpr) {
                lc = 0;
                lrow += n_warps;
            }
        }
    }
    kern_pdl_wait();
    if (NORM) {
        /* The RMSNorm of cuda_rmsnorm(), once per block, into shared
         * memory: xs = bf16(g * (x * 1 / sqrtf(mean(x^2) + eps))). */
        bf16_t *xs = reinterpret_cast<bf16_t *>(gemv_sm);
        for (int t = 0; t < T; t++) {
            const float *xr = xf + (size_t)t * n_in;
            float ss = 0.0f;
            for (int i = threadIdx.x; i < n_in; i += blockDim.x)
                ss += xr[i] * xr[i];
            ss = kern_block_sum(ss, red);
            const float inv = 1.0f / sqrtf(ss / (float)n_in + eps);
            for (int i = threadIdx.x; i < n_in; i += blockDim.x)
                xs[(size_t)t * n_in + i] = __float2bfloat16_rn(
                    __bfloat162float(g[i]) * (inv * xr[i]));
        }
        __syncthreads();
        x = xs;
    }
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    int crow = gw, cc = 0; /* line being multiplied */
    for (int i0 = 0; i0 < n_lines; i0 += GEMV_LINES) {
#pragma unroll
        for (int u = 0; u < GEMV_LINES; u++) {
            nxt[u] = make_uint4(0, 0, 0, 0);
            if (i0 + GEMV_LINES + u < n_lines) {
                nxt[u] = __ldcs(wb + (size_t)lrow * rs + lc * 32);
                if (++lc == lpr) {
                    lc = 0;
                    lrow += n_warps;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_LINES; u++) {
            if (i0 + u < n_lines) { /* warp-uniform */
                gemv_chunk<T, NORM>(cur[u], x, n_in, cc * 32 + lane, acc);
                if (++cc == lpr) {
#pragma unroll
                    for (int t = 0; t < T; t++)
                        acc[t] = kern_warp_sum(acc[t]);
                    if (lane < T) {
                        float r = 0.0f;
#pragma unroll
                        for (int t = 0; t < T; t++)
                            if (t == lane)
                                r = acc[t];
                        OUT *dst = y + (size_t)lane * n_out + crow;
                        if (accumulate)
                            r += kern_to_f(*dst);
                        *dst = kern_from_f<OUT>(r);
                    }
#pragma unroll
                    for (int t = 0; t < T; t++)
                        acc[t] = 0.0f;
                    cc = 0;
                    crow += n_warps;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_LINES; u++)
            cur[u] = nxt[u];
    }
}


// ---------------------------------------------------------------------
// Shared-memory ring kernels (ring, bulk, mma1, mma2)

#define RING_WARPS 8
#define RING_PIECE 4096                 /* bytes per warp per stage */
#define RING_LINES (RING_PIECE / 512)   /* 512 B = 32 lanes x 16 B */
#define RING_MAX_STAGES 8
#define RING_MIN_STAGES 2
#define RING_MAX_TOK 4
#define GEMV_SMEM_MAX (226 * 1024)     /* under sm_90's 227 KB opt-in */

static __device__ __forceinline__ uint32_t gemv_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* cp.async.wait_group with a run-time count (0..7). */
static __device__ __forceinline__ void gemv_cp_wait(int n)
{
    switch (n) {
    case 0: tc_cp_wait<0>(); break;
    case 1: tc_cp_wait<1>(); break;
    case 2: tc_cp_wait<2>(); break;
    case 3: tc_cp_wait<3>(); break;
    case 4: tc_cp_wait<4>(); break;
    case 5: tc_cp_wait<5>(); break;
    case 6: tc_cp_wait<6>(); break;
    default: tc_cp_wait<7>(); break;
    }
}

/* mbarrier + bulk copy (sm_90): one thread arms the barrier with the
 * byte count and issues the copy; the warp waits on the phase parity. */
static __device__ __forceinline__ void gemv_mbar_init(uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                 :: "r"(gemv_smem_u32(bar)) : "memory");
#endif
}

static __device__ __forceinline__ void gemv_mbar_init_fence(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

static __device__ __forceinline__ void gemv_bulk_load(void *dst,
                                                      const void *src,
                                                      uint32_t bytes,
                                                      uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(gemv_smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes [%0], [%1], %2, [%3];"
                 :: "r"(gemv_smem_u32(dst)), "l"(src), "r"(bytes),
                    "r"(gemv_smem_u32(bar)) : "memory");
#endif
}

static __device__ __forceinline__ void gemv_mbar_wait(uint64_t *bar,
                                                      uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                     "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(gemv_smem_u32(bar)), "r"(parity)
                     : "memory");
#endif
}

/* Stages x (or the fused RMSNorm of xf) into xs (T, n_in) bf16; rows
 * n_tok..T-1 are zero.  Whole block; ends with __syncthreads(). */
template <int T, bool NORM>
static __device__ __forceinline__ void gemv_stage_x(
    int n_tok, int n_in, const bf16_t *x, const float *xf, const bf16_t *g,
    float eps, bf16_t *xs, float *red)
{
    for (int t = 0; t < T; t++) {
        bf16_t *dst = xs + (size_t)t * n_in;
        if (t >= n_tok) {
            for (int i = threadIdx.x * 8; i < n_in; i += blockDim.x * 8)
                *reinterpret_cast<uint4 *>(dst + i) = make_uint4(0, 0, 0, 0);
        } else if (NORM) {
            /* As cuda_rmsnorm() (no add): bf16(g * (x * 1/rms)). */
            const float *xr = xf + (size_t)t * n_in;
            float ss = 0.0f;
            for (int i = threadIdx.x; i < n_in; i += blockDim.x)
                ss += xr[i] * xr[i];
            ss = kern_block_sum(ss, red);
            const float inv = 1.0f / sqrtf(ss / (float)n_in + eps);
            for (int i = threadIdx.x; i < n_in; i += blockDim.x)
                dst[i] = __float2bfloat16_rn(__bfloat162float(g[i]) *
                                             (inv * xr[i]));
        } else {
            const bf16_t *src = x + (size_t)t * n_in;
            for (int i = threadIdx.x * 8; i < n_in; i += blockDim.x * 8)
                *reinterpret_cast<uint4 *>(dst + i) =
                    *reinterpret_cast<const uint4 *>(src + i);
        }
    }
    __syncthreads();
}

/* ring / bulk: one block of RING_WARPS warps per SM takes the rows
 * [r0, r1) (balanced to within one row).  Seen as "lines" of 256 weights
 * (n_in % 256 == 0, so a line never crosses a row), the block's rows are
 * one contiguous run of lines; warp w takes an equal contiguous share and
 * streams it through its own ring of n_stages 4 KB stages (8 lines each):
 * BULK issues one cp.async.bulk per stage completing on the stage's
 * mbarrier, else each lane copies its own 16 bytes of every line with
 * cp.async (and reads back only those, so no warp barrier is needed).
 * The first n_stages stages are issued before the PDL wait.  Row sums are
 * warp-reduced when the line run leaves a row and added into yacc (shared,
 * f32) with atomics, because the first and last row of a warp's share may
 * be shared with its neighbours; the block writes y at the end.
 * Dynamic shared memory: ring (RING_WARPS x n_stages x 4 KB), barriers
 * (RING_WARPS x n_stages x 8 B), xs (T x n_in bf16), yacc (T x rows). */
template <int T, typename OUT, bool NORM, bool BULK>
static __global__ void __launch_bounds__(RING_WARPS * 32, 1)
gemv_ring_kernel(int n_tok, int n_out, int n_in, int n_stages,
                 const bf16_t *x, const float *xf, const bf16_t *g,
                 float eps, const bf16_t *w, OUT *y, bool accumulate)
{
    extern __shared__ __align__(128) unsigned char gemv_sm[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r0 = (int)((long long)blockIdx.x * n_out / gridDim.x);
    const int r1 = (int)((long long)(blockIdx.x + 1) * n_out / gridDim.x);
    const int rows = r1 - r0;
    const int lpr = n_in >> 8;
    const long long n_lines = (long long)rows * lpr;
    const long long l0 = n_lines * warp / RING_WARPS;
    const int nl = (int)(n_lines * (warp + 1) / RING_WARPS - l0);
    const int np = (nl + RING_LINES - 1) / RING_LINES;
    const size_t ring_bytes = (size_t)RING_WARPS * n_stages * RING_PIECE;
    unsigned char *ring = gemv_sm + (size_t)warp * n_stages * RING_PIECE;
    uint64_t *bars = reinterpret_cast<uint64_t *>(gemv_sm + ring_bytes) +
                     (size_t)warp * n_stages;
    bf16_t *xs = reinterpret_cast<bf16_t *>(
        gemv_sm + ring_bytes + (size_t)RING_WARPS * n_stages * 8);
    float *yacc = reinterpret_cast<float *>(xs + (size_t)T * n_in);
    /* This warp's first weight: line l0 of the block's run. */
    const bf16_t *wl = w + (size_t)r0 * n_in + (size_t)l0 * 256;

    kern_pdl_trigger();
    if (BULK) {
        if (lane == 0) {
            for (int s = 0; s < n_stages; s++)
                gemv_mbar_init(&bars[s]);
            gemv_mbar_init_fence();
        }
        __syncwarp();
    }
    /* Issues piece p (lines p*8 .. of the warp's share) into its stage. */
    auto issue = [&](int p) {
        const int s = p % n_stages;
        const int cnt = min(RING_LINES, nl - p * RING_LINES);
        const bf16_t *src = wl + (size_t)p * RING_LINES * 256;
        unsigned char *dst = ring + (size_t)s * RING_PIECE;
        if (BULK) {
            if (lane == 0)
                gemv_bulk_load(dst, src, (uint32_t)cnt * 512, &bars[s]);
        } else {
#pragma unroll
            for (int j = 0; j < RING_LINES; j++)
                if (j < cnt)
                    tc_cp16(dst + j * 512 + lane * 16, src + j * 256 + lane * 8,
                            true);
        }
    };
    for (int p = 0; p < n_stages; p++) {
        if (p < np)
            issue(p);
        if (!BULK)
            tc_cp_commit();
    }
    kern_pdl_wait();
    gemv_stage_x<T, NORM>(n_tok, n_in, x, xf, g, eps, xs, red);
    for (int i = threadIdx.x; i < T * rows; i += blockDim.x)
        yacc[i] = 0.0f;
    __syncthreads();

    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    int crow = -1; /* row (block-relative) being summed */
    auto flush = [&]() {
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = kern_warp_sum(acc[t]);
            if (lane == 0 && t < n_tok)
                atomicAdd(&yacc[t * rows + crow], v);
            acc[t] = 0.0f;
        }
    };
    for (int p = 0; p < np; p++) {
        const int s = p % n_stages;
        const int cnt = min(RING_LINES, nl - p * RING_LINES);
        const long long gl = l0 + (long long)p * RING_LINES;
        int row = (int)(gl / lpr);
        int cl = (int)(gl - (long long)row * lpr);
        const uint4 *st = reinterpret_cast<const uint4 *>(
            ring + (size_t)s * RING_PIECE);

        if (BULK)
            gemv_mbar_wait(&bars[s], (uint32_t)((p / n_stages) & 1));
        else
            gemv_cp_wait(n_stages - 1);
#pragma unroll
        for (int j = 0; j < RING_LINES; j++) {
            if (j < cnt) { /* warp-uniform */
                if (row != crow) {
                    if (crow >= 0)
                        flush();
                    crow = row;
                }
                gemv_chunk<T, true>(st[j * 32 + lane], xs, n_in,
                                    cl * 32 + lane, acc);
                if (++cl == lpr) {
                    cl = 0;
                    row++;
                }
            }
        }
        if (p + n_stages < np) {
            if (BULK) {
                __syncwarp(); /* every lane has read stage s */
                if (lane == 0)
                    asm volatile("fence.proxy.async.shared::cta;"
                                 ::: "memory");
            }
            issue(p + n_stages);
        }
        if (!BULK)
            tc_cp_commit();
    }
    if (crow >= 0)
        flush();
    __syncthreads();
    for (int i = threadIdx.x; i < n_tok * rows; i += blockDim.x) {
        const int t = i / rows, r = i - t * rows;
        OUT *dst = y + (size_t)t * n_out + r0 + r;
        float v = yacc[i];
        if (accumulate)
            v += kern_to_f(*dst);
        *dst = kern_from_f<OUT>(v);
    }
}

/* mma1 / mma2 (tensor cores, 1..8*NT tokens): one block of RING_WARPS
 * warps per SM takes the row groups [g0, g1) (a group is MW m16 tiles =
 * 16 MW rows); for each group in turn the 8 warps split K (blocks of 32
 * columns) and each streams its (group, k-block) units through a private
 * cp.async ring of 4 KB stages.  Fragments without ldmatrix: lane (g, q)
 * (g = lane / 4, q = lane % 4) copies 16 bytes = columns 8q..8q+7 of a
 * 32-column block from row g and from row g + 8 and uses them as the A
 * registers of two m16n8k16 products (elements 0-3 for the first, 4-7 for
 * the second).  That assigns physical column 8q + j to logical k
 * {2q, 2q+1, 2q+8, 2q+9}[j % 4] of product j / 4, a permutation of K; the
 * B fragment under the same permutation is x[token g][8q .. 8q+7] of the
 * block, one 16-byte load, so the sum is unchanged.  Each lane reads back
 * only the bytes it copied (no warp barrier).  At the end of a group the
 * warps add their C fragments into a shared (tokens x rows) f32 buffer
 * with atomics, one __syncthreads, and the block writes y; two buffers
 * alternate so one barrier per group suffices.  Rows past n_out are
 * zero-filled; tokens past n_tok are zero and not written.  n_in % 32 == 0.
 * Dynamic shared memory: ring (RING_WARPS x n_stages x 4 KB) + 2 x 8 NT x
 * 16 MW floats. */
template <int NT, int MW, typename OUT>
static __global__ void __launch_bounds__(RING_WARPS * 32, 1)
gemv_mma_kernel(int n_tok, int n_out, int n_in, int n_stages,
                const bf16_t *x, const bf16_t *w, OUT *y, bool accumulate)
{
    constexpr int KU = RING_PIECE / (MW * 1024); /* units per stage */
    constexpr int GR = MW * 16;                  /* rows per group */
    constexpr int NTOK = NT * 8;
    extern __shared__ __align__(128) unsigned char gemv_sm[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int lg = lane >> 2, lq = lane & 3;
    const int n_groups = (n_out + GR - 1) / GR;
    const int g0 = (int)((long long)blockIdx.x * n_groups / gridDim.x);
    const int g1 = (int)((long long)(blockIdx.x + 1) * n_groups / gridDim.x);
    const int ng = g1 - g0;
    const int KB = n_in >> 5;
    const int kb0 = KB * warp / RING_WARPS;
    const int nk = KB * (warp + 1) / RING_WARPS - kb0;
    const int nu = ng * nk;                      /* this warp's units */
    const int n_st = (nu + KU - 1) / KU;         /* and stages */
    unsigned char *ring = gemv_sm + (size_t)warp * n_stages * RING_PIECE;
    float *red = reinterpret_cast<float *>(
        gemv_sm + (size_t)RING_WARPS * n_stages * RING_PIECE);

    kern_pdl_trigger();
    /* Issues stage k: units k*KU .. of this warp. */
    auto issue = [&](int k) {
        unsigned char *dst = ring + (size_t)(k % n_stages) * RING_PIECE;
#pragma unroll
        for (int ku = 0; ku < KU; ku++) {
            const int u = k * KU + ku;
            if (u < nu) {
                const int gi = u / nk;
                const int kb = kb0 + (u - gi * nk);
#pragma unroll
                for (int mt = 0; mt < MW; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = (g0 + gi) * GR + mt * 16 + lg + 8 * h;
                        const bool ok = row < n_out;
                        tc_cp16(dst + ((ku * MW + mt) * 2 + h) * 512 +
                                    lane * 16,
                                w + (size_t)(ok ? row : 0) * n_in + kb * 32 +
                                    lq * 8,
                                ok);
                    }
            }
        }
    };
    for (int k = 0; k < n_stages; k++) {
        if (k < n_st)
            issue(k);
        tc_cp_commit();
    }
    kern_pdl_wait();
    for (int i = threadIdx.x; i < 2 * NTOK * GR; i += blockDim.x)
        red[i] = 0.0f;
    __syncthreads();

    int uc = 0, buf = 0;
    for (int gi = 0; gi < ng; gi++) {
        float c[MW][NT][4];
#pragma unroll
        for (int mt = 0; mt < MW; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[mt][nt][e] = 0.0f;
        for (int kb = kb0; kb < kb0 + nk; kb++, uc++) {
            const int k = uc / KU, ku = uc - k * KU;
            const uint4 *st = reinterpret_cast<const uint4 *>(
                ring + (size_t)(k % n_stages) * RING_PIECE);
            uint4 xv[NT];

            if (ku == 0)
                gemv_cp_wait(n_stages - 1);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tok = nt * 8 + lg;
                xv[nt] = tok < n_tok
                             ? __ldg(reinterpret_cast<const uint4 *>(
                                   x + (size_t)tok * n_in + kb * 32 + lq * 8))
                             : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int mt = 0; mt < MW; mt++) {
                const uint4 lo = st[((ku * MW + mt) * 2 + 0) * 32 + lane];
                const uint4 hi = st[((ku * MW + mt) * 2 + 1) * 32 + lane];
                const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
                const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    tc_mma(c[mt][nt], a0, xv[nt].x, xv[nt].y);
                    tc_mma(c[mt][nt], a1, xv[nt].z, xv[nt].w);
                }
            }
            if (ku == KU - 1 || uc == nu - 1) {
                issue(k + n_stages);
                tc_cp_commit();
            }
        }
        float *rb = red + buf * NTOK * GR;
        if (nk > 0) {
#pragma unroll
            for (int mt = 0; mt < MW; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int tok = nt * 8 + 2 * lq;
                    const int r = mt * 16 + lg;
                    if (tok < n_tok) {
                        atomicAdd(&rb[tok * GR + r], c[mt][nt][0]);
                        atomicAdd(&rb[tok * GR + r + 8], c[mt][nt][2]);
                    }
                    if (tok + 1 < n_tok) {
                        atomicAdd(&rb[(tok + 1) * GR + r], c[mt][nt][1]);
                        atomicAdd(&rb[(tok + 1) * GR + r + 8], c[mt][nt][3]);
                    }
                }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n_tok * GR; i += blockDim.x) {
            const int t = i / GR, r = i - t * GR;
            const int row = (g0 + gi) * GR + r;
            float v = rb[i];
            rb[i] = 0.0f;
            if (row < n_out) {
                OUT *dst = y + (size_t)t * n_out + row;
                if (accumulate)
                    v += kern_to_f(*dst);
                *dst = kern_from_f<OUT>(v);
            }
        }
        buf ^= 1;
    }
}

// ---------------------------------------------------------------------
// Launchers

/* Multiprocessors of the current device (cached per device). */
static int gemv_n_sm(void)
{
    static int cache[64];
    int dev = 0, n = 0;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 132;
    if (cache[dev] == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount,
                                   dev) != cudaSuccess || n <= 0)
            n = 132;
        cache[dev] = n;
    }
    return cache[dev];
}

/* Dynamic shared memory the ring kernels may use on the current device:
 * GEMV_SMEM_MAX, less where the opt-in limit is lower (1 KB left for
 * static shared memory).  Cached per device. */
static size_t gemv_smem_budget(void)
{
    static size_t cache[64];
    int dev = 0, optin = 0;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 48 * 1024;
    if (cache[dev] == 0) {
        if (cudaDeviceGetAttribute(&optin,
                                   cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                   dev) != cudaSuccess || optin <= 0)
            optin = 48 * 1024;
        cache[dev] = BT_MIN((size_t)GEMV_SMEM_MAX, (size_t)optin - 1024);
    }
    return cache[dev];
}

/* Raises kernel k's dynamic shared memory limit to gemv_smem_budget()
 * once per device (bit `slot` of a per-device mask). */
template <typename K>
static cudaError_t gemv_smem_attr(K k, int slot)
{
    static uint64_t done[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);

    if (err != cudaSuccess)
        return err;
    if (dev >= 0 && dev < 64 && (done[dev] >> slot & 1))
        return cudaSuccess;
    err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)gemv_smem_budget());
    if (err == cudaSuccess && dev >= 0 && dev < 64)
        done[dev] |= 1ull << slot;
    return err;
}

/* Blocks and shared memory of the ring kernels: one block per SM (fewer
 * when there are fewer rows), as many stages as fit. */
static int gemv_ring_stages(size_t fixed)
{
    size_t per = (size_t)RING_WARPS * (RING_PIECE + 8);
    size_t budget = gemv_smem_budget();

    if (fixed >= budget)
        return 0;
    return (int)BT_MIN((size_t)RING_MAX_STAGES, (budget - fixed) / per);
}

static int gemv_ring_tmpl(int n_tok)
{
    return n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : 4;
}

static size_t gemv_ring_fixed(int n_tok, int n_out, int n_in, int blocks)
{
    int T = gemv_ring_tmpl(n_tok);
    size_t rows = (size_t)BT_DIV_UP(n_out, blocks);

    return (size_t)T * n_in * 2 + (size_t)T * rows * 4 + 256;
}

static bool gemv_ring_ok(int n_tok, int n_out, int n_in)
{
    int blocks = BT_MIN(gemv_n_sm(), n_out);

    return n_tok >= 1 && n_tok <= RING_MAX_TOK && n_in % 256 == 0 &&
           gemv_ring_stages(gemv_ring_fixed(n_tok, n_out, n_in, blocks)) >=
               RING_MIN_STAGES;
}

template <int T, typename OUT, bool NORM, bool BULK>
static cudaError_t gemv_ring_launch_t(int n_tok, int n_out, int n_in,
                                      const bf16_t *x, const float *xf,
                                      const bf16_t *g, float eps,
                                      const bf16_t *w, OUT *y, bool acc,
                                      cudaStream_t st)
{
    auto k = gemv_ring_kernel<T, OUT, NORM, BULK>;
    int blocks = BT_MIN(gemv_n_sm(), n_out);
    size_t fixed = gemv_ring_fixed(n_tok, n_out, n_in, blocks);
    int stages = gemv_ring_stages(fixed);
    size_t smem = (size_t)RING_WARPS * stages * (RING_PIECE + 8) + fixed;
    int slot = (T == 1 ? 0 : T == 2 ? 1 : 2) * 8 +
               (sizeof(OUT) == 4 ? 4 : 0) + (NORM ? 2 : 0) + (BULK ? 1 : 0);
    cudaError_t err = gemv_smem_attr(k, slot);

    if (err != cudaSuccess)
        return err;
    kern_launch(k, blocks, RING_WARPS * 32, smem, st, n_tok, n_out, n_in,
                stages, x, xf, g, eps, w, y, acc);
    return cudaSuccess;
}

template <typename OUT, bool NORM>
static cudaError_t gemv_ring_launch(bool bulk, int n_tok, int n_out,
                                    int n_in, const bf16_t *x,
                                    const float *xf, const bf16_t *g,
                                    float eps, const bf16_t *w, OUT *y,
                                    bool acc, cudaStream_t st)
{
#define GEMV_RING_T(T)                                                      \
    (bulk ? gemv_ring_launch_t<T, OUT, NORM, true>(                         \
                n_tok, n_out, n_in, x, xf, g, eps, w, y, acc, st)           \
          : gemv_ring_launch_t<T, OUT, NORM, false>(                        \
                n_tok, n_out, n_in, x, xf, g, eps, w, y, acc, st))
    switch (gemv_ring_tmpl(n_tok)) {
    case 1: return GEMV_RING_T(1);
    case 2: return GEMV_RING_T(2);
    default: return GEMV_RING_T(4);
    }
#undef GEMV_RING_T
}

static int gemv_mma_nt(int n_tok)
{
    return n_tok <= 8 ? 1 : n_tok <= 16 ? 2 : n_tok <= 32 ? 4 : 8;
}

static bool gemv_mma_ok(int n_tok, int n_in)
{
    size_t fixed = (size_t)2 * 64 * 32 * 4 + 128;

    return n_tok >= 1 && n_tok <= CUDA_GEMV_MMA_MAX_TOK && n_in % 32 == 0 &&
           gemv_ring_stages(fixed) >= RING_MIN_STAGES;
}

template <int NT, int MW, typename OUT>
static cudaError_t gemv_mma_launch_t(int n_tok, int n_out, int n_in,
                                     const bf16_t *x, const bf16_t *w,
                                     OUT *y, bool acc, cudaStream_t st)
{
    auto k = gemv_mma_kernel<NT, MW, OUT>;
    int n_groups = (int)BT_DIV_UP(n_out, MW * 16);
    int blocks = BT_MIN(gemv_n_sm(), n_groups);
    size_t fixed = (size_t)2 * NT * 8 * MW * 16 * 4 + 128;
    int stages = gemv_ring_stages(fixed);
    size_t smem = (size_t)RING_WARPS * stages * RING_PIECE + fixed;
    int slot = 24 + (NT == 1 ? 0 : NT == 2 ? 1 : NT == 4 ? 2 : 3) * 4 +
               (MW - 1) * 2 + (sizeof(OUT) == 4 ? 1 : 0);
    cudaError_t err = gemv_smem_attr(k, slot);

    if (err != cudaSuccess)
        return err;
    kern_launch(k, blocks, RING_WARPS * 32, smem, st, n_tok, n_out, n_in,
                stages, x, w, y, acc);
    return cudaSuccess;
}

template <int MW, typename OUT>
static cudaError_t gemv_mma_launch(int n_tok, int n_out, int n_in,
                                   const bf16_t *x, const bf16_t *w, OUT *y,
                                   bool acc, cudaStream_t st)
{
    switch (gemv_mma_nt(n_tok)) {
    case 1: return gemv_mma_launch_t<1, MW, OUT>(n_tok, n_out, n_in, x, w, y, acc, st);
    case 2: return gemv_mma_launch_t<2, MW, OUT>(n_tok, n_out, n_in, x, w, y, acc, st);
    case 4: return gemv_mma_launch_t<4, MW, OUT>(n_tok, n_out, n_in, x, w, y, acc, st);
    default: return gemv_mma_launch_t<8, MW, OUT>(n_tok, n_out, n_in, x, w, y, acc, st);
    }
}

/* xf/g/eps: the fused RMSNorm input (NORM), else x. */
template <typename OUT, bool NORM>
static void gemv_stream_launch(int n_tok, int n_out, int n_in,
                               const bf16_t *x, const float *xf,
                               const bf16_t *g, float eps, const bf16_t *w,
                               OUT *y, bool acc, cudaStream_t st)
{
    int max_warps = gemv_n_sm() * GEMV_STREAM_BLOCKS_PER_SM * GEMV_WARPS;
    int rpw = (int)BT_DIV_UP(n_out, max_warps);
    int n_warps = (int)BT_DIV_UP(n_out, rpw);
    int blocks = (int)BT_DIV_UP(n_warps, GEMV_WARPS);
    int th = GEMV_WARPS * 32;
    size_t smem = NORM ? (size_t)n_tok * n_in * sizeof(bf16_t) : 0;

    if (n_tok == 1)
        kern_launch(gemv_stream_kernel<1, OUT, NORM>, blocks, th, smem, st,
                    n_out, n_in, n_warps, x, xf, g, eps, w, y, acc);
    else
        kern_launch(gemv_stream_kernel<2, OUT, NORM>, blocks, th, smem, st,
                    n_out, n_in, n_warps, x, xf, g, eps, w, y, acc);
}

/* Where the rows kernel triggers its dependents (PDL).  Under late
 * triggers (cuda__pdl_late: steps of <= 2 tokens) at its first
 * instruction: a trigger completes once every block of the grid has
 * issued it, i.e. once the last block is resident, so the next kernel is
 * launched then and its blocks take each slot this grid frees, at once,
 * and issue their first weight loads under its tail (faster than
 * triggering once the warp's last loads are issued, GEMV_TRIG_LATE, which
 * left the slots freed meanwhile idle until the launch: round 15 of
 * docs/PERFORMANCE.md).  Otherwise after the PDL wait. */
static int gemv_trigger(void)
{
    return cuda__pdl_late ? GEMV_TRIG_EARLY : GEMV_TRIG_AFTER_WAIT;
}

/* Rows per warp of the rows kernel: 1, or 2 when the grid of one row per
 * warp is at most two waves and its last wave is less than 60% full
 * while two rows per warp make a fuller last wave (qkv 6144 x 4096: 768
 * blocks = 1.45 waves of 528 -> 384 blocks in one wave, all resident, no
 * half-empty second wave).  Needs n_in / 8 % (32 U) == 0. */
static int gemv_rows_per_warp(int n_out, int n_in, int U, int wave)
{
    const int n_ch = n_in / 8;

    if (n_ch % (32 * U) != 0)
        return 1;
    long b1 = BT_DIV_UP(n_out, GEMV_WARPS);
    long b2 = BT_DIV_UP(n_out, 2 * GEMV_WARPS);
    if (b1 > 2L * wave)
        return 1;
    double f1 = (double)(b1 - (b1 - 1) / wave * wave) / wave;
    double f2 = (double)(b2 - (b2 - 1) / wave * wave) / wave;
    return f1 < 0.6 && f2 > f1 + 0.1 ? 2 : 1;
}

/* GLU: n_out is the number of (gate, up) row pairs (see gemv_kernel). */
template <typename OUT, int U, bool NORM, int GLU = GEMV_GLU_OFF>
static void gemv_rows_launch(int n_tok, int n_out, int n_in, const bf16_t *x,
                             const float *xf, const bf16_t *g, float eps,
                             const bf16_t *w, OUT *y, bool acc,
                             cudaStream_t st)
{
    const int th = GEMV_WARPS * 32;
    const int per_sm = U > 4 ? 2 : (n_tok <= 2 ? 4 : 2);
    const int wave = gemv_n_sm() * per_sm;
    const int rpw = GLU ? 1 : gemv_rows_per_warp(n_out, n_in, U, wave);
    const int blocks = (int)BT_DIV_UP(
        n_out, GLU == GEMV_GLU_PAIR ? GEMV_WARPS / 2 : GEMV_WARPS * rpw);
    const size_t smem = NORM ? (size_t)n_tok * n_in * sizeof(bf16_t) : 0;
    const int trig = gemv_trigger();
    /* The kernel's L2 prefetch (pf_bytes, pf_blocks) and its x reload
     * (norm_keep false) lost their A/B and are never selected: 0, 0 and
     * true below.  Their branches stay in gemv_kernel until a device
     * session measures the kernel without them. */
    const int pf_bytes = 0, pf_blocks = 0;
    const bool norm_keep = true;

#define GEMV_ROWS_K(T)                                                      \
    kern_launch(gemv_kernel<T, OUT, U, NORM && T <= 2,                      \
                            T <= 2 ? GLU : GEMV_GLU_OFF>,                   \
                blocks, th, smem, st, n_out, n_in, x, xf, g, eps, w, y,     \
                acc, pf_bytes, pf_blocks, trig, rpw, norm_keep)
    switch (n_tok) {
    case 1: GEMV_ROWS_K(1); break;
    case 2: GEMV_ROWS_K(2); break;
    case 3: GEMV_ROWS_K(3); break;
    default: GEMV_ROWS_K(4); break;
    }
#undef GEMV_ROWS_K
}

// ---------------------------------------------------------------------
// Public API

static const char *const gemv_names[CUDA_GEMV_N_KERNELS] = {
    "rows", "rows8", "stream", "ring", "bulk", "mma1", "mma2", "tc",
    "wg"};

const char *cuda_gemv_kernel_name(cuda_gemv_kernel_t k)
{
    return (int)k >= 0 && k < CUDA_GEMV_N_KERNELS ? gemv_names[k] : NULL;
}

int cuda_gemv_kernel_by_name(const char *name)
{
    for (int k = 0; k < CUDA_GEMV_N_KERNELS; k++)
        if (name && strcmp(name, gemv_names[k]) == 0)
            return k;
    return -1;
}

bool cuda_gemv_kernel_ok(cuda_gemv_kernel_t k, int n_tok, int n_out,
                         int n_in, cuda_dtype_t in_dt)
{
    if (in_dt != CUDA_DT_BF16 || n_tok < 1 || n_out < 1 || n_in < 8)
        return false;
    switch (k) {
    case CUDA_GEMV_ROWS:
    case CUDA_GEMV_ROWS8:
        return n_in % 8 == 0 && n_tok <= 4;
    case CUDA_GEMV_STREAM:
        return n_in % 256 == 0 && n_tok <= 2;
    case CUDA_GEMV_RING:
    case CUDA_GEMV_BULK:
        return gemv_ring_ok(n_tok, n_out, n_in);
    case CUDA_GEMV_MMA1:
    case CUDA_GEMV_MMA2:
        return gemv_mma_ok(n_tok, n_in);
    case CUDA_GEMV_TC:
        return cuda_gemv_tc_ok(n_tok, n_out, n_in);
    case CUDA_GEMV_WG:
        return cuda_gemv_wg_ok(n_tok, n_out, n_in);
    default:
        return false;
    }
}

bt_status_t cuda_gemv_run(cuda_gemv_kernel_t k, int n_tok, int n_out,
                          int n_in, const void *d_x, const void *d_w,
                          void *d_y, cuda_dtype_t out_dt, bool accumulate,
                          const cuda_gemv_ws_t *ws, cudaStream_t stream)
{
    const bf16_t *x = (const bf16_t *)d_x, *w = (const bf16_t *)d_w;
    cudaError_t err = cudaSuccess;

    BT_ASSERT(cuda_gemv_kernel_ok(k, n_tok, n_out, n_in, CUDA_DT_BF16));
    switch (k) {
    case CUDA_GEMV_ROWS:
        KERN_DISPATCH_DT(out_dt, OUT, (gemv_rows_launch<OUT, 4, false>(
            n_tok, n_out, n_in, x, NULL, NULL, 0.0f, w, (OUT *)d_y,
            accumulate, stream)));
        break;
    case CUDA_GEMV_ROWS8:
        KERN_DISPATCH_DT(out_dt, OUT, (gemv_rows_launch<OUT, 8, false>(
            n_tok, n_out, n_in, x, NULL, NULL, 0.0f, w, (OUT *)d_y,
            accumulate, stream)));
        break;
    case CUDA_GEMV_STREAM:
        KERN_DISPATCH_DT(out_dt, OUT, gemv_stream_launch<OUT, false>(
            n_tok, n_out, n_in, x, NULL, NULL, 0.0f, w, (OUT *)d_y,
            accumulate, stream));
        break;
    case CUDA_GEMV_RING:
    case CUDA_GEMV_BULK:
        KERN_DISPATCH_DT(out_dt, OUT, err = gemv_ring_launch<OUT, false>(
            k == CUDA_GEMV_BULK, n_tok, n_out, n_in, x, NULL, NULL, 0.0f, w,
            (OUT *)d_y, accumulate, stream));
        break;
    case CUDA_GEMV_MMA1:
        KERN_DISPATCH_DT(out_dt, OUT, err = gemv_mma_launch<1, OUT>(
            n_tok, n_out, n_in, x, w, (OUT *)d_y, accumulate, stream));
        break;
    case CUDA_GEMV_MMA2:
        KERN_DISPATCH_DT(out_dt, OUT, err = gemv_mma_launch<2, OUT>(
            n_tok, n_out, n_in, x, w, (OUT *)d_y, accumulate, stream));
        break;
    case CUDA_GEMV_TC:
    case CUDA_GEMV_WG:
        err = cuda_gemv_tc(n_tok, n_out, n_in, d_x, d_w, d_y, out_dt,
                           accumulate, k == CUDA_GEMV_WG, ws, stream);
        break;
    default:
        break;
    }
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_gemv_prepare(void)
{
    cudaError_t err = cudaSuccess;

#define GEMV_PREP_RING(T, OUT, NORM, BULK, SLOT)                            \
    if (err == cudaSuccess)                                                 \
        err = gemv_smem_attr(gemv_ring_kernel<T, OUT, NORM, BULK>, SLOT);
#define GEMV_PREP_RING4(T, SLOT0)                                           \
    GEMV_PREP_RING(T, bf16_t, false, false, SLOT0 + 0)                      \
    GEMV_PREP_RING(T, bf16_t, false, true, SLOT0 + 1)                       \
    GEMV_PREP_RING(T, bf16_t, true, false, SLOT0 + 2)                       \
    GEMV_PREP_RING(T, bf16_t, true, true, SLOT0 + 3)                        \
    GEMV_PREP_RING(T, float, false, false, SLOT0 + 4)                       \
    GEMV_PREP_RING(T, float, false, true, SLOT0 + 5)                        \
    GEMV_PREP_RING(T, float, true, false, SLOT0 + 6)                        \
    GEMV_PREP_RING(T, float, true, true, SLOT0 + 7)
    GEMV_PREP_RING4(1, 0)
    GEMV_PREP_RING4(2, 8)
    GEMV_PREP_RING4(4, 16)
#define GEMV_PREP_MMA(NT, NTI)                                              \
    if (err == cudaSuccess)                                                 \
        err = gemv_smem_attr(gemv_mma_kernel<NT, 1, bf16_t>, 24 + NTI * 4); \
    if (err == cudaSuccess)                                                 \
        err = gemv_smem_attr(gemv_mma_kernel<NT, 1, float>, 25 + NTI * 4);  \
    if (err == cudaSuccess)                                                 \
        err = gemv_smem_attr(gemv_mma_kernel<NT, 2, bf16_t>, 26 + NTI * 4); \
    if (err == cudaSuccess)                                                 \
        err = gemv_smem_attr(gemv_mma_kernel<NT, 2, float>, 27 + NTI * 4);
    GEMV_PREP_MMA(1, 0)
    GEMV_PREP_MMA(2, 1)
    GEMV_PREP_MMA(4, 2)
    GEMV_PREP_MMA(8, 3)
#undef GEMV_PREP_MMA
#undef GEMV_PREP_RING4
#undef GEMV_PREP_RING
    if (err == cudaSuccess)
        err = cuda_gemv_tc_prepare();
    return BT_CUDA_STATUS(err);
}

static __global__ void gemv_fill_kernel(bf16_t *d, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15;
        h *= 0x85EBCA77u;
        h ^= h >> 13;
        d[i] = __float2bfloat16_rn((float)(h & 0xFFFF) / 32768.0f - 1.0f);
    }
}

bt_status_t cuda_gemv_fill(void *d, size_t n, uint32_t seed,
                           cudaStream_t stream)
{
    if (n == 0)
        return BT_OK;
    gemv_fill_kernel<<<(unsigned)BT_MIN(BT_DIV_UP(n, 256), (size_t)4096),
                       256, 0, stream>>>((bf16_t *)d, n, seed);
    return BT_CUDA_LAUNCH_STATUS();
}

/* One block per row: y = bf16(x).  No PDL trigger, so a product
 * launched behind it starts when it ends (see gemv.h). */
static __global__ void gemv_tune_lead_kernel(const float *x, int n, bf16_t *y)
{
    const float *xr = x + (size_t)blockIdx.x * n;
    bf16_t *yr = y + (size_t)blockIdx.x * n;

    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = __float2bfloat16(xr[i]);
}

bt_status_t cuda_gemv_tune_lead(const float *d_x, int n_rows, int n,
                                void *d_y, cudaStream_t stream)
{
    if (n_rows <= 0 || n <= 0)
        return BT_OK;
    gemv_tune_lead_kernel<<<(unsigned)n_rows, 256, 0, stream>>>(
        d_x, n, (bf16_t *)d_y);
    return BT_CUDA_LAUNCH_STATUS();
}

/* Which kernel cuda_gemv_norm uses (BT_GEMV_NORM, cuda_switches.h):
 * unset / "rows": the rows kernel with the norm staged per block (the
 * default); "0": no fusion (cuda_gemv_norm_ok false: the backend runs
 * cuda_rmsnorm + worker_gemm); "1" / "ring": the ring kernel (round 3,
 * slower; the streaming kernel where the ring does not take the shape). */
typedef enum { GEMV_NORM_OFF, GEMV_NORM_ROWS, GEMV_NORM_RING
} gemv_norm_mode_t;

static gemv_norm_mode_t gemv_norm_mode(void)
{
    const char *env = cuda_switches()->gemv_norm;

    if (env && strcmp(env, "0") == 0)
        return GEMV_NORM_OFF;
    if (env && (strcmp(env, "1") == 0 || strcmp(env, "ring") == 0))
        return GEMV_NORM_RING;
    return GEMV_NORM_ROWS;
}

bool cuda_gemv_ok(int n_tok, int n_in, cuda_dtype_t in_dt)
{
    return in_dt == CUDA_DT_BF16 && n_in % 8 == 0 && n_tok >= 1 &&
           n_tok <= CUDA_GEMV_MAX_TOK;
}

bt_status_t cuda_gemv(int n_tok, int n_out, int n_in, const void *d_x,
                      const void *d_w, void *d_y, cuda_dtype_t out_dt,
                      bool accumulate, cudaStream_t stream)
{
    BT_ASSERT(cuda_gemv_ok(n_tok, n_in, CUDA_DT_BF16));
    return cuda_gemv_run(CUDA_GEMV_ROWS, n_tok, n_out, n_in, d_x, d_w, d_y,
                         out_dt, accumulate, NULL, stream);
}

bool cuda_gemv_norm_ok(int n_tok, int n_in)
{
    gemv_norm_mode_t m = gemv_norm_mode();

    if (m == GEMV_NORM_OFF || n_tok < 1 || n_tok > CUDA_GEMV_MAX_TOK ||
        (size_t)n_tok * n_in * sizeof(bf16_t) > 48 * 1024)
        return false;
    if (m == GEMV_NORM_ROWS)
        return n_in % 8 == 0;
    return n_in % 256 == 0;
}

bt_status_t cuda_gemv_norm(int n_tok, int n_out, int n_in, const float *d_x,
                           const void *d_g, float eps, const void *d_w,
                           void *d_y, cuda_dtype_t out_dt,
                           cudaStream_t stream)
{
    gemv_norm_mode_t m = gemv_norm_mode();
    const bf16_t *g = (const bf16_t *)d_g, *w = (const bf16_t *)d_w;
    cudaError_t err = cudaSuccess;

    BT_ASSERT(cuda_gemv_norm_ok(n_tok, n_in));
    if (m == GEMV_NORM_ROWS) {
        KERN_DISPATCH_DT(out_dt, OUT, (gemv_rows_launch<OUT, 4, true>(
            n_tok, n_out, n_in, NULL, d_x, g, eps, w, (OUT *)d_y, false,
            stream)));
    } else if (m == GEMV_NORM_RING && gemv_ring_ok(n_tok, n_out, n_in)) {
        KERN_DISPATCH_DT(out_dt, OUT, err = gemv_ring_launch<OUT, true>(
            false, n_tok, n_out, n_in, NULL, d_x, g, eps, w, (OUT *)d_y,
            false, stream));
    } else {
        KERN_DISPATCH_DT(out_dt, OUT,
                         gemv_stream_launch<OUT, true>(
                             n_tok, n_out, n_in, NULL, d_x, g, eps, w,
                             (OUT *)d_y, false, stream));
    }
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}

/* BT_GEMV_GLU (cuda_switches.h): "pair" GEMV_GLU_PAIR, "warp"
 * GEMV_GLU_WARP, "0" off (cuda_gemv_norm_glu_ok false); unset: pair at 1
 * token, warp at 2, the faster of the two at each (round 12 of
 * docs/PERFORMANCE.md).  Pair keeps the unfused kernel's waves (warp:
 * half the blocks, 3.4 waves at 1 token); why warp wins so much at 2
 * tokens is not measured. */
static int gemv_glu_mode(int n_tok)
{
    const char *env = cuda_switches()->gemv_glu;

    if (env && strcmp(env, "0") == 0)
        return GEMV_GLU_OFF;
    if (env && strcmp(env, "warp") == 0)
        return GEMV_GLU_WARP;
    if (env && strcmp(env, "pair") == 0)
        return GEMV_GLU_PAIR;
    return n_tok >= 2 ? GEMV_GLU_WARP : GEMV_GLU_PAIR;
}

bool cuda_gemv_norm_glu_ok(int n_tok, int n_in)
{
    if (gemv_glu_mode(n_tok) == GEMV_GLU_OFF)
        return false;
    /* the rows kernel, and steps of 32 U chunks that stay in one row */
    return gemv_norm_mode() == GEMV_NORM_ROWS && cuda_gemv_norm_ok(n_tok, n_in) &&
           (n_in / 8) % (32 * GEMV_UNROLL) == 0;
}

bt_status_t cuda_gemv_norm_glu(int n_tok, int n_hid, int n_in,
                               const float *d_x, const void *d_g, float eps,
                               const void *d_w, void *d_h,
                               cudaStream_t stream)
{
    BT_ASSERT(cuda_gemv_norm_glu_ok(n_tok, n_in));
    if (gemv_glu_mode(n_tok) == GEMV_GLU_WARP)
        gemv_rows_launch<bf16_t, GEMV_UNROLL, true, GEMV_GLU_WARP>(
            n_tok, n_hid, n_in, NULL, d_x, (const bf16_t *)d_g, eps,
            (const bf16_t *)d_w, (bf16_t *)d_h, false, stream);
    else
        gemv_rows_launch<bf16_t, GEMV_UNROLL, true, GEMV_GLU_PAIR>(
            n_tok, n_hid, n_in, NULL, d_x, (const bf16_t *)d_g, eps,
            (const bf16_t *)d_w, (bf16_t *)d_h, false, stream);
    return BT_CUDA_LAUNCH_STATUS();
}

/* Reads [p, p + n16 * 16) once (L2 loads) and writes nothing
 * unless the sum is exactly the impossible value 1.5 * 2^-149 (never):
 * the lines left in L2 are clean. */
static __global__ void gemv_l2_flush_kernel(const uint4 *p, size_t n16,
                                            unsigned *sink)
{
    unsigned acc = 0;

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcg(p + i); /* normal priority: evicts */
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u && sink != NULL)
        *sink = acc;
}

bt_status_t cuda_l2_flush(void *d_buf, size_t bytes, cudaStream_t stream)
{
    gemv_l2_flush_kernel<<<4 * 132, 512, 0, stream>>>(
        (const uint4 *)d_buf, bytes / 16, NULL);
    return BT_CUDA_LAUNCH_STATUS();
}

/* acc[0] += sum (y - ref)^2, acc[1] += sum ref^2, acc[2] += count of
 * non-finite y. */
template <typename T>
static __global__ void gemv_err_kernel(const T *y, const T *ref, size_t n,
                                       double *acc)
{
    __shared__ float red[32];
    float d2 = 0.0f, r2 = 0.0f, bad = 0.0f;

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float a = kern_to_f(y[i]), b = kern_to_f(ref[i]);
        if (!isfinite(a)) {
            bad += 1.0f;
            continue;
        }
        d2 += (a - b) * (a - b);
        r2 += b * b;
    }
    d2 = kern_block_sum(d2, red);
    r2 = kern_block_sum(r2, red);
    bad = kern_block_sum(bad, red);
    if (threadIdx.x == 0) {
        atomicAdd(&acc[0], (double)d2);
        atomicAdd(&acc[1], (double)r2);
        atomicAdd(&acc[2], (double)bad);
    }
}

bt_status_t cuda_gemv_rel_err(const void *d_y, const void *d_ref, size_t n,
                              cuda_dtype_t dt, double *d_acc,
                              cudaStream_t stream)
{
    unsigned blocks = (unsigned)BT_MAX(BT_MIN(BT_DIV_UP(n, 256),
                                              (size_t)1024), (size_t)1);
    cudaError_t err = cudaMemsetAsync(d_acc, 0, 3 * sizeof(double), stream);

    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    KERN_DISPATCH_DT(dt, T, gemv_err_kernel<T><<<blocks, 256, 0, stream>>>(
        (const T *)d_y, (const T *)d_ref, n, d_acc));
    return BT_CUDA_LAUNCH_STATUS();
}

#ifdef BT_KPROF
extern "C" void cuda_kprof_dump_gemv(FILE *f)
{
    kprof_dump("gemv", f);
}
#endif
