/*
 * gemv_fp8.cu - the FP8 GEMV of decode steps (1-8 tokens, fp8.h): E4M3
 * weights times E4M3 inputs, f32 sums, times the token's scale and the
 * row's scale.  Memory-bound: the weights are read once.  The first
 * version (one warp a row, codes turned into f32 by the conversion unit,
 * an f32 FMA a weight) ran out of instruction issue at 1.6-3.2 TB/s; a
 * register-pipelined tensor-core version (2026-12-05) did not keep
 * enough bytes in flight (1.2-2.8 TB/s).  This one is gemv.cu's mma ring
 * for E4M3:
 *
 * - One block of RING_WARPS warps per SM takes the row groups [g0, g1)
 *   (16 rows each); for each group the warps split K into blocks of 64
 *   columns (64 bytes a row) and each streams its (group, k-block) units
 *   through a private cp.async ring of 4 KB stages (4 units a stage), so
 *   ~190 KB per SM are in flight, the first stages issued before the PDL
 *   wait (weights never depend on the previous kernel).
 * - Lane (g, q) = (lane / 4, lane % 4) copies bytes [16 q, 16 q + 16) of
 *   the block from rows g and g + 8, reads back only those (no warp
 *   barrier) and loads the same 16 bytes of token g's input codes.
 * - Codes become f16 by moving bits (gf8_f16x2: Marlin's trick, value x
 *   2^-8, exact, subnormals included) and meet in mma.m16n8k16 (f16 in,
 *   f32 sums).  A sum is permutation-free, so each lane's bytes are the
 *   k-slots of its own fragment registers and the input codes take the
 *   same permutation: nothing is shuffled.  Every product of two E4M3
 *   values is exact in the tensor core and the sums are f32, as in the
 *   cpu reference; the two 2^-8 come back as an exact 2^16.
 * - Tokens are the MMA's 8 columns: 1-8 tokens cost the same weight
 *   bytes; columns past n_tok multiply zeros.  The warps add their
 *   fragments into a shared (tokens x 16) buffer with atomics; two
 *   buffers alternate so one barrier per group suffices.
 *
 * Test: build-DIR/gpu/test_cuda_fp8 (against cpu__fp8_gemm_ref).
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"

#include "bt_util.h"
#include "kern_common.cuh"
#include "ring_common.cuh"

#define GF8_WARPS 8      /* warps of a block (one block per SM) */
#define GF8_PIECE 4096   /* bytes per warp per stage */
#define GF8_UNITS 4      /* units (16 rows x 64 bytes) per stage */
#define GF8_MAX_STAGES 8
#define GF8_ROWS 16      /* rows of a group (the MMA's M) */
#define GF8_KB 64        /* columns of a k-block: 4 lanes x 16 bytes */
#define GR_WARPS 4       /* WORKBENCH reg variant */
#define GR_UNROLL 4

/* WORKBENCH (2026-12-05): how codes become f16 (GF8_CONV_*), and which
 * kernel runs (BT_GF8=ring-int|ring-f2fp|ring-mix|reg, read once). */
#define GF8_CONV_INT 0  /* bit moves on the integer pipe */
#define GF8_CONV_F2FP 1 /* the conversion unit (cvt.f16x2.e4m3x2) */
#define GF8_CONV_MIX 2  /* words 0, 1 by F2FP, words 2, 3 by bits */

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

/* The same by the conversion unit, exact values: (b0, b1), (b2, b3). */
static __device__ __forceinline__ void gf8_cvt(uint32_t q, uint32_t &p01,
                                               uint32_t &p23)
{
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(q & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(q >> 16), __NV_E4M3);
    p01 = (uint32_t)lo.x | ((uint32_t)lo.y << 16);
    p23 = (uint32_t)hi.x | ((uint32_t)hi.y << 16);
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

/* One unit: the lane's 16 bytes of rows g (wa), g + 8 (wb) and of token
 * g's input (xv), four MMAs of 16 columns; word j of the lane's bytes
 * fills the k-slots (2q, 2q + 1) and (2q + 8, 2q + 9) of MMA j, for
 * weights and inputs alike.  Bit-moved words (x 2^-16 a product) sum
 * into d8, converted ones (exact) into d1. */
template <int CONV>
static __device__ __forceinline__ void gf8_unit(const uint4 &wa,
                                                const uint4 &wb,
                                                const uint4 &xv,
                                                float (&d8)[4],
                                                float (&d1)[4])
{
    const uint32_t qa[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t qb[4] = {wb.x, wb.y, wb.z, wb.w};
    const uint32_t qx[4] = {xv.x, xv.y, xv.z, xv.w};

#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a0, a1, b0, b1, x0, x1;
        const bool cvt = CONV == GF8_CONV_F2FP ||
                         (CONV == GF8_CONV_MIX && j < 2);

        if (cvt) {
            gf8_cvt(qa[j], a0, a1);
            gf8_cvt(qb[j], b0, b1);
            gf8_cvt(qx[j], x0, x1);
            gf8_mma(d1, a0, b0, a1, b1, x0, x1);
        } else {
            gf8_f16x2(qa[j], a0, a1);
            gf8_f16x2(qb[j], b0, b1);
            gf8_f16x2(qx[j], x0, x1);
            gf8_mma(d8, a0, b0, a1, b1, x0, x1);
        }
    }
}

/* Dynamic shared memory: the rings (GF8_WARPS x n_stages x GF8_PIECE),
 * the input codes (n_tok x ldp bytes, ldp = ld rounded up to GF8_KB,
 * zero padded), 2 x 8 x GF8_ROWS floats of sums. */
template <typename OUT, int CONV>
static __global__ void __launch_bounds__(GF8_WARPS * 32, 1)
gf8_kernel(int n_tok, int n_out, int ld, int n_stages, const uint8_t *xq,
           const float *xs, const uint8_t *w, const float *ws, OUT *y,
           bool accumulate)
{
    extern __shared__ __align__(128) unsigned char gf8_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lg = lane >> 2, col = 16 * (lane & 3);
    const int n_groups = (n_out + GF8_ROWS - 1) / GF8_ROWS;
    const int g0 = (int)((long long)blockIdx.x * n_groups / gridDim.x);
    const int g1 = (int)((long long)(blockIdx.x + 1) * n_groups / gridDim.x);
    const int ng = g1 - g0;
    const int KB = (ld + GF8_KB - 1) / GF8_KB, ldp = KB * GF8_KB;
    const int kb0 = KB * warp / GF8_WARPS;
    const int nk = KB * (warp + 1) / GF8_WARPS - kb0;
    const int nu = ng * nk;                         /* this warp's units */
    const int n_st = (nu + GF8_UNITS - 1) / GF8_UNITS; /* and stages */
    unsigned char *ring = gf8_sm + (size_t)warp * n_stages * GF8_PIECE;
    uint8_t *xsm = gf8_sm + (size_t)GF8_WARPS * n_stages * GF8_PIECE;
    float *red = reinterpret_cast<float *>(xsm + (size_t)n_tok * ldp);
    /* the next unit to issue: group ig, k-block ik (no divisions) */
    int ig = 0, ik = kb0;

    kern_pdl_trigger();
    /* Issues stage k (units k * GF8_UNITS .., in order).  A lane's 16
     * bytes are all in the row or all past ld (a multiple of 16): those
     * and rows past n_out are zero-filled. */
    auto issue = [&](int k) {
        unsigned char *dst = ring + (size_t)(k % n_stages) * GF8_PIECE;
#pragma unroll
        for (int ku = 0; ku < GF8_UNITS; ku++) {
            if (k * GF8_UNITS + ku < nu) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = (g0 + ig) * GF8_ROWS + lg + 8 * h;
                    const bool ok = row < n_out && ik * GF8_KB + col < ld;
                    tc_cp16(dst + (ku * 2 + h) * 512 + lane * 16,
                            w + (ok ? (size_t)row * ld + ik * GF8_KB + col
                                    : 0),
                            ok);
                }
                if (++ik == kb0 + nk) {
                    ik = kb0;
                    ig++;
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
    /* the input codes into shared memory, 16 bytes a thread at a time */
    for (int i = threadIdx.x; i < n_tok * (ldp / 16); i += blockDim.x) {
        const int t = i / (ldp / 16), c = (i - t * (ldp / 16)) * 16;
        *reinterpret_cast<uint4 *>(xsm + (size_t)t * ldp + c) =
            c < ld ? __ldg(reinterpret_cast<const uint4 *>(
                         xq + (size_t)t * ld + c))
                   : make_uint4(0, 0, 0, 0);
    }
    for (int i = threadIdx.x; i < 2 * 8 * GF8_ROWS; i += blockDim.x)
        red[i] = 0.0f;
    __syncthreads();

    const uint8_t *px = xsm + (size_t)(lg < n_tok ? lg : 0) * ldp + col;
    int uc = 0, buf = 0;
    for (int gi = 0; gi < ng; gi++) {
        float c8[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};

        for (int kb = kb0; kb < kb0 + nk; kb++, uc++) {
            const int k = uc / GF8_UNITS, ku = uc - k * GF8_UNITS;
            const uint4 *st = reinterpret_cast<const uint4 *>(
                ring + (size_t)(k % n_stages) * GF8_PIECE);
            const uint4 xv =
                lg < n_tok ? *reinterpret_cast<const uint4 *>(
                                 px + (size_t)kb * GF8_KB)
                           : make_uint4(0, 0, 0, 0);

            if (ku == 0)
                ring_cp_wait(n_stages - 1);
            gf8_unit<CONV>(st[(ku * 2 + 0) * 32 + lane],
                           st[(ku * 2 + 1) * 32 + lane], xv, c8, c1);
            if (ku == GF8_UNITS - 1 || uc == nu - 1) {
                issue(k + n_stages);
                tc_cp_commit();
            }
        }
        /* lane (g, q) holds rows g, g + 8 of tokens 2q, 2q + 1; 2^16
         * undoes the two 2^-8 of gf8_f16x2 (exact) */
        float *rb = red + buf * 8 * GF8_ROWS;
        if (nk > 0) {
            const int tok = 2 * (lane & 3);
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = c8[e] * 65536.0f + c1[e];
            if (tok < n_tok) {
                atomicAdd(&rb[tok * GF8_ROWS + lg], v[0]);
                atomicAdd(&rb[tok * GF8_ROWS + lg + 8], v[2]);
            }
            if (tok + 1 < n_tok) {
                atomicAdd(&rb[(tok + 1) * GF8_ROWS + lg], v[1]);
                atomicAdd(&rb[(tok + 1) * GF8_ROWS + lg + 8], v[3]);
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n_tok * GF8_ROWS; i += blockDim.x) {
            const int t = i / GF8_ROWS, r = i - t * GF8_ROWS;
            const int row = (g0 + gi) * GF8_ROWS + r;
            float v = rb[i];
            rb[i] = 0.0f;
            if (row < n_out) {
                OUT *o = y + (size_t)t * n_out + row;
                v = v * xs[t] * ws[row];
                if (accumulate)
                    v += kern_to_f(*o);
                *o = kern_from_f<OUT>(v);
            }
        }
        buf ^= 1;
    }
}

template <int T, typename OUT>
static __global__ void __launch_bounds__(GR_WARPS * 32)
gf8_reg_kernel(int n_out, int ld, const uint8_t *xq, const float *xs,
           const uint8_t *w, const float *ws, OUT *y, bool accumulate)
{
    __shared__ float red[GR_WARPS][GF8_ROWS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, col = 16 * (lane & 3);
    const int row0 = blockIdx.x * GF8_ROWS;
    const int ra = BT_MIN(row0 + g, n_out - 1);     /* rows past n_out: */
    const int rb = BT_MIN(row0 + g + 8, n_out - 1); /* read, dropped */
    const int n_ch = (ld + GF8_KB - 1) / GF8_KB;
    const uint8_t *pa = w + (size_t)ra * ld + col;
    const uint8_t *pb = w + (size_t)rb * ld + col;
    const uint8_t *px = xq + (size_t)(g < T ? g : 0) * ld + col;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 ca[GR_UNROLL], cb[GR_UNROLL];
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    /* chunk c holds this lane's bytes when 64 c + col < ld (ld is a
     * multiple of 16: a lane's 16 bytes are all in or all out) */
#define GF8_IN(c) ((c) < n_ch && GF8_KB * (c) + col < ld)
#define GF8_LD(p, c) \
    (GF8_IN(c) ? __ldcs(reinterpret_cast<const uint4 *>( \
                     (p) + (size_t)GF8_KB * (c))) : zero)
#pragma unroll
    for (int u = 0; u < GR_UNROLL; u++) {
        const int c = warp + GR_WARPS * u;
        ca[u] = GF8_LD(pa, c);
        cb[u] = GF8_LD(pb, c);
    }
    kern_pdl_wait();
    kern_pdl_trigger();
    for (int c0 = warp; c0 < n_ch; c0 += GR_WARPS * GR_UNROLL) {
        const int c1 = c0 + GR_WARPS * GR_UNROLL;
        uint4 na[GR_UNROLL], nb[GR_UNROLL];

#pragma unroll
        for (int u = 0; u < GR_UNROLL; u++) {
            const int c = c1 + GR_WARPS * u;
            na[u] = GF8_LD(pa, c);
            nb[u] = GF8_LD(pb, c);
        }
#pragma unroll
        for (int u = 0; u < GR_UNROLL; u++) {
            const int c = c0 + GR_WARPS * u;

            if (c < n_ch) { /* warp-uniform: the MMA needs every lane */
                const uint4 xv =
                    g < T && GF8_IN(c)
                        ? __ldg(reinterpret_cast<const uint4 *>(
                              px + (size_t)GF8_KB * c))
                        : zero;
                gf8_unit<0>(ca[u], cb[u], xv, d, d);
            }
        }
#pragma unroll
        for (int u = 0; u < GR_UNROLL; u++) {
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
            for (int k = 0; k < GR_WARPS; k++)
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


/* Shared memory beside the rings for n_tok tokens of ld codes. */
static size_t gf8_fixed(int n_tok, int ld)
{
    return (size_t)n_tok * ((ld + GF8_KB - 1) / GF8_KB * GF8_KB) +
           (size_t)2 * 8 * GF8_ROWS * 4 + 128;
}

/* Stages that fit beside them (the ring needs 2). */
static int gf8_stages(int n_tok, int ld)
{
    size_t fixed = gf8_fixed(n_tok, ld), budget = ring_smem_budget();

    if (fixed >= budget)
        return 0;
    return (int)BT_MIN((size_t)GF8_MAX_STAGES,
                       (budget - fixed) / ((size_t)GF8_WARPS * GF8_PIECE));
}

bool cuda_gemv_fp8_ok(int n_tok, int ld)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_FP8_MAX_TOK && ld > 0 &&
           ld % 16 == 0 && gf8_stages(n_tok, ld) >= 2;
}

/* WORKBENCH: BT_GF8, read once. */
static int gf8_variant(void)
{
    static int v = -1;

    if (v < 0) {
        const char *e = getenv("BT_GF8");
        v = e == NULL ? 0 : strcmp(e, "ring-f2fp") == 0 ? 1
                          : strcmp(e, "ring-mix") == 0  ? 2
                          : strcmp(e, "reg") == 0       ? 3
                                                        : 0;
    }
    return v;
}

template <typename OUT, int CONV>
static cudaError_t gf8_ring_launch(int n_tok, int n_out, int ld,
                                   const uint8_t *xq, const float *xs,
                                   const uint8_t *w, const float *ws, OUT *y,
                                   bool accumulate, cudaStream_t stream)
{
    auto k = gf8_kernel<OUT, CONV>;
    const int n_groups = (n_out + GF8_ROWS - 1) / GF8_ROWS;
    const int blocks = BT_MIN(ring_n_sm(), n_groups);
    const int stages = gf8_stages(n_tok, ld);
    const size_t smem = (size_t)GF8_WARPS * stages * GF8_PIECE +
                        gf8_fixed(n_tok, ld) - 128;
    cudaError_t err =
        ring_smem_attr(k, CONV * 2 + (sizeof(OUT) == 4 ? 1 : 0));

    if (err != cudaSuccess)
        return err;
    kern_launch(k, blocks, GF8_WARPS * 32, smem, stream, n_tok, n_out, ld,
                stages, xq, xs, w, ws, y, accumulate);
    return cudaSuccess;
}

template <typename OUT>
static cudaError_t gf8_launch(int n_tok, int n_out, int ld,
                              const uint8_t *xq, const float *xs,
                              const uint8_t *w, const float *ws, OUT *y,
                              bool accumulate, cudaStream_t stream)
{
    switch (gf8_variant()) {
    case 1:
        return gf8_ring_launch<OUT, GF8_CONV_F2FP>(n_tok, n_out, ld, xq, xs,
                                                   w, ws, y, accumulate,
                                                   stream);
    case 2:
        return gf8_ring_launch<OUT, GF8_CONV_MIX>(n_tok, n_out, ld, xq, xs,
                                                  w, ws, y, accumulate,
                                                  stream);
    case 3: {
        const dim3 grid((n_out + GF8_ROWS - 1) / GF8_ROWS);
#define GR_CASE(_t)                                                          \
    case _t:                                                                 \
        kern_launch(gf8_reg_kernel<_t, OUT>, grid, dim3(GR_WARPS * 32), 0,   \
                    stream, n_out, ld, xq, xs, w, ws, y, accumulate);        \
        break
        switch (n_tok) {
        GR_CASE(1);
        GR_CASE(2);
        GR_CASE(3);
        GR_CASE(4);
        GR_CASE(5);
        GR_CASE(6);
        GR_CASE(7);
        GR_CASE(8);
        default:
            break;
        }
#undef GR_CASE
        return cudaSuccess;
    }
    default:
        return gf8_ring_launch<OUT, GF8_CONV_INT>(n_tok, n_out, ld, xq, xs,
                                                  w, ws, y, accumulate,
                                                  stream);
    }
}

bt_status_t cuda_gemv_fp8(int n_tok, int n_out, int ld, const uint8_t *d_xq,
                          const float *d_xs, const uint8_t *d_wq,
                          const float *d_ws, void *d_y, cuda_dtype_t out_dt,
                          bool accumulate, cudaStream_t stream)
{
    if (!cuda_gemv_fp8_ok(n_tok, ld) || n_out <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 GEMV of %d tokens x %d rows (ld %d)", n_tok,
                        n_out, ld);
    cudaError_t err = cudaSuccess;

    KERN_DISPATCH_DT(out_dt, OUT,
                     err = gf8_launch<OUT>(n_tok, n_out, ld, d_xq, d_xs,
                                           d_wq, d_ws, (OUT *)d_y,
                                           accumulate, stream));
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}
