/*
 * gemv.cu - y (t, o) [+]= x (t, i) . w (o, i)^T for t <= 8 tokens (decode
 * steps), bf16 x and w, f32 accumulation, y bf16 or f32.  One warp per
 * output row: lanes walk the row in 16-byte chunks (8 bf16), four chunks
 * in flight per lane, x chunks from L1; a warp-shuffle sum per token.
 * Test: build-cuda/gpu/test_gemm (make gpu-test), which also times it.
 */
#include "gemv.h"

#include "bt_util.h"
#include "kern_common.cuh"

#define GEMV_WARPS 8
#define GEMV_UNROLL 8

template <int T, typename OUT>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(int n_out, int n_in, const bf16_t *x, const bf16_t *w, OUT *y,
            bool accumulate)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out)
        return;
    const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)row * n_in);
    const int n_ch = n_in / 8;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;

    int c = lane;
    for (; c + 32 * (GEMV_UNROLL - 1) < n_ch; c += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            wv[u] = __ldcs(wr + c + 32 * u); /* streamed, read once */
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            float wf[8];
            const bf16_t *we = reinterpret_cast<const bf16_t *>(&wv[u]);
#pragma unroll
            for (int e = 0; e < 8; e++)
                wf[e] = __bfloat162float(we[e]);
#pragma unroll
            for (int t = 0; t < T; t++) {
                uint4 xv = __ldg(reinterpret_cast<const uint4 *>(
                                     x + (size_t)t * n_in) + c + 32 * u);
                const bf16_t *xe = reinterpret_cast<const bf16_t *>(&xv);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[t] += wf[e] * __bfloat162float(xe[e]);
            }
        }
    }
    for (; c < n_ch; c += 32) {
        uint4 wv = __ldcs(wr + c);
        const bf16_t *we = reinterpret_cast<const bf16_t *>(&wv);
#pragma unroll
        for (int t = 0; t < T; t++) {
            uint4 xv = __ldg(reinterpret_cast<const uint4 *>(
                                 x + (size_t)t * n_in) + c);
            const bf16_t *xe = reinterpret_cast<const bf16_t *>(&xv);
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[t] += __bfloat162float(we[e]) * __bfloat162float(xe[e]);
        }
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
    case 1: gemv_kernel<1, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 2: gemv_kernel<2, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 3: gemv_kernel<3, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 4: gemv_kernel<4, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 5: gemv_kernel<5, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 6: gemv_kernel<6, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    case 7: gemv_kernel<7, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
    default: gemv_kernel<8, OUT><<<blocks, th, 0, st>>>(n_out, n_in, x, w, y, acc); break;
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
