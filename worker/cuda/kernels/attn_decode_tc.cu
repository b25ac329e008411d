/*
 * attn_decode_tc.cu - tensor-core paged decode attention (bf16, head size
 * 64 or 128, up to 16 query heads per KV head).  One block of 4 warps per
 * (KV head, query token, key split): the K and V rows of the split are
 * streamed through shared memory in tiles of 64 keys with cp.async (16-byte
 * copies, 3 stages, so two tiles are in flight while one is used) and
 * every key is read from HBM once for all the query heads of its group.
 * Each warp takes 16 keys of a tile and copies those rows itself, so
 * the pipeline is per warp (no block barrier per tile): S = Q K^T with
 * mma.m16n8k16 (the group's heads are the 16 rows of the A operand,
 * zero-padded), an online softmax in base 2 on the accumulators, then
 * O += P V with P re-packed from the accumulators as the A operand (no
 * shared-memory round trip) and V read with ldmatrix.trans.  The warps'
 * (max, sum, O) are merged in shared memory; with n_splits > 1 the block
 * writes the same partial format as attn_decode.cu (max in natural-log
 * units), merged by its combine kernel.  Padded rows (2 x 16 B per row)
 * keep ldmatrix free of bank conflicts.  The first pipeline stages whose
 * keys are all cached (older than this step) are issued before the PDL
 * wait.  The K / V copies carry an L2 evict-first policy (K / V are read
 * once a step) and a 128-byte L2 prefetch size.  The per-warp copy and
 * tile step are in attn_decode_tc.cuh.  Selected by cuda_attn_decode();
 * tested by tests/kernels/test_attn.cu against the CPU reference.
 * FP8 KV (KV8, d_kv_scale): the stages hold E4M3 codes (half the bytes
 * copied, rows swizzled by tc_kv8_at) and the products run on f16 MMAs
 * whose K and V fragments are converted from the codes in registers
 * (exact: every E4M3 value is an f16), with Q as f16 fragments
 * prescaled by the score scale x the KV head's K scale (tc_load_q8); the
 * fragments' dim permutation puts O's accumulators at other dims than
 * the bf16 kernel's, written out through tc_o8_at; the V scale joins the
 * output.  Under half the shared memory of the bf16 instances.  Groups
 * of <= 8 heads turn the products around (tc_attend16_kv8t: the keys are
 * the MMA's rows, the heads its columns; half the MMAs, four blocks an
 * SM).  The
 * fused RoPE writes its new K / V as codes (never into an early tile:
 * the writer's tile is copied after the wait and a fence).  Tested by
 * tests/gpu/test_cuda_kv8.c (the fused RoPE against rope_kv.cu too) and
 * test_attn.cu's "kv8 stress" lines; tests/gpu/kv8_frag_sim.py models
 * its fragments, kv8t_frag_sim.py the keys-as-rows step's.
 */
#include "attn_decode.h"

#include <math.h>

#include <type_traits>

#include "bt_util.h"
#include "../cuda_switches.h"
#include "attn_decode_tc.cuh"
#include "kern_common.cuh"

#define TC_BT_SMEM 512
#define TC_MAX_GROUP 16
#define TC_KT_MAX_GROUP 8 /* FP8 KV: the keys-as-rows step's (below) */

template <int HD> struct tc_smem {
    static constexpr int ROW = tc_rows<HD>::ROW;
    static constexpr int TILE = tc_rows<HD>::TILE;
    static constexpr size_t PIPE = tc_rows<HD>::PIPE;
    static constexpr size_t MERGE =
        (size_t)TC_WARPS * TC_MAX_GROUP * (HD + 2) * sizeof(float);
    static constexpr size_t BYTES = PIPE > MERGE ? PIPE : MERGE;
    /* FP8 KV: the code stages (K then V), later the merge rows of
     * tc_o8_at (O8_ROW floats a row: 8 column groups of O8_COL) */
    static constexpr size_t STAGE8 = (size_t)TC_STAGES * TC_TK * HD;
    static constexpr int O8_COL = HD / 8 + 4;
    static constexpr int O8_ROW = 8 * O8_COL + 1;
    static constexpr size_t MERGE8 =
        (size_t)TC_WARPS * TC_MAX_GROUP * (O8_ROW + 2) * sizeof(float);
    static constexpr size_t BYTES8 =
        2 * STAGE8 > MERGE8 ? 2 * STAGE8 : MERGE8;
};

/* FP8 KV: float offset of (row, output dim d) in a warp's merge rows.
 * tc_attend16_kv8 leaves dim (HD / 8) c + nt in accumulator o[nt][c & 1]
 * of the lanes with 2 tq + (c & 1) = c; it goes to c * O8_COL + nt of
 * its row.  O8_COL = 4 (mod 8) puts the 4 tq of a store 8 banks apart
 * and the odd O8_ROW the 8 rows (gr) on distinct banks: the 32 lanes'
 * stores of one accumulator hit 32 banks (rows of HD floats would put
 * them all in one). */
template <int HD>
static __device__ __forceinline__ int tc_o8_at(int row, int d)
{
    return row * tc_smem<HD>::O8_ROW + d / (HD / 8) * tc_smem<HD>::O8_COL +
           d % (HD / 8);
}

/* The fused RoPE's rotation table of token tok (cos, sin of pos x
 * inv_freq into sh_c / sh_s, HD / 2 each): it reads only what the host
 * wrote before the step, so it runs before the PDL wait; the caller's
 * block barrier publishes it. */
template <int HD>
static __device__ __forceinline__ void tc_rope_table(
    const cuda_attn_args_t &a, int tok, float *sh_c, float *sh_s)
{
    const float pos = (float)a.d_pos[tok];

    for (int i = threadIdx.x; i < HD / 2; i += blockDim.x) {
        float sn, cs;
        sincosf(pos * a.d_inv_freq[i], &sn, &cs);
        sh_c[i] = cs;
        sh_s[i] = sn;
    }
}

/* The fused RoPE (cuda_attn_args_t.d_qkv): the G query heads of token
 * tok rotated into sh_q with the table of tc_rope_table, and, by the
 * block whose key range holds the new key (position ctx, slot
 * d_slot[tok]), KV head kvh's rotated K and its V written to the cache
 * before any copy of that tile is issued -- or, when the tile was copied
 * before the PDL wait with that row left out (sk_new / sv_new: its rows
 * in shared memory, else NULL), written into those rows too, with no
 * fence: nothing in this kernel reads them back from the cache.  Same
 * arithmetic as rope_kv.cu (bias added in f32, sincosf of pos x
 * inv_freq, bf16 rounding of the result): the same bits as the unfused
 * path.  KV8: K and V are written as rope_kv.cu writes them, E4M3 codes
 * of the bf16-rounded values at 1 / the KV head's scale (kv8_encode;
 * never into shared memory: no fill_new).  Ends with a block barrier. */
template <int HD, bool KV8>
static __device__ __forceinline__ void tc_rope_prologue(
    const cuda_attn_args_t &a, int tok, int kvh, int G, int start, int end,
    int ctx, const float *sh_c, const float *sh_s, bf16_t *sh_q,
    bf16_t *sk_new, bf16_t *sv_new)
{
    constexpr int HALF = HD / 2;
    const int qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * HD;
    const bf16_t *row = (const bf16_t *)a.d_qkv + (size_t)tok * qkv_dim;
    const bf16_t *bias = (const bf16_t *)a.d_qkv_bias;
    const int slot = a.d_slot[tok];
    const bool writer = slot >= 0 && start <= ctx && ctx < end;
    const int n_rot = (G + (writer ? 1 : 0)) * HALF; /* q heads, then k */
    const size_t kv_at = ((size_t)(slot < 0 ? 0 : slot) * a.n_kv_heads +
                          kvh) * HD; /* the new row's first element */
    for (int p = threadIdx.x; p < n_rot; p += blockDim.x) {
        const int hh = p / HALF, i = p - hh * HALF;
        const int e0 = a.rope_half ? i : 2 * i;
        const int e1 = a.rope_half ? i + HALF : 2 * i + 1;
        const int col = (hh < G ? kvh * G + hh : a.n_heads + kvh) * HD;
        float x0 = __bfloat162float(row[col + e0]);
        float x1 = __bfloat162float(row[col + e1]);
        if (bias) {
            x0 += __bfloat162float(bias[col + e0]);
            x1 += __bfloat162float(bias[col + e1]);
        }
        const float c = sh_c[i], sn = sh_s[i];
        const float f0 = x0 * c - x1 * sn, f1 = x0 * sn + x1 * c;
        const bf16_t y0 = __float2bfloat16_rn(f0);
        const bf16_t y1 = __float2bfloat16_rn(f1);
        if (KV8 && hh == G) {
            const float inv = __frcp_rn(a.d_kv_scale[kvh]);
            kv8_t *k8 = (kv8_t *)a.d_k_cache + kv_at;
            k8[e0] = kv8_encode<bf16_t>(f0, inv);
            k8[e1] = kv8_encode<bf16_t>(f1, inv);
            continue;
        }
        bf16_t *dst = hh < G ? sh_q + hh * HD
                             : (bf16_t *)a.d_k_cache + kv_at;
        dst[e0] = y0;
        dst[e1] = y1;
        if (hh == G && sk_new) {
            sk_new[e0] = y0;
            sk_new[e1] = y1;
        }
    }
    if (writer) {
        const int voff = (a.n_heads + a.n_kv_heads + kvh) * HD;
        bf16_t *v = (bf16_t *)a.d_v_cache + kv_at;
        const float vinv =
            KV8 ? __frcp_rn(a.d_kv_scale[a.n_kv_heads + kvh]) : 1.0f;
        for (int e = threadIdx.x; e < HD; e += blockDim.x) {
            float x = __bfloat162float(row[voff + e]);
            if (bias)
                x += __bfloat162float(bias[voff + e]);
            if (KV8) {
                ((kv8_t *)a.d_v_cache + kv_at)[e] =
                    kv8_encode<bf16_t>(x, vinv);
                continue;
            }
            v[e] = __float2bfloat16_rn(x);
            if (sv_new)
                sv_new[e] = __float2bfloat16_rn(x);
        }
        /* the tile's cp.async copies read through L2 */
        if (!sk_new)
            __threadfence();
    }
    __syncthreads();
}

/* A K/V copy by TMA boxes (mbarriers, the 128-byte swizzle) measured
 * equal in the engine (rounds 19 and 21 of docs/PERFORMANCE.md): the
 * kernel is bound by DRAM and its block waves, no longer by the copy's
 * instructions; it was deleted with its switch. */
template <int HD, bool NEWROW, bool KV8, bool KT = false>
static __global__ void __launch_bounds__(TC_WARPS * 32)
attn_decode_tc_kernel(cuda_attn_args_t a, const int *tok_idx, int split_len,
                      int n_splits, float *ws)
{
    /* KT: FP8 KV through tc_attend16_kv8t (groups of <= TC_KT_MAX_GROUP) */
    static_assert(!KT || KV8, "the keys-as-rows step reads FP8 KV");
    constexpr int ROW = tc_smem<HD>::ROW;
    /* a stage's K (or V) rows, and a warp's 16 of them, in elements */
    constexpr int TILE = tc_smem<HD>::TILE;
    constexpr int WPART = 16 * ROW;
    constexpr int KS = HD / 16; /* k-steps of Q K^T */
    constexpr int NT = HD / 8;  /* 8-wide column tiles of O */
    extern __shared__ __align__(16) unsigned char tc_sm_raw[];
    __shared__ int sh_bt[TC_BT_SMEM];
    __shared__ __align__(16) bf16_t sh_q[TC_MAX_GROUP * HD]; /* fused RoPE */
    __shared__ float sh_c[HD / 2], sh_s[HD / 2];           /* its table */
    unsigned char *tc_sm = tc_sm_raw;
    bf16_t *sk = reinterpret_cast<bf16_t *>(tc_sm); /* [STAGES][TK][ROW] */
    bf16_t *sv = sk + TC_STAGES * TILE;
    /* KV8: code stages [STAGES][TK][HD] bytes of K, then of V */
    constexpr size_t STAGE8 = tc_smem<HD>::STAGE8;
    uint8_t *sk8 = tc_sm;
    uint8_t *sv8 = sk8 + STAGE8;

    const int G = a.n_heads / a.n_kv_heads;
    const int kvh = blockIdx.x;
    const int h0 = kvh * G;
    const int ti = blockIdx.y;
    const int split = blockIdx.z;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int gr = lane >> 2; /* accumulator row (and row + 8) */
    const int tq = lane & 3;  /* accumulator column pair */
    KPROF(0, 0);

    /* Everything up to kern_pdl_wait() reads only what the host wrote
     * before the step (token metadata, block tables) and K/V of cached
     * keys (< ctx: written by earlier steps), never what the kernels
     * before this one write (q, the new keys' K/V). */
    if (!a.pdl_late)
        kern_pdl_trigger();
    const int tok = tok_idx ? tok_idx[ti] : ti;
    const int kv_len = a.d_kv_len[tok];
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    const int bs = a.block_size;
    const int bs_sh = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1; /* log2 */
    const int *bt = a.d_block_tables + a.d_bt_off[tok];
    const int ctx = a.d_ctx_len[tok];
    const int moff = a.d_mask_off[tok];
    const uint8_t *mrow = moff >= 0 ? a.d_masks + moff : NULL;
    const size_t slot_stride = (size_t)a.n_kv_heads * HD;
    const bf16_t *kbase = (const bf16_t *)a.d_k_cache + (size_t)kvh * HD;
    const bf16_t *vbase = (const bf16_t *)a.d_v_cache + (size_t)kvh * HD;
    const uint8_t *kbase8 = (const uint8_t *)a.d_k_cache + (size_t)kvh * HD;
    const uint8_t *vbase8 = (const uint8_t *)a.d_v_cache + (size_t)kvh * HD;

    const int blk0 = start / bs;
    const int n_blk = end > start ? (end - 1) / bs - blk0 + 1 : 0;
    const bool bt_sm = n_blk <= TC_BT_SMEM;
    if (bt_sm)
        for (int i = threadIdx.x; i < n_blk; i += blockDim.x)
            sh_bt[i] = bt[blk0 + i];

    if (a.d_qkv)
        tc_rope_table<HD>(a, tok, sh_c, sh_s);
    __syncthreads(); /* sh_bt, sh_c / sh_s */
    const int n_tiles = end > start ? (end - start + TC_TK - 1) / TC_TK : 0;
    /* Each warp copies only its own 16 keys of every tile (the rows it
     * alone reads), so the pipeline needs no block barrier; lanes 0-15
     * compute their row's offset once (block-table entry, 64-bit
     * multiply) and the copying lanes take it by shuffle (the block-wide
     * load it replaced, the address arithmetic per chunk, was almost
     * half the kernel's instructions: round 11). */
    /* The fused RoPE's new key (position ctx, the last key of a
     * single-token step) in an early tile: that tile is copied before the
     * wait with the new key's row left out (hole), and the prologue
     * writes the row into shared memory itself (else the split that
     * holds the new key copies its tile only after the wait and a fence,
     * and is the attention's last block at batch 1: round 17). */
    const int kt_new = (ctx - start) / TC_TK;
    const bool fill_new = NEWROW && a.d_qkv && !mrow &&
                          end == ctx + 1 &&
                          start <= ctx && a.d_slot[tok] >= 0 &&
                          kt_new < TC_STAGES - 1;
    /* (the hole only in the early copies: the main loop's copy path is
     * the instruction-bound part of batch-64 steps) */
    /* The K/V copies' L2 policy: evict first (K/V are read once a step,
     * so their lines leave L2 first and what is read again stays) with a
     * 128-byte prefetch size (a K or V row of one head is 256 contiguous
     * bytes, copied as 16 chunks by 16 lanes; the first miss of a line
     * brings all of it).  Both faster at batch 64 than plain copies or
     * either alone (rounds 23-24); the losing settings were deleted. */
    const uint64_t kv_pol = tc_policy_evict_first();
    auto load_tile = [&](int stage, int kt, auto hole_t) {
        constexpr bool HOLE = decltype(hole_t)::value;
        const int k = start + kt * TC_TK + warp * 16 + (lane & 15);
        long long off = -1; /* -1: past the split, zero-filled */
        if (HOLE && fill_new && k == ctx) {
            off = -2; /* written by the prologue */
        } else if (k < end) {
            int blk = bs_sh >= 0 ? k >> bs_sh : k / bs;
            int bid = bt_sm ? sh_bt[blk - blk0] : bt[blk];
            off = ((long long)bid * bs + (k - blk * bs)) *
                  (long long)slot_stride;
        }
        if constexpr (KV8)
            tc_copy_rows16_kv8<HD>(
                sk8 + (size_t)stage * TC_TK * HD + warp * 16 * HD,
                sv8 + (size_t)stage * TC_TK * HD + warp * 16 * HD, kbase8,
                vbase8, off, lane, kv_pol);
        else
            tc_copy_rows16<HD, HOLE>(sk + stage * TILE + warp * WPART,
                                     sv + stage * TILE + warp * WPART, kbase,
                                     vbase, off, lane, kv_pol);
    };
    const std::true_type with_hole;
    const std::false_type no_hole;
    /* The first stages whose keys are all cached start before the wait
     * (with programmatic dependent launch they stream during the previous
     * kernels); the others, and Q, after it. */
    int pre = 0;
    while (pre < TC_STAGES - 1 && pre < n_tiles &&
           (min(end, start + (pre + 1) * TC_TK) <= ctx ||
            (fill_new && pre == kt_new))) {
        load_tile(pre, pre, with_hole);
        tc_cp_commit();
        pre++;
    }
    kern_pdl_wait();
    KPROF(0, 1);

    /* Q as the A operand: rows = the group's heads (zero beyond G), from
     * d_q, or rotated here from the QKV row (the fused RoPE); KV8's below,
     * once sl2 is known. */
    uint32_t qa[KS][4];
    if constexpr (KV8) {
        if (a.d_qkv)
            tc_rope_prologue<HD, true>(a, tok, kvh, G, start, end, ctx, sh_c,
                                       sh_s, sh_q, NULL, NULL);
    } else if (a.d_qkv) {
        const int rn = ctx - start - kt_new * TC_TK; /* the hole's row */
        tc_rope_prologue<HD, false>(a, tok, kvh, G, start, end, ctx, sh_c,
                                    sh_s, sh_q,
                                    fill_new ? sk + kt_new * TILE + rn * ROW
                                             : NULL,
                                    fill_new ? sv + kt_new * TILE + rn * ROW
                                             : NULL);
        tc_load_q<HD>(qa, sh_q, G, lane);
    } else {
        tc_load_q<HD>(qa,
                      (const bf16_t *)a.d_q + ((size_t)tok * a.n_heads + h0) *
                                                  HD,
                      G, lane);
    }

    KPROF(0, 2);
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    /* scores in log2 (KV8: times the KV head's K scale) */
    const float sl2 = (KV8 ? a.scale * a.d_kv_scale[kvh] : a.scale) *
                      1.4426950408889634f;
    if constexpr (KV8) /* f16, times sl2, in tc_attend16_kv8's dim order */
        tc_load_q8<HD>(qa,
                       a.d_qkv ? sh_q
                               : (const bf16_t *)a.d_q +
                                     ((size_t)tok * a.n_heads + h0) * HD,
                       G, sl2, lane);

    /* Not unrolled: CUDA 13.0's ptxas (V13.0.88) compiled the unrolled
     * loop's second copy in the FP8-KV instances with its shared-memory
     * base and memory descriptor in uniform registers it never wrote
     * (UR0, UR1), and Hopper raised "an illegal instruction" there under
     * serving shapes (a cold burst of 256 x 2048-token prompts; test_attn
     * --kv8-stress).  tests/gpu/sass_check.py, run by the device scripts,
     * catches such code; at most two iterations, so the loop costs
     * nothing. */
#pragma unroll 1
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < pre)
            continue; /* issued before the wait */
        if (s < n_tiles)
            load_tile(s, s, no_hole);
        tc_cp_commit();
    }
    for (int kt = 0; kt < n_tiles; kt++) {
        tc_cp_wait<TC_STAGES - 2>();
        /* tile kt landed in this warp's rows (the only ones it writes and
         * reads); tile kt-1's stage is free there */
        __syncwarp();
        {
            int nk = kt + TC_STAGES - 1;
            if (nk < n_tiles)
                load_tile(nk % TC_STAGES, nk, no_hole);
            tc_cp_commit();
        }
        const bf16_t *tk = sk + (kt % TC_STAGES) * TILE + warp * WPART;
        const bf16_t *tv = sv + (kt % TC_STAGES) * TILE + warp * WPART;
        const int kb = start + kt * TC_TK + warp * 16;
        if (kb >= end)
            continue; /* this warp's 16 keys are all past the split */
        if constexpr (KV8) {
            const size_t so = (size_t)(kt % TC_STAGES) * TC_TK * HD +
                              warp * 16 * HD;
            const uint8_t *k8 = sk8 + so, *v8 = sv8 + so;
            if constexpr (KT) {
                if (mrow)
                    tc_attend16_kv8t<HD, true>(qa, k8, v8, kb, end, ctx,
                                               mrow, o, m0, m1, l0, l1, lane);
                else
                    tc_attend16_kv8t<HD, false>(qa, k8, v8, kb, end, ctx,
                                                mrow, o, m0, m1, l0, l1,
                                                lane);
            } else if (mrow)
                tc_attend16_kv8<HD, true>(qa, k8, v8, kb, end, ctx, mrow, o,
                                          m0, m1, l0, l1, lane);
            else
                tc_attend16_kv8<HD, false>(qa, k8, v8, kb, end, ctx, mrow, o,
                                           m0, m1, l0, l1, lane);
        } else if (mrow)
            tc_attend16<HD, true>(qa, tk, tv, kb, end, ctx, mrow, sl2, o,
                                  m0, m1, l0, l1, lane);
        else
            tc_attend16<HD, false>(qa, tk, tv, kb, end, ctx, mrow, sl2, o,
                                   m0, m1, l0, l1, lane);
    }
    tc_cp_wait<0>();
    __syncthreads(); /* the pipeline's shared memory is reused below */

    /* Row sums over the 4 lanes of a row (KT: a head's over the 8 lanes
     * of its column); warps' results to shared. */
    if constexpr (KT) {
#pragma unroll
        for (int o2 = 4; o2 <= 16; o2 <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
            l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
        }
    } else {
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
            l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
        }
    }
    KPROF(0, 3);
    /* [W][16][OROW]: rows of HD floats, KV8 tc_o8_at's */
    constexpr int OROW = KV8 ? tc_smem<HD>::O8_ROW : HD;
    float *sm_o = reinterpret_cast<float *>(tc_sm);
    float *sm_m = sm_o + TC_WARPS * TC_MAX_GROUP * OROW;
    float *sm_l = sm_m + TC_WARPS * TC_MAX_GROUP;
    float *ow = sm_o + warp * TC_MAX_GROUP * OROW;
    if constexpr (KT) {
        /* o[mt]: dims (HD / 8) gr + mt (+ HD / 16) of heads 2 tq, + 1 */
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int g = 2 * tq + (j & 1);
                const int d = (HD / 8) * gr + mt + (j >> 1) * (HD / 16);
                if (g < G)
                    ow[tc_o8_at<HD>(g, d)] = o[mt][j];
            }
        if (gr == 0) {
            sm_m[warp * TC_MAX_GROUP + 2 * tq] = m0;
            sm_m[warp * TC_MAX_GROUP + 2 * tq + 1] = m1;
            sm_l[warp * TC_MAX_GROUP + 2 * tq] = l0;
            sm_l[warp * TC_MAX_GROUP + 2 * tq + 1] = l1;
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if constexpr (KV8) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    /* the accumulators' dims (tc_attend16_kv8) */
                    const int d = (HD / 8) * (2 * tq + j) + nt;
                    if (gr < G)
                        ow[tc_o8_at<HD>(gr, d)] = o[nt][j];
                    if (gr + 8 < G)
                        ow[tc_o8_at<HD>(gr + 8, d)] = o[nt][2 + j];
                }
            } else {
                int d = nt * 8 + 2 * tq;
                if (gr < G) {
                    ow[gr * HD + d] = o[nt][0];
                    ow[gr * HD + d + 1] = o[nt][1];
                }
                if (gr + 8 < G) {
                    ow[(gr + 8) * HD + d] = o[nt][2];
                    ow[(gr + 8) * HD + d + 1] = o[nt][3];
                }
            }
        }
        if (tq == 0) {
            sm_m[warp * TC_MAX_GROUP + gr] = m0;
            sm_m[warp * TC_MAX_GROUP + gr + 8] = m1;
            sm_l[warp * TC_MAX_GROUP + gr] = l0;
            sm_l[warp * TC_MAX_GROUP + gr + 8] = l1;
        }
    }
    __syncthreads();

    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int g = idx / HD;
        int d = idx - g * HD;
        float mx = -INFINITY, ls = 0.0f, as = 0.0f;
#pragma unroll
        for (int w = 0; w < TC_WARPS; w++)
            mx = fmaxf(mx, sm_m[w * TC_MAX_GROUP + g]);
#pragma unroll
        for (int w = 0; w < TC_WARPS; w++) {
            float mw = sm_m[w * TC_MAX_GROUP + g];
            float sc = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
            ls += sm_l[w * TC_MAX_GROUP + g] * sc;
            as += (KV8 ? sm_o[w * TC_MAX_GROUP * OROW + tc_o8_at<HD>(g, d)]
                       : sm_o[(w * TC_MAX_GROUP + g) * HD + d]) *
                  sc;
        }
        int h = h0 + g;
        if constexpr (KV8) /* the KV head's V scale */
            as *= a.d_kv_scale[a.n_kv_heads + kvh];
        if (n_splits == 1) {
            bf16_t *op = (bf16_t *)a.d_out + ((size_t)tok * a.n_heads + h) * HD;
            op[d] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
        } else {
            float *p = ws + (((size_t)ti * a.n_heads + h) * n_splits + split) *
                                (HD + 2);
            p[2 + d] = as;
            if (d == 0) {
                /* natural-log units, as attn_combine_kernel expects */
                p[0] = mx == -INFINITY ? -INFINITY : mx * 0.6931471805599453f;
                p[1] = ls;
            }
        }
    }
#ifdef BT_KPROF
    __syncthreads();
#endif
    KPROF(0, 4);
}

bool cuda_attn_decode_tc_ok(const cuda_attn_args_t *a, cuda_dtype_t dt)
{
    const char *env = cuda_switches()->attn_tc;
    int group = a->n_heads / a->n_kv_heads;

    if (env && strcmp(env, "0") == 0)
        return false;
    return dt == CUDA_DT_BF16 && (a->head_dim == 64 || a->head_dim == 128) &&
           group >= 1 && group <= TC_MAX_GROUP;
}

/* NEWROW: the kernel with the new-key row written by the prologue into
 * an early tile (fill_new): steps of <= TC_NEWROW_MAX_TOK tokens with the
 * fused RoPE and splits of <= 2 tiles, where that split is the
 * attention's last block; elsewhere the kernel without it (round 17: the
 * hole in every step's copy path cost batch 64; batch 1 gains, round 18
 * of docs/PERFORMANCE.md). */
#define TC_NEWROW_MAX_TOK 2

/* The instance's shared memory, opted in on the current device (a
 * per-device attribute: tensor-parallel ranks, one thread per GPU, each
 * need it on their own). */
template <int HD, bool NEWROW, bool KV8, bool KT = false>
static cudaError_t tc_smem_opt_in(size_t *bytes_p)
{
    const size_t bytes = KV8 ? tc_smem<HD>::BYTES8 : tc_smem<HD>::BYTES;
    static bool attr_set[64];
    int dev = 0;
    cudaError_t derr = cudaGetDevice(&dev);

    *bytes_p = bytes;
    if (derr != cudaSuccess)
        return derr;
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        cudaError_t err = cudaFuncSetAttribute(
            attn_decode_tc_kernel<HD, NEWROW, KV8, KT>,
            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (err != cudaSuccess)
            return err;
        if (dev >= 0 && dev < 64)
            attr_set[dev] = true;
    }
    return cudaSuccess;
}

template <int HD, bool KV8, bool KT = false> static int tc_blocks_per_sm(void)
{
    size_t bytes = 0;
    int n = 0;

    if (tc_smem_opt_in<HD, false, KV8, KT>(&bytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, attn_decode_tc_kernel<HD, false, KV8, KT>, TC_WARPS * 32,
            bytes) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return 2;
    }
    return n;
}

/* FP8 KV in groups of <= 8 heads (Llama-3's 4, Llama-2-70B's 8) runs
 * tc_attend16_kv8t, the keys as the MMA's rows: half the MMAs of
 * tc_attend16_kv8 and 120 registers at head 128 against 154, so four
 * blocks an SM, not three (H100, 2026-12-07: the decode attention of
 * batch 64 @2k and of 2048/128's and 2048/2048's mixed steps 4-5%
 * faster, docs/PERFORMANCE.md); larger groups run tc_attend16_kv8. */
int cuda_attn_decode_blocks_per_sm(int head_dim, bool kv8, int group)
{
    const bool kt = kv8 && group <= TC_KT_MAX_GROUP;
    if (head_dim == 64)
        return kt    ? tc_blocks_per_sm<64, true, true>()
               : kv8 ? tc_blocks_per_sm<64, true>()
                     : tc_blocks_per_sm<64, false>();
    if (head_dim == 128)
        return kt    ? tc_blocks_per_sm<128, true, true>()
               : kv8 ? tc_blocks_per_sm<128, true>()
                     : tc_blocks_per_sm<128, false>();
    return 2;
}

template <int HD, bool NEWROW, bool KV8, bool KT = false>
static cudaError_t tc_launch(const cuda_attn_args_t *a, const int *tok_idx,
                             int n, int n_splits, int split_len, float *ws,
                             cudaStream_t stream)
{
    size_t bytes = 0;
    cudaError_t err = tc_smem_opt_in<HD, NEWROW, KV8, KT>(&bytes);

    if (err != cudaSuccess)
        return err;
    kern_launch(attn_decode_tc_kernel<HD, NEWROW, KV8, KT>,
                dim3(a->n_kv_heads, n, n_splits),
                dim3(TC_WARPS * 32), bytes, stream, *a, tok_idx, split_len,
                n_splits, ws);
    return cudaSuccess;
}

/* The instance for the new-row path (nr), FP8 KV, or neither. */
template <int HD>
static cudaError_t tc_launch_hd(bool nr, const cuda_attn_args_t *a,
                                const int *tok_idx, int n, int n_splits,
                                int split_len, float *ws, cudaStream_t stream)
{
    if (a->d_kv_scale != NULL) {
        if (a->n_heads / a->n_kv_heads <= TC_KT_MAX_GROUP)
            return tc_launch<HD, false, true, true>(a, tok_idx, n, n_splits,
                                                    split_len, ws, stream);
        return tc_launch<HD, false, true>(a, tok_idx, n, n_splits, split_len,
                                          ws, stream);
    }
    if (nr)
        return tc_launch<HD, true, false>(a, tok_idx, n, n_splits, split_len,
                                          ws, stream);
    return tc_launch<HD, false, false>(a, tok_idx, n, n_splits, split_len,
                                       ws, stream);
}

bt_status_t cuda_attn_decode_tc(const cuda_attn_args_t *a, const int *tok_idx,
                                int n, int n_splits, int split_len, float *ws,
                                cudaStream_t stream)
{
    const bool nr = a->d_qkv != NULL && n <= TC_NEWROW_MAX_TOK &&
                    split_len <= (TC_STAGES - 1) * TC_TK;
    cudaError_t err =
        a->head_dim == 64
            ? tc_launch_hd<64>(nr, a, tok_idx, n, n_splits, split_len, ws,
                               stream)
            : tc_launch_hd<128>(nr, a, tok_idx, n, n_splits, split_len, ws,
                                stream);

    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}

#ifdef BT_KPROF
extern "C" void cuda_kprof_dump_attn_tc(FILE *f)
{
    kprof_dump("attn", f);
}
#endif
