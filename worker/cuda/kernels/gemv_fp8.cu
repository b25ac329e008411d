/*
 * gemv_fp8.cu - the FP8 GEMV of decode steps (1-8 tokens, fp8.h): E4M3
 * weights times E4M3 inputs, f32 sums, times the token's scale and the
 * row's scale.  Memory-bound (the weights are read once) but with work
 * per byte to turn codes into numbers; two kernels, by token count
 * (workbench of 2026-12-05 on the H200, PERFORMANCE.md "FP8 on the GPU"),
 * and the 1-token one with its input made inside:
 *
 * - rows (1 token): gemv.cu's rows kernel.  One warp per output row,
 *   lanes walking the row in 16-byte chunks (16 codes), U chunks per
 *   lane loaded ahead of the ones multiplied, the first before the
 *   programmatic-dependent-launch wait (weights never depend on the
 *   previous kernel); codes become floats through the conversion unit
 *   (e4m3x2 -> f16x2, exact), the input is its bf16 values (exact), an
 *   f32 FMA a weight, a warp sum.  35.8 us for gate/up (3.3 TB/s).
 * - mma (2-8 tokens, or 1 without bf16 values; gemm_fp8.c routes 2-8
 *   to the skinny FP8 GEMM where wgmma runs, 22-45% faster, so this is
 *   the fallback of devices without it): the tensor cores, which
 *   make 8 tokens cost what 1 costs (the rows kernel's work grows with
 *   each token: 146 us for gate/up at 8 tokens, this one 46).  A block
 *   owns 16 rows; its 4 warps split the row's 64-column chunks and add
 *   their sums in shared memory.  Lane (g, t) = (lane / 4, lane % 4)
 *   loads 16 bytes of rows g and g + 8 and the same 16 bytes of token
 *   g's codes; codes become f16 by moving bits (gf8_f16x2: Marlin's
 *   trick, value x 2^-8, exact, subnormals included) and meet in
 *   mma.m16n8k16 (f16 in, f32 sums).  A sum is permutation-free, so each
 *   lane's bytes are the k-slots of its own fragment registers and the
 *   input codes take the same permutation: nothing is shuffled.
 * - fused (1 token, cuda_gemv_fp8_fused): the rows kernel making its own
 *   input.  A 1-token step in precision fp8 (CUPTI, H100, llama3-8b,
 *   119 us a layer) had a one-block producer in front of each of the 4
 *   GEMVs (quant_fp8.cu: RMSNorm / SwiGLU / the bf16 row, quantized),
 *   ~30 us a layer on the critical path (the SwiGLU's 14,336-wide row
 *   16 us): ~1 ms of a 4.6 ms step.  As gemv.cu's fused norm does for
 *   bf16, every block (16 warps, 512 threads, one wave of blocks)
 *   computes the row after the PDL wait into shared memory (2 ld bytes),
 *   quantizes it there with its scale (static, or a block max) and runs
 *   the rows kernel's loop on it, a warp a row, grid-stride: the two
 *   kernels' arithmetic step by step, the norm's sum of squares in
 *   qf8_vec_kernel's order (quant_fp8.cuh), so the outputs are bit for
 *   bit the two-kernel path's wherever that path takes qf8_vec_kernel
 *   (inputs of at most 16,384 columns).  Not measured yet.
 * Every product of two E4M3 values is exact in either kernel and the
 * sums are f32, as in the cpu reference.  Lost in the workbench: gemv.cu's
 * persistent shared-memory ring on the tensor cores (4.8-5.0 ms a 1-token
 * step against 3.9: the integer pipe converting codes, not the memory,
 * bounds it), the conversion unit instead of bit moves inside the mma
 * kernel (no gain).
 *
 * Test: build-DIR/gpu/test_cuda_fp8 (against cpu__fp8_gemm_ref; fused
 * against the two kernels, "fp8 fused gemv").
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fp8.h"
#include "fp8_cvt.cuh"

#include "bt_fp8.h"
#include "bt_util.h"
#include "kern_common.cuh"
#include "quant_fp8.cuh"

#define GF8_ROWS_WARPS 8  /* rows: warps (= rows) of a block */
#define GF8_ROWS_UNROLL 4 /* rows: chunks a lane has in flight, twice */
#define GF8_MMA_WARPS 4   /* mma: warps of a block, splitting a row */
#define GF8_MMA_UNROLL 4  /* mma: chunks a lane has in flight, twice */
#define GF8_ROWS 16       /* mma: rows of a block (the MMA's M) */
#define GF8_CHUNK 64      /* mma: columns of a chunk, 4 lanes x 16 bytes */

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

/* Multiply-adds chunk c (16 columns) of the row into the T sums; the
 * input x in shared memory (SH: the fused kernel's) or global. */
template <int T, bool SH>
static __device__ __forceinline__ void gf8_rows_chunk(const uint4 &wv,
                                                 const bf16_t *x, int ld,
                                                 int c, float *acc)
{
    float wf[16];

    gf8_codes(wv, wf);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xp =
            reinterpret_cast<const uint4 *>(x + (size_t)t * ld + 16 * c);
        const uint4 x0 = SH ? xp[0] : __ldg(xp);
        const uint4 x1 = SH ? xp[1] : __ldg(xp + 1);
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

/* The rows kernels' first loads: the lane's first GF8_ROWS_UNROLL chunks
 * lane, lane + 32, ... of the row wr (n_tot chunks; none past it). */
static __device__ __forceinline__ void gf8_rows_first(
    const uint4 *wr, int n_tot, int lane, uint4 (&cur)[GF8_ROWS_UNROLL])
{
#pragma unroll
    for (int u = 0; u < GF8_ROWS_UNROLL; u++) {
        const int c = lane + 32 * u;
        cur[u] = c < n_tot ? __ldcs(wr + c) : make_uint4(0, 0, 0, 0);
    }
}

/* The rows kernels' loop: the lane's chunks of the row wr times the T
 * input rows x into acc, chunk by chunk in the same order in both
 * kernels (cur: gf8_rows_first's loads). */
template <int T, bool SH>
static __device__ __forceinline__ void gf8_rows_loop(
    const uint4 *wr, int n_tot, int lane, uint4 (&cur)[GF8_ROWS_UNROLL],
    const bf16_t *x, int ld, float *acc)
{
    for (int c0 = lane; c0 < n_tot; c0 += 32 * GF8_ROWS_UNROLL) {
        uint4 nxt[GF8_ROWS_UNROLL];
        const int c1 = c0 + 32 * GF8_ROWS_UNROLL;
#pragma unroll
        for (int u = 0; u < GF8_ROWS_UNROLL; u++)
            nxt[u] = c1 + 32 * u < n_tot ? __ldcs(wr + c1 + 32 * u)
                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GF8_ROWS_UNROLL; u++)
            if (c0 + 32 * u < n_tot)
                gf8_rows_chunk<T, SH>(cur[u], x, ld, c0 + 32 * u, acc);
#pragma unroll
        for (int u = 0; u < GF8_ROWS_UNROLL; u++)
            cur[u] = nxt[u];
    }
}

template <int T, typename OUT>
static __global__ void __launch_bounds__(GF8_ROWS_WARPS * 32, 4)
gf8_rows_kernel(int n_out, int ld, const bf16_t *x, const float *xs,
           const uint8_t *w, const float *ws, OUT *y, bool accumulate)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GF8_ROWS_WARPS + (threadIdx.x >> 5);
    const uint4 *wr = reinterpret_cast<const uint4 *>(
        w + (size_t)(row < n_out ? row : 0) * ld);
    const int n_tot = row < n_out ? ld / 16 : 0;
    uint4 cur[GF8_ROWS_UNROLL];
    float acc[T];

    gf8_rows_first(wr, n_tot, lane, cur);
    kern_pdl_wait();
    kern_pdl_trigger();
    if (row >= n_out)
        return;
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    gf8_rows_loop<T, false>(wr, n_tot, lane, cur, x, ld, acc);
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

/* Four E4M3 codes b0..b3 as two f16x2 of value x 2^-8: (b0, b2), (b1,
 * b3).  The code's sign, exponent and mantissa land in the f16's sign,
 * low exponent bits and high mantissa bits; the biases differ by 8. */
static __device__ __forceinline__ void gf8_f16x2(uint32_t q, uint32_t &p02,
                                                 uint32_t &p13)
{
    p13 = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 1);
    q <<= 8;
    p02 = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 1);
}

/* d += A (16 x 16, rows g and g + 8) . B (16 x 8, column g), f16 in. */
static __device__ __forceinline__ void gf8_mma(float (&d)[4], uint32_t a0,
                                               uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0,
                                               uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk: the lane's 16 bytes of rows g (wa), g + 8 (wb) and of token
 * g's input (xv), four MMAs of 16 columns.  Word j of the lane's bytes
 * gives the k-slots (2t, 2t + 1) <- bytes (4j, 4j + 2) and (2t + 8, 2t +
 * 9) <- bytes (4j + 1, 4j + 3) of MMA j, for weights and inputs alike. */
static __device__ __forceinline__ void gf8_mma_chunk(const uint4 &wa,
                                                 const uint4 &wb,
                                                 const uint4 &xv,
                                                 float (&d)[4])
{
    const uint32_t qa[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t qb[4] = {wb.x, wb.y, wb.z, wb.w};
    const uint32_t qx[4] = {xv.x, xv.y, xv.z, xv.w};

#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a02, a13, b02, b13, x02, x13;

        gf8_f16x2(qa[j], a02, a13);
        gf8_f16x2(qb[j], b02, b13);
        gf8_f16x2(qx[j], x02, x13);
        gf8_mma(d, a02, b02, a13, b13, x02, x13);
    }
}

template <int T, typename OUT>
static __global__ void __launch_bounds__(GF8_MMA_WARPS * 32)
gf8_mma_kernel(int n_out, int ld, const uint8_t *xq, const float *xs,
           const uint8_t *w, const float *ws, OUT *y, bool accumulate)
{
    __shared__ float red[GF8_MMA_WARPS][GF8_ROWS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, col = 16 * (lane & 3);
    const int row0 = blockIdx.x * GF8_ROWS;
    const int ra = BT_MIN(row0 + g, n_out - 1);     /* rows past n_out: */
    const int rb = BT_MIN(row0 + g + 8, n_out - 1); /* read, dropped */
    const int n_ch = (ld + GF8_CHUNK - 1) / GF8_CHUNK;
    const uint8_t *pa = w + (size_t)ra * ld + col;
    const uint8_t *pb = w + (size_t)rb * ld + col;
    const uint8_t *px = xq + (size_t)(g < T ? g : 0) * ld + col;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 ca[GF8_MMA_UNROLL], cb[GF8_MMA_UNROLL];
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    /* chunk c holds this lane's bytes when 64 c + col < ld (ld is a
     * multiple of 16: a lane's 16 bytes are all in or all out) */
#define GF8_IN(c) ((c) < n_ch && GF8_CHUNK * (c) + col < ld)
#define GF8_LD(p, c) \
    (GF8_IN(c) ? __ldcs(reinterpret_cast<const uint4 *>( \
                     (p) + (size_t)GF8_CHUNK * (c))) : zero)
#pragma unroll
    for (int u = 0; u < GF8_MMA_UNROLL; u++) {
        const int c = warp + GF8_MMA_WARPS * u;
        ca[u] = GF8_LD(pa, c);
        cb[u] = GF8_LD(pb, c);
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    for (int c0 = warp; c0 < n_ch; c0 += GF8_MMA_WARPS * GF8_MMA_UNROLL) {
        const int c1 = c0 + GF8_MMA_WARPS * GF8_MMA_UNROLL;
        uint4 na[GF8_MMA_UNROLL], nb[GF8_MMA_UNROLL];

#pragma unroll
        for (int u = 0; u < GF8_MMA_UNROLL; u++) {
            const int c = c1 + GF8_MMA_WARPS * u;
            na[u] = GF8_LD(pa, c);
            nb[u] = GF8_LD(pb, c);
        }
#pragma unroll
        for (int u = 0; u < GF8_MMA_UNROLL; u++) {
            const int c = c0 + GF8_MMA_WARPS * u;

            if (c < n_ch) { /* warp-uniform: the MMA needs every lane */
                const uint4 xv =
                    g < T && GF8_IN(c)
                        ? __ldg(reinterpret_cast<const uint4 *>(
                              px + (size_t)GF8_CHUNK * c))
                        : zero;
                gf8_mma_chunk(ca[u], cb[u], xv, d);
            }
        }
#pragma unroll
        for (int u = 0; u < GF8_MMA_UNROLL; u++) {
            ca[u] = na[u];
            cb[u] = nb[u];
        }
    }
#undef GF8_LD
#undef GF8_IN
    /* lane (g, t) holds rows g, g + 8 of tokens 2t, 2t + 1 */
    {
        const int t2 = 2 * (lane & 3);
        red[warp][g][t2] = d[0];
        red[warp][g][t2 + 1] = d[1];
        red[warp][g + 8][t2] = d[2];
        red[warp][g + 8][t2 + 1] = d[3];
    }
    __syncthreads();
    if ((int)threadIdx.x < GF8_ROWS * T) {
        const int t = threadIdx.x / GF8_ROWS, r = threadIdx.x % GF8_ROWS;
        const int row = row0 + r;

        if (row < n_out) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < GF8_MMA_WARPS; k++)
                s += red[k][r][t];
            /* 2^16 undoes the two 2^-8 of gf8_f16x2 (exact) */
            float v = s * 65536.0f * xs[t] * ws[row];
            OUT *o = y + (size_t)t * n_out + row;
            if (accumulate)
                v += kern_to_f(*o);
            *o = kern_from_f<OUT>(v);
        }
    }
}

bool cuda_gemv_fp8_ok(int n_tok, int ld)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_FP8_MAX_TOK && ld > 0 &&
           ld % 16 == 0;
}

template <typename OUT>
static void gf8_launch(int n_tok, int n_out, int ld, const uint8_t *xq,
                       const bf16_t *xv, const float *xs, const uint8_t *w,
                       const float *ws, OUT *y, bool accumulate,
                       cudaStream_t stream)
{
    if (n_tok == 1 && xv != NULL) {
        kern_launch(gf8_rows_kernel<1, OUT>,
                    dim3((n_out + GF8_ROWS_WARPS - 1) / GF8_ROWS_WARPS),
                    dim3(GF8_ROWS_WARPS * 32), 0, stream, n_out, ld, xv, xs,
                    w, ws, y, accumulate);
        return;
    }
    const dim3 grid((n_out + GF8_ROWS - 1) / GF8_ROWS);
    const dim3 block(GF8_MMA_WARPS * 32);

#define GF8_CASE(_t)                                                         \
    case _t:                                                                 \
        kern_launch(gf8_mma_kernel<_t, OUT>, grid, block, 0, stream, n_out,  \
                    ld, xq, xs, w, ws, y, accumulate);                       \
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

bt_status_t cuda_gemv_fp8(int n_tok, int n_out, int ld, const uint8_t *d_xq,
                          const void *d_xv, const float *d_xs,
                          const uint8_t *d_wq, const float *d_ws, void *d_y,
                          cuda_dtype_t out_dt, bool accumulate,
                          cudaStream_t stream)
{
    if (!cuda_gemv_fp8_ok(n_tok, ld) || n_out <= 0 ||
        (d_xq == NULL && !(n_tok == 1 && d_xv != NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 GEMV of %d tokens x %d rows (ld %d)", n_tok,
                        n_out, ld);
    KERN_DISPATCH_DT(out_dt, OUT,
                     gf8_launch<OUT>(n_tok, n_out, ld, d_xq,
                                     (const bf16_t *)d_xv, d_xs, d_wq, d_ws,
                                     (OUT *)d_y, accumulate, stream));
    return BT_CUDA_LAUNCH_STATUS();
}

/* ---- The fused 1-token GEMV (cuda_gemv_fp8_fused) ----
 * The rows kernel with its input made in the block: after the PDL wait
 * (the weights' first chunks are already in flight) the block's
 * QF8_VEC_THREADS threads compute the row (RMSNorm, SwiGLU or the bf16
 * row itself), its scale (a block max) and the bf16 values of its codes
 * into shared memory (2 ld bytes: 8 KB for dim 4096, 28 KB for hid
 * 14336), then each warp runs gf8_rows_loop over it, row after row.  One
 * wave of blocks (GF8_FUSED_BLOCKS a multiprocessor, the rows kernel's
 * 32 warps), so the row is made once per block, 264 times on an H100
 * rather than n_out / 16 (1,792 for gate|up), from L2 (8-56 KB of
 * inputs), while the first 32 KB of the block's weights load; the
 * one-block producer (4-16 us a linear, on the critical path between
 * GEMVs) is gone. */
#define GF8_FUSED_WARPS (QF8_VEC_THREADS / 32) /* warps (= rows) a block */
#define GF8_FUSED_BLOCKS 2 /* blocks a multiprocessor holds (64 registers) */
#define GF8_FUSED_SMEM_MAX (64 << 10) /* the row's bytes at most */

/* Values i..i+7 of the input row as `in` makes them (zeros past k, the
 * padding): the producers' own arithmetic (quant_fp8.cuh). */
template <int IN>
static __device__ __forceinline__ void gf8_in8(const void *x,
                                               const bf16_t *g, float ninv,
                                               int k, int i, float (&v)[8])
{
    if (i >= k) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = 0.0f;
    } else if (IN == CUDA_FP8_IN_NORM) {
        float gv[8];

        kern_load_vec<float, 8>(static_cast<const float *>(x) + i, v);
        kern_load_vec<bf16_t, 8>(g + i, gv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = qf8_norm_val(gv[e], ninv, v[e]);
    } else if (IN == CUDA_FP8_IN_GLU) {
        const bf16_t *gu = static_cast<const bf16_t *>(x);
        float u[8];

        kern_load_vec<bf16_t, 8>(gu + i, v);
        kern_load_vec<bf16_t, 8>(gu + k + i, u);
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = qf8_glu_val(v[e], u[e]);
    } else {
        kern_load_vec<bf16_t, 8>(static_cast<const bf16_t *>(x) + i, v);
    }
}

/* 1 / rms of the f32 row x (k) in qf8_vec_kernel's order: thread t adds
 * chunks t, t + QF8_VEC_THREADS, ... of 8 squares, then the block sum
 * (so the norm is bit for bit the two-kernel path's). */
static __device__ __forceinline__ float gf8_norm_inv(const float *x, int k,
                                                     float eps, float *red)
{
    float ss = 0.0f;

    for (int i = 8 * threadIdx.x; i < k; i += 8 * QF8_VEC_THREADS) {
        float v[8];

        kern_load_vec<float, 8>(x + i, v);
#pragma unroll
        for (int e = 0; e < 8; e++)
            ss += v[e] * v[e];
    }
    ss = kern_block_sum(ss, red);
    return 1.0f / sqrtf(ss / (float)k + eps);
}

/* The row in shared memory (ld values, each thread its chunks of 8 as
 * gf8_fused_kernel made them) -> the bf16 values of its E4M3 codes
 * bt_f32_to_e4m3(v * inv), qf8_vec_kernel's xv (the padding's zeros stay
 * zeros), through the same hardware conversions. */
static __device__ __forceinline__ void gf8_quant_row(bf16_t *xr, int ld,
                                                     float inv)
{
    for (int i = 8 * threadIdx.x; i < ld; i += 8 * QF8_VEC_THREADS) {
        uint4 *p = reinterpret_cast<uint4 *>(xr + i);
        uint4 u = *p;
        bf16_t *e = reinterpret_cast<bf16_t *>(&u);

        float f[8];

#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] = __bfloat162float(e[j]) * inv;
        /* Hopper's cvt (fp8_cvt.cuh: bt's codes and values bit for bit) */
        const uint2 lo = fp8_e4m3x4_to_bf16x4(
                        fp8_e4m3x4(f[0], f[1], f[2], f[3])),
                    hi = fp8_e4m3x4_to_bf16x4(
                        fp8_e4m3x4(f[4], f[5], f[6], f[7]));
        *p = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
}

/* Row `row` of the weights w (ld bytes a row) as chunks, and their count
 * (0 past n_out: the row is read as row 0's first chunks, never used). */
static __device__ __forceinline__ const uint4 *gf8_row(const uint8_t *w,
                                                      int row, int n_out,
                                                      int ld, int &n_tot)
{
    n_tot = row < n_out ? ld / 16 : 0;
    return reinterpret_cast<const uint4 *>(
        w + (size_t)(row < n_out ? row : 0) * ld);
}

/* Grid-stride over the rows: warp j of the grid takes rows j, j + the
 * grid's warps, ..., so the row is made once per block, not once per 16
 * rows; the next row's first chunks are loaded before the sum and store
 * of the current one. */
template <int IN, typename OUT>
static __global__ void __launch_bounds__(QF8_VEC_THREADS, GF8_FUSED_BLOCKS)
gf8_fused_kernel(int n_out, int k, int ld, const void *x, const bf16_t *g,
                 float eps, float in_scale, const uint8_t *w,
                 const float *ws, OUT *y, bool accumulate)
{
    extern __shared__ uint4 gf8_row_sh[]; /* the input row, ld values */
    __shared__ float red[32];
    bf16_t *xr = reinterpret_cast<bf16_t *>(gf8_row_sh);
    const int lane = threadIdx.x & 31;
    int row = blockIdx.x * GF8_FUSED_WARPS + (threadIdx.x >> 5), n_tot;
    const uint4 *wr = gf8_row(w, row, n_out, ld, n_tot);
    uint4 cur[GF8_ROWS_UNROLL];
    float ninv = 0.0f, amax = 0.0f, s = in_scale;

    gf8_rows_first(wr, n_tot, lane, cur);
    kern_pdl_wait();
    kern_pdl_trigger();
    if (IN == CUDA_FP8_IN_NORM)
        ninv = gf8_norm_inv(static_cast<const float *>(x), k, eps, red);
    /* 1-4 chunks a thread (dim to hid): their loads in flight together,
     * but the bf16 row's unrolled loop spills at 64 registers */
#pragma unroll(IN == CUDA_FP8_IN_ROWS ? 1 : 4)
    for (int i = 8 * threadIdx.x; i < ld; i += 8 * QF8_VEC_THREADS) {
        float v[8];
        uint4 u;
        bf16_t *e = reinterpret_cast<bf16_t *>(&u);

        gf8_in8<IN>(x, g, ninv, k, i, v);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            amax = fmaxf(amax, fabsf(v[j]));
            e[j] = __float2bfloat16_rn(v[j]); /* exact: v is a bf16 */
        }
        *reinterpret_cast<uint4 *>(xr + i) = u;
    }
    if (!(s > 0.0f))
        s = bt_fp8_scale(qf8_block_max(amax, red));
    gf8_quant_row(xr, ld, 1.0f / s);
    __syncthreads();
    for (; row < n_out; row += gridDim.x * GF8_FUSED_WARPS) {
        float acc[1] = {0.0f};

        gf8_rows_loop<1, true>(wr, n_tot, lane, cur, xr, ld, acc);
        wr = gf8_row(w, row + gridDim.x * GF8_FUSED_WARPS, n_out, ld,
                     n_tot);
        gf8_rows_first(wr, n_tot, lane, cur);
        acc[0] = kern_warp_sum(acc[0]);
        if (lane == 0) { /* gf8_rows_kernel's epilogue, xs[0] = s */
            float v = acc[0] * s * ws[row];
            OUT *d = y + row;
            if (accumulate)
                v += kern_to_f(*d);
            *d = kern_from_f<OUT>(v);
        }
    }
}

/* Raises gf8_fused_kernel<IN, OUT>'s shared-memory limit to
 * GF8_FUSED_SMEM_MAX, once per device. */
template <int IN, typename OUT>
static cudaError_t gf8_fused_attr(void)
{
    static uint64_t attr_done; /* bit per device */

    return kern_smem_limit_once(gf8_fused_kernel<IN, OUT>,
                                GF8_FUSED_SMEM_MAX, &attr_done);
}

template <int IN, typename OUT>
static cudaError_t gf8_fused_launch(int n_out, int k, int ld, const void *x,
                                    const bf16_t *g, float eps,
                                    float in_scale, const uint8_t *w,
                                    const float *ws, OUT *y, bool accumulate,
                                    cudaStream_t stream)
{
    const cudaError_t err = gf8_fused_attr<IN, OUT>();
    const int n_sm = kern_sm_count();

    if (err != cudaSuccess)
        return err;
    if (n_sm <= 0)
        return cudaErrorInvalidValue;
    /* one wave of blocks at most: each makes the row once */
    const int blocks = BT_MIN((n_out + GF8_FUSED_WARPS - 1) / GF8_FUSED_WARPS,
                              GF8_FUSED_BLOCKS * n_sm);
    kern_launch(gf8_fused_kernel<IN, OUT>, dim3(blocks),
                dim3(QF8_VEC_THREADS), (size_t)ld * sizeof(bf16_t), stream,
                n_out, k, ld, x, g, eps, in_scale, w, ws, y, accumulate);
    return cudaSuccess;
}

bool cuda_gemv_fp8_fused_ok(cuda_fp8_in_t in, const void *d_in,
                            const void *d_g, int n_in, int ld)
{
    return n_in > 0 && n_in % 8 == 0 && ld == cuda_fp8_ld(n_in) &&
           (size_t)ld * sizeof(bf16_t) <= GF8_FUSED_SMEM_MAX &&
           (uintptr_t)d_in % 16 == 0 &&
           (in != CUDA_FP8_IN_NORM || (uintptr_t)d_g % 16 == 0);
}

bt_status_t cuda_gemv_fp8_fused(cuda_fp8_in_t in, const void *d_in,
                                const void *d_g, float eps, int n_in, int ld,
                                float in_scale, const uint8_t *d_wq,
                                const float *d_ws, int n_out, void *d_y,
                                cuda_dtype_t out_dt, bool accumulate,
                                cudaStream_t stream)
{
    const bf16_t *g = static_cast<const bf16_t *>(d_g);
    cudaError_t err = cudaSuccess;

    if (!cuda_gemv_fp8_fused_ok(in, d_in, d_g, n_in, ld) || n_out <= 0 ||
        in_scale < 0.0f || d_in == NULL ||
        (in == CUDA_FP8_IN_NORM && d_g == NULL))
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fused fp8 GEMV of %d rows (input %d, %d columns, "
                        "ld %d)", n_out, (int)in, n_in, ld);
#define GF8_FUSED_CASE(IN)                                                   \
    KERN_DISPATCH_DT(out_dt, OUT,                                            \
                     (err = gf8_fused_launch<IN, OUT>(                       \
                          n_out, n_in, ld, d_in, g, eps, in_scale, d_wq,     \
                          d_ws, (OUT *)d_y, accumulate, stream)))
    if (in == CUDA_FP8_IN_NORM)
        GF8_FUSED_CASE(CUDA_FP8_IN_NORM);
    else if (in == CUDA_FP8_IN_GLU)
        GF8_FUSED_CASE(CUDA_FP8_IN_GLU);
    else
        GF8_FUSED_CASE(CUDA_FP8_IN_ROWS);
#undef GF8_FUSED_CASE
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_gemv_fp8_fused_prepare(void)
{
    cudaError_t err = cudaSuccess;

#define GF8_FUSED_ATTR(IN)                                                   \
    if (err == cudaSuccess)                                                  \
        err = gf8_fused_attr<IN, float>();                                   \
    if (err == cudaSuccess)                                                  \
        err = gf8_fused_attr<IN, bf16_t>()
    GF8_FUSED_ATTR(CUDA_FP8_IN_ROWS);
    GF8_FUSED_ATTR(CUDA_FP8_IN_NORM);
    GF8_FUSED_ATTR(CUDA_FP8_IN_GLU);
#undef GF8_FUSED_ATTR
    return BT_CUDA_STATUS(err);
}
