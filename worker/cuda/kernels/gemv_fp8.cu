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

/* One unit: the lane's 16 bytes of rows g (wa), g + 8 (wb) and of token
 * g's input (xv), four MMAs of 16 columns.  Word j of the lane's bytes
 * gives the k-slots (2q, 2q + 1) <- bytes (4j, 4j + 2) and (2q + 8, 2q +
 * 9) <- bytes (4j + 1, 4j + 3) of MMA j, for weights and inputs alike. */
static __device__ __forceinline__ void gf8_unit(const uint4 &wa,
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

/* Dynamic shared memory: the rings (GF8_WARPS x n_stages x GF8_PIECE),
 * then 2 x 8 x GF8_ROWS floats of sums. */
template <typename OUT>
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
    const int KB = (ld + GF8_KB - 1) / GF8_KB;
    const int kb0 = KB * warp / GF8_WARPS;
    const int nk = KB * (warp + 1) / GF8_WARPS - kb0;
    const int nu = ng * nk;                         /* this warp's units */
    const int n_st = (nu + GF8_UNITS - 1) / GF8_UNITS; /* and stages */
    unsigned char *ring = gf8_sm + (size_t)warp * n_stages * GF8_PIECE;
    float *red = reinterpret_cast<float *>(
        gf8_sm + (size_t)GF8_WARPS * n_stages * GF8_PIECE);
    const uint8_t *px = xq + (size_t)(lg < n_tok ? lg : 0) * ld + col;

    kern_pdl_trigger();
    /* Issues stage k: units k * GF8_UNITS .. of this warp.  A lane's 16
     * bytes are all in the row or all past ld (a multiple of 16): those
     * and rows past n_out are zero-filled. */
    auto issue = [&](int k) {
        unsigned char *dst = ring + (size_t)(k % n_stages) * GF8_PIECE;
#pragma unroll
        for (int ku = 0; ku < GF8_UNITS; ku++) {
            const int u = k * GF8_UNITS + ku;
            if (u < nu) {
                const int gi = u / nk;
                const int kb = kb0 + (u - gi * nk);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = (g0 + gi) * GF8_ROWS + lg + 8 * h;
                    const bool ok = row < n_out && kb * GF8_KB + col < ld;
                    tc_cp16(dst + (ku * 2 + h) * 512 + lane * 16,
                            w + (ok ? (size_t)row * ld + kb * GF8_KB + col
                                    : 0),
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
    for (int i = threadIdx.x; i < 2 * 8 * GF8_ROWS; i += blockDim.x)
        red[i] = 0.0f;
    __syncthreads();

    int uc = 0, buf = 0;
    for (int gi = 0; gi < ng; gi++) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};

        for (int kb = kb0; kb < kb0 + nk; kb++, uc++) {
            const int k = uc / GF8_UNITS, ku = uc - k * GF8_UNITS;
            const uint4 *st = reinterpret_cast<const uint4 *>(
                ring + (size_t)(k % n_stages) * GF8_PIECE);
            const bool xin = lg < n_tok && kb * GF8_KB + col < ld;
            const uint4 xv = xin ? __ldg(reinterpret_cast<const uint4 *>(
                                       px + (size_t)kb * GF8_KB))
                                 : make_uint4(0, 0, 0, 0);

            if (ku == 0)
                ring_cp_wait(n_stages - 1);
            gf8_unit(st[(ku * 2 + 0) * 32 + lane],
                     st[(ku * 2 + 1) * 32 + lane], xv, c);
            if (ku == GF8_UNITS - 1 || uc == nu - 1) {
                issue(k + n_stages);
                tc_cp_commit();
            }
        }
        /* lane (g, q) holds rows g, g + 8 of tokens 2q, 2q + 1 */
        float *rb = red + buf * 8 * GF8_ROWS;
        if (nk > 0) {
            const int tok = 2 * (lane & 3);
            if (tok < n_tok) {
                atomicAdd(&rb[tok * GF8_ROWS + lg], c[0]);
                atomicAdd(&rb[tok * GF8_ROWS + lg + 8], c[2]);
            }
            if (tok + 1 < n_tok) {
                atomicAdd(&rb[(tok + 1) * GF8_ROWS + lg], c[1]);
                atomicAdd(&rb[(tok + 1) * GF8_ROWS + lg + 8], c[3]);
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
                /* 2^16 undoes the two 2^-8 of gf8_f16x2 (exact) */
                v = v * 65536.0f * xs[t] * ws[row];
                if (accumulate)
                    v += kern_to_f(*o);
                *o = kern_from_f<OUT>(v);
            }
        }
        buf ^= 1;
    }
}

/* Stages that fit beside the sums (at least 2). */
static int gf8_stages(void)
{
    size_t fixed = (size_t)2 * 8 * GF8_ROWS * 4 + 128;
    size_t budget = ring_smem_budget();

    if (fixed >= budget)
        return 0;
    return (int)BT_MIN((size_t)GF8_MAX_STAGES,
                       (budget - fixed) / ((size_t)GF8_WARPS * GF8_PIECE));
}

bool cuda_gemv_fp8_ok(int n_tok, int ld)
{
    return n_tok >= 1 && n_tok <= CUDA_GEMV_FP8_MAX_TOK && ld > 0 &&
           ld % 16 == 0 && gf8_stages() >= 2;
}

template <typename OUT>
static cudaError_t gf8_launch(int n_tok, int n_out, int ld,
                              const uint8_t *xq, const float *xs,
                              const uint8_t *w, const float *ws, OUT *y,
                              bool accumulate, cudaStream_t stream)
{
    auto k = gf8_kernel<OUT>;
    const int n_groups = (n_out + GF8_ROWS - 1) / GF8_ROWS;
    const int blocks = BT_MIN(ring_n_sm(), n_groups);
    const int stages = gf8_stages();
    const size_t smem = (size_t)GF8_WARPS * stages * GF8_PIECE +
                        (size_t)2 * 8 * GF8_ROWS * 4;
    cudaError_t err = ring_smem_attr(k, sizeof(OUT) == 4 ? 1 : 0);

    if (err != cudaSuccess)
        return err;
    kern_launch(k, blocks, GF8_WARPS * 32, smem, stream, n_tok, n_out, ld,
                stages, xq, xs, w, ws, y, accumulate);
    return cudaSuccess;
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
