/*
 * gemv.cu - y (t, o) [+]= x (t, i) . w (o, i)^T for t <= 8 tokens (decode
 * steps), bf16 x and w, f32 accumulation, y bf16 or f32.  One warp per
 * output row: lanes walk the row in 16-byte chunks (8 bf16), up to 8
 * chunks in flight per lane (software pipeline), x chunks from L1; a
 * warp-shuffle sum per token.  Launched with programmatic dependent launch
 * (kern_launch): the first weight chunks load before kern_pdl_wait().
 * With BT_GEMV_KERNEL=stream, shapes with n_in % 256 == 0 take the
 * streaming kernel below instead (fixed grid, rows strided over the warps,
 * 8-16 lines in flight per warp, optional fused RMSNorm); measured slower,
 * kept for A/B.
 * Test: build-cuda/gpu/test_gemm (make gpu-test), which also times it.
 */
#include "gemv.h"

#include "bt_util.h"
#include "kern_common.cuh"

#define GEMV_WARPS 8
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

/* Software-pipelined: the next GEMV_UNROLL chunks of the row are loaded
 * while the current ones are multiplied, so each lane keeps up to 2 x 4 x
 * 16 bytes in flight.  The first chunks are loaded BEFORE kern_pdl_wait():
 * weights do not depend on the previous kernel, so with programmatic
 * dependent launch the weight stream starts during the previous kernel's
 * tail. */
template <int T, typename OUT>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, T <= 2 ? 4 : 2)
gemv_kernel(int n_out, int n_in, const bf16_t *x, const bf16_t *w, OUT *y,
            bool accumulate)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int n_ch = n_in / 8;
    const uint4 *wr = reinterpret_cast<const uint4 *>(
        w + (size_t)(row < n_out ? row : 0) * n_in);
    float acc[T];
    uint4 cur[GEMV_UNROLL];

    kern_pdl_trigger();
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        int c = lane + 32 * u;
        cur[u] = c < n_ch && row < n_out ? __ldcs(wr + c)
                                         : make_uint4(0, 0, 0, 0);
    }
    kern_pdl_wait();
    if (row >= n_out)
        return;
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;

    for (int c0 = lane; c0 < n_ch; c0 += 32 * GEMV_UNROLL) {
        uint4 nxt[GEMV_UNROLL];
        const int c1 = c0 + 32 * GEMV_UNROLL;
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            nxt[u] = c1 + 32 * u < n_ch ? __ldcs(wr + c1 + 32 * u)
                                        : make_uint4(0, 0, 0, 0);
        if (c0 + 32 * (GEMV_UNROLL - 1) < n_ch) {
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                gemv_chunk<T>(cur[u], x, n_in, c0 + 32 * u, acc);
        } else {
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                if (c0 + 32 * u < n_ch)
                    gemv_chunk<T>(cur[u], x, n_in, c0 + 32 * u, acc);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            cur[u] = nxt[u];
    }
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = kern_warp_sum(acc[t]);
    if (lane < T) {
        float v = 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t == lane)
                v = acc[t];
        OUT *dst = y + (size_t)lane * n_out + row;
        if (accumulate)
            v += kern_to_f(*dst);
        *dst = kern_from_f<OUT>(v);
    }
}

/* Streaming GEMV for n_in % 256 == 0: a fixed grid of two 8-warp blocks
 * per multiprocessor (all resident at once: no tail wave).  With W warps,
 * warp w takes rows w, w + W, w + 2W, ... (W chosen so every warp has the
 * same number of rows, to within one), so at any moment the GPU reads one
 * compact window of the matrix (TLB- and DRAM-friendly).  A warp reads its
 * rows as one stream of "lines" (32 lanes x 16 bytes; a row is n_in / 256
 * lines), double-buffered GEMV_LINES at a time across row boundaries, so
 * 8 to 16 lines per warp are in flight from the first load to the last;
 * the first lines load before kern_pdl_wait().  Only with
 * BT_GEMV_KERNEL=stream (see gemv_stream_enabled). */
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

/* BT_GEMV_KERNEL=stream selects the streaming kernel (and with it the
 * RMSNorm fusion); the default is the warp-per-row kernel, measured faster
 * on the H200 (2026-11-29, docs/PERFORMANCE.md: Llama-3-8B batch-1 decode
 * 4.72 ms/token against 5.84 ms with the streaming kernel, whose 16 warps
 * per multiprocessor hide less latency than the row kernel's 32).  Read at
 * each call, so tests and benchmarks can switch. */
static bool gemv_stream_enabled(void)
{
    const char *env = getenv("BT_GEMV_KERNEL");

    return env && strcmp(env, "stream") == 0;
}

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

bool cuda_gemv_ok(int n_tok, int n_in, cuda_dtype_t in_dt)
{
    return in_dt == CUDA_DT_BF16 && n_in % 8 == 0 && n_tok >= 1 &&
           n_tok <= CUDA_GEMV_MAX_TOK;
}

template <typename OUT>
static void gemv_launch(int n_tok, int n_out, int n_in, const bf16_t *x,
                        const bf16_t *w, OUT *y, bool acc, cudaStream_t st)
{
    int blocks = (int)BT_DIV_UP(n_out, GEMV_WARPS);
    int th = GEMV_WARPS * 32;

    switch (n_tok) {
    case 1: kern_launch(gemv_kernel<1, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 2: kern_launch(gemv_kernel<2, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 3: kern_launch(gemv_kernel<3, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 4: kern_launch(gemv_kernel<4, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 5: kern_launch(gemv_kernel<5, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 6: kern_launch(gemv_kernel<6, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    case 7: kern_launch(gemv_kernel<7, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    default: kern_launch(gemv_kernel<8, OUT>, blocks, th, 0, st, n_out, n_in, x, w, y, acc); break;
    }
}

bt_status_t cuda_gemv(int n_tok, int n_out, int n_in, const void *d_x,
                      const void *d_w, void *d_y, cuda_dtype_t out_dt,
                      bool accumulate, cudaStream_t stream)
{
    BT_ASSERT(cuda_gemv_ok(n_tok, n_in, CUDA_DT_BF16));
    if (n_in % 256 == 0 && n_tok <= 2 && gemv_stream_enabled()) {
        KERN_DISPATCH_DT(out_dt, OUT,
                         gemv_stream_launch<OUT, false>(
                             n_tok, n_out, n_in, (const bf16_t *)d_x, NULL,
                             NULL, 0.0f, (const bf16_t *)d_w, (OUT *)d_y,
                             accumulate, stream));
        return BT_CUDA_LAUNCH_STATUS();
    }
    KERN_DISPATCH_DT(out_dt, OUT,
                     gemv_launch<OUT>(n_tok, n_out, n_in, (const bf16_t *)d_x,
                                      (const bf16_t *)d_w, (OUT *)d_y,
                                      accumulate, stream));
    return BT_CUDA_LAUNCH_STATUS();
}

bool cuda_gemv_norm_ok(int n_tok, int n_in)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_MAX_TOK && n_in % 256 == 0 &&
           (size_t)n_tok * n_in * sizeof(bf16_t) <= 48 * 1024 &&
           gemv_stream_enabled();
}

bt_status_t cuda_gemv_norm(int n_tok, int n_out, int n_in, const float *d_x,
                           const void *d_g, float eps, const void *d_w,
                           void *d_y, cuda_dtype_t out_dt,
                           cudaStream_t stream)
{
    BT_ASSERT(cuda_gemv_norm_ok(n_tok, n_in));
    KERN_DISPATCH_DT(out_dt, OUT,
                     gemv_stream_launch<OUT, true>(
                         n_tok, n_out, n_in, NULL, d_x, (const bf16_t *)d_g,
                         eps, (const bf16_t *)d_w, (OUT *)d_y, false,
                         stream));
    return BT_CUDA_LAUNCH_STATUS();
}
