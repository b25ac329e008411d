/*
 * attn_decode_tc.cuh - the per-warp pieces of the tensor-core decode
 * attention (attn_decode_tc.cu: one block per KV head, token and key
 * split):
 *   - tc_copy_rows16: one warp's 16 K and V rows of a 64-key tile into its
 *     rows of a pipeline stage (cp.async, zero fill past the keys);
 *   - tc_attend16: those 16 keys against the group's heads: S = Q K^T on
 *     mma.m16n8k16, the mask, an online softmax in base 2, O += P V with
 *     P re-packed from the accumulators (no shared-memory round trip);
 *   - tc_load_q: Q of the group's heads as the A operand;
 *   - FP8 KV: tc_copy_rows16_kv8 copies rows of codes, tc_widen16 turns a
 *     warp's 16 of them into the bf16 rows tc_attend16 reads.
 * Row layout in shared memory: HD bf16 + TC_PAD of padding (2 x 16 B,
 * which keeps ldmatrix free of bank conflicts).
 */
#ifndef BT_WORKER_CUDA_KERNELS_ATTN_DECODE_TC_CUH
#define BT_WORKER_CUDA_KERNELS_ATTN_DECODE_TC_CUH

#include <math.h>

#include "kv8.cuh"
#include "tc_common.cuh"

#define TC_WARPS 4
#define TC_TK 64     /* keys per tile: 16 per warp */
#define TC_STAGES 3
#define TC_PAD 8     /* bf16 of padding per shared-memory row */

template <int HD> struct tc_rows {
    static constexpr int ROW = HD + TC_PAD;
    static constexpr int TILE = TC_TK * ROW; /* bf16 elements */
    static constexpr size_t PIPE =
        (size_t)TC_STAGES * 2 * TILE * sizeof(bf16_t);
};

/* Element (row, col) of a warp's 16 K or V rows at t (padded rows of
 * ROW). */
template <int HD>
static __device__ __forceinline__ const bf16_t *tc_at(const bf16_t *t,
                                                      int row, int col)
{
    return t + row * tc_rows<HD>::ROW + col;
}

/* Copies 16 K and V rows into dk / dv (16 rows of ROW).  Lane r < 16
 * holds `off`, the element offset of row r in the layer cache (-1: past
 * the keys, zero-filled; HOLE: -2, not copied at all, the caller writes
 * the row itself); the copying lanes take it by shuffle.  The copies
 * carry the L2 policy pol and a 128-byte prefetch size (tc_cp16_l2).
 * Round 11: computing each row's offset once (instead of per 16-byte
 * chunk) cut the kernel's instructions by 28%. */
template <int HD, bool HOLE = false>
static __device__ __forceinline__ void tc_copy_rows16(
    bf16_t *dk, bf16_t *dv, const bf16_t *kbase, const bf16_t *vbase,
    long long off, int lane, uint64_t pol)
{
    constexpr int ROW = tc_rows<HD>::ROW;
    constexpr int CPR = HD / 8;   /* 16-byte chunks per row */
    constexpr int RPI = 32 / CPR; /* rows per copy instruction */
    const int c = lane % CPR;
#pragma unroll
    for (int i = 0; i < 16 / RPI; i++) {
        const int r = i * RPI + lane / CPR;
        const long long o = __shfl_sync(0xffffffffu, off, r);
        const bool ok = o >= 0;
        if (HOLE && o == -2)
            continue;
        tc_cp16_l2(dk + r * ROW + c * 8, ok ? kbase + o + c * 8 : kbase, ok,
                   pol);
        tc_cp16_l2(dv + r * ROW + c * 8, ok ? vbase + o + c * 8 : vbase, ok,
                   pol);
    }
}

/* FP8 KV: copies 16 rows of E4M3 codes (HD bytes each, unpadded) of K
 * and V into dk / dv, as tc_copy_rows16 (off: the row's element, so byte,
 * offset; -1 zero-filled). */
template <int HD>
static __device__ __forceinline__ void tc_copy_rows16_kv8(
    uint8_t *dk, uint8_t *dv, const uint8_t *kbase, const uint8_t *vbase,
    long long off, int lane, uint64_t pol)
{
    constexpr int CPR = HD / 16;  /* 16-byte chunks per row */
    constexpr int RPI = 32 / CPR; /* rows per copy instruction */
    const int c = lane % CPR;
#pragma unroll
    for (int i = 0; i < 16 / RPI; i++) {
        const int r = i * RPI + lane / CPR;
        const long long o = __shfl_sync(0xffffffffu, off, r);
        const bool ok = o >= 0;
        tc_cp16_l2(dk + r * HD + c * 16, ok ? kbase + o + c * 16 : kbase, ok,
                   pol);
        tc_cp16_l2(dv + r * HD + c * 16, ok ? vbase + o + c * 16 : vbase, ok,
                   pol);
    }
}

/* FP8 KV: a warp's 16 rows of codes (src, HD bytes apart) widened to
 * bf16 rows of ROW (dst), exactly (kv8_to_bf16x8); the caller syncs the
 * warp before and after. */
template <int HD>
static __device__ __forceinline__ void tc_widen16(bf16_t *dst,
                                                  const uint8_t *src,
                                                  int lane)
{
    constexpr int ROW = tc_rows<HD>::ROW;
    constexpr int C8 = HD / 8; /* 8-code chunks per row */
#pragma unroll
    for (int i = 0; i < 16 * C8 / 32; i++) {
        const int ci = lane + 32 * i;
        const int r = ci / C8, c = ci - r * C8;
        const uint2 codes = *reinterpret_cast<const uint2 *>(src + r * HD +
                                                             c * 8);
        *reinterpret_cast<uint4 *>(dst + r * ROW + c * 8) =
            kv8_to_bf16x8(codes);
    }
}

/* G rows of Q (HD apart from qp: global or shared memory) as the A
 * operand (zero beyond G). */
template <int HD>
static __device__ __forceinline__ void tc_load_q(uint32_t (&qa)[HD / 16][4],
                                                 const bf16_t *qp, int G,
                                                 int lane)
{
    const int gr = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        int c = ks * 16 + 2 * tq;
        qa[ks][0] = gr < G ? tc_ld32(qp + gr * HD + c) : 0u;
        qa[ks][1] = gr + 8 < G ? tc_ld32(qp + (gr + 8) * HD + c) : 0u;
        qa[ks][2] = gr < G ? tc_ld32(qp + gr * HD + c + 8) : 0u;
        qa[ks][3] = gr + 8 < G ? tc_ld32(qp + (gr + 8) * HD + c + 8) : 0u;
    }
}

/* Keys kb .. kb+15 (rows tk / tv) into the warp's running (m, l, O) of
 * accumulator rows gr and gr + 8.  Keys >= end, and (MASKED) draft-tree
 * keys (>= ctx) that mrow hides, are -inf.  sl2: scale x log2(e).
 * Callers branch once on mrow and call the MASKED or the plain instance:
 * the kernels' own loops had that split made by the compiler, which it no
 * longer made once the step was a function (a mask test per key cost
 * 4% at batch 64: round 12). */
template <int HD, bool MASKED>
static __device__ __forceinline__ void tc_attend16(
    const uint32_t (&qa)[HD / 16][4], const bf16_t *tk, const bf16_t *tv,
    int kb, int end, int ctx, const uint8_t *mrow, float sl2,
    float (&o)[HD / 8][4], float &m0, float &m1, float &l0, float &l1,
    int lane)
{
    constexpr int NT = HD / 8; /* 8-wide column tiles of O */
    const int tq = lane & 3;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int k2 = 0; k2 < HD / 32; k2++) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            uint32_t b[4];
            tc_ldm(b, tc_at<HD>(tk, nt * 8 + (lane & 7),
                                     k2 * 32 + (lane >> 3) * 8));
            tc_mma(s[nt], qa[2 * k2], b[0], b[1]);
            tc_mma(s[nt], qa[2 * k2 + 1], b[2], b[3]);
        }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int key = kb + nt * 8 + 2 * tq + j;
            bool ok = key < end &&
                      (!MASKED || key < ctx || mrow[key - ctx] != 0);
            s[nt][j] = ok ? s[nt][j] * sl2 : -INFINITY;
            s[nt][2 + j] = ok ? s[nt][2 + j] * sl2 : -INFINITY;
            mx0 = fmaxf(mx0, s[nt][j]);
            mx1 = fmaxf(mx1, s[nt][2 + j]);
        }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float b0 = mn0 == -INFINITY ? 0.0f : mn0;
    const float b1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            s[nt][j] = exp2f(s[nt][j] - b0);
            s[nt][2 + j] = exp2f(s[nt][2 + j] - b1);
            ps0 += s[nt][j];
            ps1 += s[nt][2 + j];
        }
    l0 = l0 * c0 + ps0;
    l1 = l1 * c1 + ps1;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        o[nt][0] *= c0;
        o[nt][1] *= c0;
        o[nt][2] *= c1;
        o[nt][3] *= c1;
    }
    uint32_t pa[4] = {tc_pack(s[0][0], s[0][1]), tc_pack(s[0][2], s[0][3]),
                      tc_pack(s[1][0], s[1][1]), tc_pack(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < HD / 16; dn++) {
        uint32_t b[4];
        tc_ldm_t(b, tc_at<HD>(tv, (lane & 7) + ((lane >> 3) & 1) * 8,
                                   dn * 16 + (lane >> 4) * 8));
        tc_mma(o[2 * dn], pa, b[0], b[1]);
        tc_mma(o[2 * dn + 1], pa, b[2], b[3]);
    }
}

#endif /* BT_WORKER_CUDA_KERNELS_ATTN_DECODE_TC_CUH */
