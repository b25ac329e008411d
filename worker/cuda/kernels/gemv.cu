/*
 * gemv.cu - y (t, o) [+]= x (t, i) . w (o, i)^T for t <= 8 tokens (decode
 * steps), bf16 x and w, f32 accumulation, y bf16 or f32.  One warp per
 * output row: lanes walk the row in 16-byte chunks (8 bf16), up to 8
 * chunks in flight per lane (software pipeline), x chunks from L1; a
 * warp-shuffle sum per token.  Launched with programmatic dependent launch
 * (kern_launch): the first weight chunks load before kern_pdl_wait().
 * Test: build-cuda/gpu/test_gemm (make gpu-test), which also times it.
 */
#include "gemv.h"

#include "bt_util.h"
#include "kern_common.cuh"

#define GEMV_WARPS 8
#define GEMV_UNROLL 4

/* Multiply-adds one 8-element weight chunk into the T accumulators. */
template <int T>
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
        uint4 xv = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)t * n_in) +
                         c);
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
    KERN_DISPATCH_DT(out_dt, OUT,
                     gemv_launch<OUT>(n_tok, n_out, n_in, (const bf16_t *)d_x,
                                      (const bf16_t *)d_w, (OUT *)d_y,
                                      accumulate, stream));
    return BT_CUDA_LAUNCH_STATUS();
}
