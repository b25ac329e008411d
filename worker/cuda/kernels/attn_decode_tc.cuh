/*
 * attn_decode_tc.cuh - the per-warp pieces of the tensor-core decode
 * attention (attn_decode_tc.cu: one block per KV head, token and key
 * split):
 *   - tc_copy_rows16: one warp's 16 K and V rows of a 64-key tile into its
 *     rows of a pipeline stage (cp.async, zero fill past the keys);
 *   - tc_attend16: those 16 keys against the group's heads: S = Q K^T on
 *     mma.m16n8k16, the mask, an online softmax in base 2 (tc_softmax16),
 *     O += P V with P re-packed from the accumulators (no shared-memory
 *     round trip);
 *   - tc_load_q: Q of the group's heads as the A operand;
 *   - FP8 KV: tc_copy_rows16_kv8 copies rows of E4M3 codes (swizzled,
 *     tc_kv8_at), tc_load_q8 holds Q as f16 fragments in the dim order the
 *     codes are read in, and tc_attend16_kv8 builds the f16 B fragments
 *     straight from the codes in shared memory (no bf16 copy, no
 *     ldmatrix) for groups of more than 8 heads; tc_attend16_kv8t, for
 *     the others, the same keys with the products turned around, the
 *     keys as the MMA's rows.
 * Row layout in shared memory: HD bf16 + TC_PAD of padding (2 x 16 B,
 * which keeps ldmatrix free of bank conflicts); FP8 KV: HD bytes.
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

/* FP8 KV: the offset of byte `byte` of row r (0..15) in a warp's K or V
 * codes (16 rows of HD bytes): the 16-byte chunks of a row are
 * permuted by an XOR of the row so that tc_attend16_kv8's fragment loads
 * are free of bank conflicts (16-byte loads: 8 lanes a phase, 8 distinct
 * 16-byte bank groups needed; HD = 64's 8-byte V loads: 16 lanes a phase,
 * 16 distinct 8-byte groups):
 *   HD = 128, XOR ((r & 1) << 2) ^ (r & 6): K, lanes gr = 2p, 2p + 1 read
 *     chunks tq (+ 4) of rows of both parities, the two halves of the
 *     row's 8 chunks; V, lanes tq = 0..3 read chunk gr of rows
 *     {0, 3, 4, 7} or {1, 2, 5, 6} (+ 8), whose XORs differ in bits 1-2;
 *   HD = 64 (two rows a 128-byte bank line), XOR (r >> 1) & 2: K is free
 *     of conflicts either way; V's rows {0, 4} and {3, 7} (the even and
 *     odd halves of the line) get distinct chunk pairs.
 * One function for the copy and the readers, so they agree;
 * tests/gpu/kv8_frag_sim.py models both and counts the conflicts. */
template <int HD>
static __device__ __forceinline__ int tc_kv8_at(int r, int byte)
{
    static_assert(HD == 64 || HD == 128, "tc_kv8_at: head size 64 or 128");
    const int x = HD == 128 ? ((r & 1) << 2) ^ (r & 6) : (r >> 1) & 2;
    return r * HD + 16 * ((byte >> 4) ^ x) + (byte & 15);
}

/* FP8 KV: copies 16 rows of E4M3 codes (HD bytes each, unpadded,
 * tc_kv8_at's layout) of K and V into dk / dv, as tc_copy_rows16 (off:
 * the row's element, so byte, offset; -1 zero-filled). */
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
        const int at = tc_kv8_at<HD>(r, 16 * c);
        tc_cp16_l2(dk + at, ok ? kbase + o + c * 16 : kbase, ok, pol);
        tc_cp16_l2(dv + at, ok ? vbase + o + c * 16 : vbase, ok, pol);
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

/* FP8 KV: G rows of Q (HD apart from qp) as f16 A fragments, each times
 * sl2 (the softmax scale x the KV head's K scale x log2(e): the S
 * accumulators come out in log2 units, ready for exp2), in the dim order
 * of tc_attend16_kv8's K fragments: lane (gr, tq) holds rows gr and gr + 8
 * (zero beyond G), dims 16 tq .. 16 tq + 15 (and 64 + those at HD = 128);
 * k-step 4 ci + m takes dims d = 64 ci + 16 tq + 4 m: d, d + 1 as the
 * fragment's columns 2 tq, 2 tq + 1 and d + 2, d + 3 as 2 tq + 8, + 9 --
 * the B fragment's rows take the same dims of the key, so each k-step
 * sums 16 whole dims and the product is Q K^T (a dot product does not
 * care about the order of its dims).
 * Range: q' = q x sl2 is computed in f32 and rounded once to f16.
 * q'_d x code is dim d's share of a score in log2 units and codes reach
 * +-448, so |q'_d| at f16's 65504 would mean one dim able to move a
 * score by 2.9e7 (2^24.8) log2 units -- q_d x scale x the largest |k_d|
 * the cache can hold (448 x the K scale); real attention logits are
 * tens (test_attn's q in [-1, 1], |k| <= 9: |q'| < 4e-3, a real model's
 * q ~ 50, |k| ~ 20: |q'| ~ 0.3).  The rounding costs a relative 2^-11
 * per element (the bf16 kernel's Q is exact, but its P is rounded to
 * bf16, 2^-8, where this one's f16 P gets 2^-11); tiny q' lose only
 * absolute precision in f16's subnormals, at most 2^-25 x 448 x HD =
 * 1.7e-3 log2 units on a whole score (HD = 128). */
template <int HD>
static __device__ __forceinline__ void tc_load_q8(uint32_t (&qa)[HD / 16][4],
                                                  const bf16_t *qp, int G,
                                                  float sl2, int lane)
{
    const int gr = lane >> 2, tq = lane & 3;
    auto q2 = [&](int row, int d) -> uint32_t {
        if (row >= G)
            return 0u;
        const uint32_t w = tc_ld32(qp + row * HD + d);
        const float2 f = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162 *>(&w));
        return tc_pack_f16(f.x * sl2, f.y * sl2);
    };
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const int d = 64 * (ks / 4) + 16 * tq + 4 * (ks % 4);
        qa[ks][0] = q2(gr, d);
        qa[ks][1] = q2(gr + 8, d);
        qa[ks][2] = q2(gr, d + 2);
        qa[ks][3] = q2(gr + 8, d + 2);
    }
}

/* An online softmax's running max m (log2 units) moved to max(m, x),
 * x the max of this step's scores: returns the base the step's
 * exponentials subtract (0 while every score so far is -inf) and sets c,
 * the factor that rescales what was summed under the old max. */
static __device__ __forceinline__ float tc_max_step(float &m, float x,
                                                    float &c)
{
    const float n = fmaxf(m, x);
    const float b = n == -INFINITY ? 0.0f : n;
    c = exp2f(m - b);
    m = n;
    return b;
}

/* The online softmax of 16 keys kb .. kb+15 on the S accumulators s
 * (accumulator rows gr and gr + 8, keys nt * 8 + 2 tq + 0/1) of the
 * warp's running (m, l, O): s times sl2 (to log2 units), keys >= end and
 * (MASKED) draft-tree keys (>= ctx) that mrow hides -inf, the running max
 * and sum updated, O rescaled, and s left holding the probabilities
 * exp2(s - max), unnormalized. */
template <int HD, bool MASKED>
static __device__ __forceinline__ void tc_softmax16(
    float (&s)[2][4], int kb, int end, int ctx, const uint8_t *mrow,
    float sl2, float (&o)[HD / 8][4], float &m0, float &m1, float &l0,
    float &l1, int lane)
{
    constexpr int NT = HD / 8; /* 8-wide column tiles of O */
    const int tq = lane & 3;
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
    float c0, c1;
    const float b0 = tc_max_step(m0, mx0, c0), b1 = tc_max_step(m1, mx1, c1);
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
}

/* Keys kb .. kb+15 (rows tk / tv) into the warp's running (m, l, O) of
 * accumulator rows gr and gr + 8 (tc_softmax16: keys >= end, and
 * (MASKED) draft-tree keys that mrow hides, are -inf).  sl2: scale x
 * log2(e).
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
    tc_softmax16<HD, MASKED>(s, kb, end, ctx, mrow, sl2, o, m0, m1, l0, l1,
                             lane);
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

/* FP8 KV, both steps' operands of keys kb .. kb+15 (the tile's 16 rows
 * of this warp), as tc_attend16_kv8's comment below lays them out:
 *   tc_kv8_k_words: the 16-byte K chunks tq + 4 ci of keys gr (kw[0])
 *     and gr + 8 (kw[1]), as 4-byte words (two code pairs each);
 *   tc_kv8_v_pairs: vb[h][j], the code pair (key 2 tq + 8 h, key 2 tq +
 *     8 h + 1) at dim (HD / 8) gr + j as f16 (lanes of odd tq load key
 *     2 tq + 1 first; the byte permute puts the pair back in order). */
template <int HD>
static __device__ __forceinline__ void
tc_kv8_k_words(const uint8_t *tk, int lane, uint32_t (&kw)[2][HD / 64][4])
{
    const int gr = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int ci = 0; ci < HD / 64; ci++) {
            const uint4 c = *reinterpret_cast<const uint4 *>(
                tk + tc_kv8_at<HD>(h * 8 + gr, 16 * (tq + 4 * ci)));
            kw[h][ci][0] = c.x;
            kw[h][ci][1] = c.y;
            kw[h][ci][2] = c.z;
            kw[h][ci][3] = c.w;
        }
}

template <int HD>
static __device__ __forceinline__ void
tc_kv8_v_pairs(const uint8_t *tv, int lane, uint32_t (&vb)[2][HD / 8])
{
    typedef typename kv_word<HD / 8>::type vpiece_t;
    const int gr = lane >> 2, tq = lane & 3;
    const int ka = 2 * tq + (tq & 1); /* the key loaded first */
    const uint32_t sel_lo = tq & 1 ? 0x1504u : 0x5140u; /* bytes 0, 1 */
    const uint32_t sel_hi = tq & 1 ? 0x3726u : 0x7362u; /* bytes 2, 3 */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const vpiece_t va = *reinterpret_cast<const vpiece_t *>(
            tv + tc_kv8_at<HD>(ka + 8 * h, gr * (HD / 8)));
        const vpiece_t vc = *reinterpret_cast<const vpiece_t *>(
            tv + tc_kv8_at<HD>((ka ^ 1) + 8 * h, gr * (HD / 8)));
        const uint32_t *wa = reinterpret_cast<const uint32_t *>(&va);
        const uint32_t *wc = reinterpret_cast<const uint32_t *>(&vc);
#pragma unroll
        for (int w = 0; w < HD / 32; w++) {
            const uint32_t lo = __byte_perm(wa[w], wc[w], sel_lo);
            const uint32_t hi = __byte_perm(wa[w], wc[w], sel_hi);
            vb[h][4 * w] = kv8_f16x2(lo);
            vb[h][4 * w + 1] = kv8_f16x2(lo >> 16);
            vb[h][4 * w + 2] = kv8_f16x2(hi);
            vb[h][4 * w + 3] = kv8_f16x2(hi >> 16);
        }
    }
}

/* FP8 KV: keys kb .. kb+15 (codes in tc_kv8_at's layout at tk / tv) into
 * the warp's running (m, l, O), as tc_attend16, on f16 MMAs with B
 * fragments converted from codes in registers (cvt.rn.f16x2.e4m3x2, two
 * codes an instruction, exact).  qa: tc_load_q8's (already in log2
 * units).  Lane (gr, tq):
 *   S: key nt * 8 + gr of n-tile nt, its chunks tq (+ 4) of 16 dims; the
 *     4-byte word m of a chunk is k-step 4 ci + m, its low code pair the
 *     fragment's rows 2 tq, 2 tq + 1 and its high pair rows 2 tq + 8, + 9
 *     (tc_load_q8 puts the same dims in Q's columns).
 *   O: the n index of n-tile nt, column gr of the B fragment, is output
 *     dim (HD / 8) gr + nt, so a lane reads one contiguous HD / 8 bytes
 *     of each of its keys 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9 (the rows
 *     of P's columns it holds); byte nt of keys 2 tq and 2 tq + 1 make
 *     one code pair by a byte permute.  The accumulators o[nt][j] (C
 *     columns 2 tq + (j & 1)) are therefore dims (HD / 8)(2 tq + (j & 1))
 *     + nt, not the bf16 kernel's 8 nt + 2 tq + (j & 1): tc_o8_at in
 *     attn_decode_tc.cu writes them out.
 *   Lanes of odd tq load key 2 tq + 1 before 2 tq (the permute's selector
 *     swaps them back), so each V load reads rows of both parities: with
 *     tc_kv8_at's swizzle no load conflicts. */
template <int HD, bool MASKED>
static __device__ __forceinline__ void tc_attend16_kv8(
    const uint32_t (&qa)[HD / 16][4], const uint8_t *tk, const uint8_t *tv,
    int kb, int end, int ctx, const uint8_t *mrow, float (&o)[HD / 8][4],
    float &m0, float &m1, float &l0, float &l1, int lane)
{
    constexpr int NT = HD / 8; /* 8-wide column tiles of O */

    uint32_t kw[2][HD / 64][4];
    tc_kv8_k_words<HD>(tk, lane, kw);
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const uint32_t w = kw[nt][ks / 4][ks % 4];
            tc_mma_f16(s[nt], qa[ks], kv8_f16x2(w), kv8_f16x2(w >> 16));
        }
    tc_softmax16<HD, MASKED>(s, kb, end, ctx, mrow, 1.0f, o, m0, m1, l0, l1,
                             lane);
    const uint32_t pa[4] = {
        tc_pack_f16(s[0][0], s[0][1]), tc_pack_f16(s[0][2], s[0][3]),
        tc_pack_f16(s[1][0], s[1][1]), tc_pack_f16(s[1][2], s[1][3])};

    /* vb[h][nt]: the code pair (key 2 tq + 8 h, key 2 tq + 8 h + 1) at
     * dim (HD / 8) gr + nt, as f16 */
    uint32_t vb[2][NT];
    tc_kv8_v_pairs<HD>(tv, lane, vb);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        tc_mma_f16(o[nt], pa, vb[0][nt], vb[1][nt]);
}

/* The 8x8 b16 matrix of a warp (lane (r, c): row r = lane / 4, columns
 * 2 c, 2 c + 1) transposed. */
static __device__ __forceinline__ uint32_t tc_trans8(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;"
                 : "=r"(y)
                 : "r"(x));
    return y;
}

/* FP8 KV, groups of at most 8 heads (the engine's step for them): keys
 * kb .. kb+15 as tc_attend16_kv8, the products turned around so that the
 * keys are the MMA's rows and the group's heads its columns (a group of
 * 4 heads fills 4 of tc_attend16_kv8's 16 rows, here 4 of 8 columns):
 *   S^T = K Q^T: m16 = the 16 keys (A: K's codes, tc_attend16_kv8's
 *     loads and conversions: key gr's word m of chunk tq + 4 ci is k-step
 *     4 ci + m, low pair columns 2 tq, 2 tq + 1, high pair 2 tq + 8, + 9),
 *     n8 = heads (B: Q^T, tc_load_q8's qa[ks][0] and qa[ks][2], row gr),
 *     HD / 16 MMAs;
 *   softmax per head over the keys: lane (gr, tq) holds keys gr, gr + 8
 *     of heads 2 tq (running max m0, its part of the sum l0) and 2 tq + 1
 *     (m1, l1); the max is taken over the 8 lanes of a column, the sums
 *     stay per lane (the caller adds them once, over lanes 4 apart);
 *   P^T into B fragments by two movmatrix.trans (keys 2 tq, 2 tq + 1
 *     (+ 8) of head gr);
 *   O^T = V^T P^T: m16 = 16 dims of the lane's HD / 8 contiguous V bytes
 *     (tc_attend16_kv8's loads and byte pairs: vb[h][j], dim (HD / 8) gr +
 *     j), HD / 16 MMAs; accumulator o[mt] holds dims (HD / 8) gr + mt (0,
 *     1) and (HD / 8) gr + HD / 16 + mt (2, 3) of heads 2 tq (0, 2) and
 *     2 tq + 1 (1, 3); o[HD / 16 ..] are not used.
 * tests/gpu/kv8t_frag_sim.py checks the fragments lane by lane.  (Lost,
 * H100 2026-12-07, the workbench tests/gpu/bench_attn_kv8t.cu of 68c252b: O
 * rescaled only when a running max moved, +0.1 to +1.5%; codes to f16 by
 * bits on the integer pipes instead of cvt, +0.6 to +5.6%.) */
template <int HD, bool MASKED>
static __device__ __forceinline__ void tc_attend16_kv8t(
    const uint32_t (&qa)[HD / 16][4], const uint8_t *tk, const uint8_t *tv,
    int kb, int end, int ctx, const uint8_t *mrow, float (&o)[HD / 8][4],
    float &m0, float &m1, float &l0, float &l1, int lane)
{
    constexpr int MT = HD / 16; /* m-tiles of O^T */
    const int gr = lane >> 2;

    uint32_t kw[2][HD / 64][4]; /* keys gr, gr + 8 */
    tc_kv8_k_words<HD>(tk, lane, kw);
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const uint32_t w0 = kw[0][ks / 4][ks % 4], w1 = kw[1][ks / 4][ks % 4];
        const uint32_t a[4] = {kv8_f16x2(w0), kv8_f16x2(w1),
                               kv8_f16x2(w0 >> 16), kv8_f16x2(w1 >> 16)};
        tc_mma_f16(s, a, qa[ks][0], qa[ks][2]);
    }
    /* s: key gr (heads 2 tq, 2 tq + 1), key gr + 8 (the same) */
    const int k0 = kb + gr, k1 = kb + gr + 8;
    const bool ok0 = k0 < end && (!MASKED || k0 < ctx || mrow[k0 - ctx]);
    const bool ok1 = k1 < end && (!MASKED || k1 < ctx || mrow[k1 - ctx]);
    const float s0 = ok0 ? s[0] : -INFINITY, s1 = ok0 ? s[1] : -INFINITY;
    const float s2 = ok1 ? s[2] : -INFINITY, s3 = ok1 ? s[3] : -INFINITY;
    float x0 = fmaxf(s0, s2), x1 = fmaxf(s1, s3);
#pragma unroll
    for (int o2 = 4; o2 <= 16; o2 <<= 1) {
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o2));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o2));
    }
    float c0, c1;
    const float b0 = tc_max_step(m0, x0, c0), b1 = tc_max_step(m1, x1, c1);
    const float p0 = exp2f(s0 - b0), p2 = exp2f(s2 - b0);
    const float p1 = exp2f(s1 - b1), p3 = exp2f(s3 - b1);
    l0 = l0 * c0 + (p0 + p2);
    l1 = l1 * c1 + (p1 + p3);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        o[mt][0] *= c0;
        o[mt][2] *= c0;
        o[mt][1] *= c1;
        o[mt][3] *= c1;
    }
    const uint32_t pb0 = tc_trans8(tc_pack_f16(p0, p1));
    const uint32_t pb1 = tc_trans8(tc_pack_f16(p2, p3));

    uint32_t vb[2][HD / 8];
    tc_kv8_v_pairs<HD>(tv, lane, vb);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const uint32_t a[4] = {vb[0][mt], vb[0][MT + mt], vb[1][mt],
                               vb[1][MT + mt]};
        tc_mma_f16(o[mt], a, pb0, pb1);
    }
}

#endif /* BT_WORKER_CUDA_KERNELS_ATTN_DECODE_TC_CUH */
