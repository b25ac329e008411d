/*
 * gemv_fp8.cu - the FP8 GEMV of decode steps (1-8 tokens, fp8.h): E4M3
 * weights times the bf16 values of E4M3 inputs, f32 sums, times the
 * token's scale and the row's scale.  Memory-bound: the weights are read
 * once, so the structure is gemv.cu's rows kernel (the best bf16 one at
 * 1-2 tokens): one warp per output row, lanes walking the row in 16-byte
 * chunks (16 codes), U chunks per lane loaded ahead of the ones being
 * multiplied (software pipeline, 2 x U x 16 bytes in flight per lane),
 * the first loads issued before the programmatic-dependent-launch wait
 * (weights never depend on the previous kernel), x from L1/L2, a warp
 * sum per token.  Codes become floats through the hardware's
 * e4m3x2 -> f16x2 conversion (exact), inputs are bf16 (exact for E4M3
 * values), so every product is exact in f32, as in the cpu reference.
 * Test: build-DIR/gpu/test_cuda_fp8 (against cpu__fp8_gemm_ref).
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fp8.h"

#include "kern_common.cuh"

#define GF8_WARPS 8
#define GF8_UNROLL 4

/* The 16 codes of a chunk as floats. */
static __device__ __forceinline__ void gf8_codes(const uint4 &wv,
                                                 float (&wf)[16])
{
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
            (__nv_fp8x2_storage_t)(words[i] & 0xFFFFu), __NV_E4M3);
        const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
            (__nv_fp8x2_storage_t)(words[i] >> 16), __NV_E4M3);
        const float2 a = __half22float2(__half2(lo));
        const float2 b = __half22float2(__half2(hi));
        wf[4 * i + 0] = a.x;
        wf[4 * i + 1] = a.y;
        wf[4 * i + 2] = b.x;
        wf[4 * i + 3] = b.y;
    }
}

/* Multiply-adds chunk c (16 columns) of the row into the T sums. */
template <int T>
static __device__ __forceinline__ void gf8_chunk(const uint4 &wv,
                                                 const bf16_t *x, int ld,
                                                 int c, float *acc)
{
    float wf[16];

    gf8_codes(wv, wf);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xp =
            reinterpret_cast<const uint4 *>(x + (size_t)t * ld + 16 * c);
        const uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        const bf16_t *e0 = reinterpret_cast<const bf16_t *>(&x0);
        const bf16_t *e1 = reinterpret_cast<const bf16_t *>(&x1);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[t] += wf[e] * __bfloat162float(e0[e]);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[t] += wf[8 + e] * __bfloat162float(e1[e]);
    }
}

template <int T, typename OUT>
static __global__ void __launch_bounds__(GF8_WARPS * 32, T <= 2 ? 4 : 2)
gf8_kernel(int n_out, int ld, const bf16_t *x, const float *xs,
           const uint8_t *w, const float *ws, OUT *y, bool accumulate)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GF8_WARPS + (threadIdx.x >> 5);
    const int n_ch = ld / 16;
    const uint4 *wr = reinterpret_cast<const uint4 *>(
        w + (size_t)(row < n_out ? row : 0) * ld);
    const int n_tot = row < n_out ? n_ch : 0;
    uint4 cur[GF8_UNROLL];
    float acc[T];

#pragma unroll
    for (int u = 0; u < GF8_UNROLL; u++) {
        const int c = lane + 32 * u;
        cur[u] = c < n_tot ? __ldcs(wr + c) : make_uint4(0, 0, 0, 0);
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    if (row >= n_out)
        return;
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    for (int c0 = lane; c0 < n_tot; c0 += 32 * GF8_UNROLL) {
        uint4 nxt[GF8_UNROLL];
        const int c1 = c0 + 32 * GF8_UNROLL;
#pragma unroll
        for (int u = 0; u < GF8_UNROLL; u++)
            nxt[u] = c1 + 32 * u < n_tot ? __ldcs(wr + c1 + 32 * u)
                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GF8_UNROLL; u++)
            if (c0 + 32 * u < n_tot)
                gf8_chunk<T>(cur[u], x, ld, c0 + 32 * u, acc);
#pragma unroll
        for (int u = 0; u < GF8_UNROLL; u++)
            cur[u] = nxt[u];
    }
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = kern_warp_sum(acc[t]);
    /* lane t writes token t (static indices keep acc in registers) */
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (lane == t) {
            float v = acc[t] * xs[t] * ws[row];
            OUT *d = y + (size_t)t * n_out + row;
            if (accumulate)
                v += kern_to_f(*d);
            *d = kern_from_f<OUT>(v);
        }
    }
}

bool cuda_gemv_fp8_ok(int n_tok, int ld)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_FP8_MAX_TOK && ld > 0 &&
           ld % 16 == 0;
}

template <typename OUT>
static void gf8_launch(int n_tok, int n_out, int ld, const bf16_t *x,
                       const float *xs, const uint8_t *w, const float *ws,
                       OUT *y, bool accumulate, cudaStream_t stream)
{
    const dim3 grid((n_out + GF8_WARPS - 1) / GF8_WARPS);
    const dim3 block(GF8_WARPS * 32);

#define GF8_CASE(_t)                                                        \
    case _t:                                                                \
        kern_launch(gf8_kernel<_t, OUT>, grid, block, 0, stream, n_out, ld, \
                    x, xs, w, ws, y, accumulate);                           \
        break
    switch (n_tok) {
    GF8_CASE(1);
    GF8_CASE(2);
    GF8_CASE(3);
    GF8_CASE(4);
    GF8_CASE(5);
    GF8_CASE(6);
    GF8_CASE(7);
    GF8_CASE(8);
    default:
        break;
    }
#undef GF8_CASE
}

bt_status_t cuda_gemv_fp8(int n_tok, int n_out, int ld, const void *d_xv,
                          const float *d_xs, const uint8_t *d_wq,
                          const float *d_ws, void *d_y, cuda_dtype_t out_dt,
                          bool accumulate, cudaStream_t stream)
{
    if (!cuda_gemv_fp8_ok(n_tok, ld) || n_out <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 GEMV of %d tokens x %d rows (ld %d)", n_tok,
                        n_out, ld);
    KERN_DISPATCH_DT(out_dt, OUT,
                     gf8_launch<OUT>(n_tok, n_out, ld, (const bf16_t *)d_xv,
                                     d_xs, d_wq, d_ws, (OUT *)d_y,
                                     accumulate, stream));
    return BT_CUDA_LAUNCH_STATUS();
}
