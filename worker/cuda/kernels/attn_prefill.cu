/*
 * attn_prefill.cu - flash attention for prompt chunks on tensor cores.
 * A block (4 warps) takes 64 queries of one sequence and one query head;
 * each warp owns 16 query rows.  For each tile of 64 keys (read from the
 * paged cache, prefix and new tokens alike): S = Q K^T with bf16 WMMA
 * 16x16x16 (f32 accumulate), the online softmax in f32 with the causal
 * rule or the sequence's mask, then O += P V with WMMA; O lives in
 * accumulator fragments and is rescaled through shared memory.
 * q (tokens, nh, hd) bf16, K/V cache (slots, nkv, hd) bf16, out like q.
 * FP8 KV (d_kv_scale, kv8.cuh): the FA2 kernels at head 64/128
 * (attn_prefill_fa2.cu, fa2wqv / fa2), this file's shared-memory kernel
 * at 16, 32 and 256: the codes widened to bf16 (exact) as the tile is
 * staged, the KV head's K scale folded into the score scale and its V
 * scale into the output.
 * Test: build-cuda/tests/kernels/test_attn (make gpu-test runs it).
 */
#include "attn_prefill.h"

#include <math.h>
#include <cuda_pipeline.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "kv8.cuh"

using namespace nvcuda;

#define PF_BQ CUDA_PREFILL_BQ
#define PF_BK 64
#define PF_WARPS 4

template <int HD> struct pf_smem {
    static constexpr int LDQ = HD + 8;    /* bf16 row pitch of Q, K, V */
    static constexpr int LDS = PF_BK + 4; /* f32 pitch of S */
    static constexpr int LDP = PF_BK + 8; /* bf16 pitch of P */
    static constexpr int LDO = HD + 4;    /* f32 pitch of O */
    static constexpr size_t Q_OFF = 0;
    static constexpr size_t K_OFF = Q_OFF + (size_t)PF_BQ * LDQ * 2;
    static constexpr size_t V_OFF = K_OFF + (size_t)PF_BK * LDQ * 2;
    static constexpr size_t S_OFF = V_OFF + (size_t)PF_BK * LDQ * 2;
    static constexpr size_t P_OFF = S_OFF + (size_t)PF_BQ * LDS * 4;
    static constexpr size_t O_OFF = P_OFF + (size_t)PF_BQ * LDP * 2;
    static constexpr size_t C_OFF = O_OFF + (size_t)PF_BQ * LDO * 4;
    static constexpr size_t BYTES = C_OFF + (size_t)PF_BQ * 4;
};

template <int HD, bool KV8>
static __global__ void __launch_bounds__(PF_WARPS * 32)
attn_prefill_kernel(cuda_attn_args_t a, const int *tiles)
{
    typedef pf_smem<HD> SM;
    extern __shared__ __align__(128) char smem[];
    bf16_t *Qs = (bf16_t *)(smem + SM::Q_OFF);
    bf16_t *Ks = (bf16_t *)(smem + SM::K_OFF);
    bf16_t *Vs = (bf16_t *)(smem + SM::V_OFF);
    float *S = (float *)(smem + SM::S_OFF);
    bf16_t *P = (bf16_t *)(smem + SM::P_OFF);
    float *Os = (float *)(smem + SM::O_OFF);
    float *corr_sh = (float *)(smem + SM::C_OFF);

    const int *t = tiles + (size_t)blockIdx.x * CUDA_PREFILL_TILE_INTS;
    const int tok0 = t[CUDA_PT_TOK0];
    const int i0 = t[CUDA_PT_I0];
    const int n_q = t[CUDA_PT_NQ];
    const int n_tok = t[CUDA_PT_NTOK];
    const int ctx = t[CUDA_PT_CTX];
    const int *bt = a.d_block_tables + t[CUDA_PT_BT_OFF];
    const int moff = t[CUDA_PT_MASK_OFF];
    const uint8_t *mask = moff >= 0 ? a.d_masks + moff : NULL;
    const int h = blockIdx.y;
    const int kvh = h / (a.n_heads / a.n_kv_heads);
    const int bs = a.block_size;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int half = lane >> 4;
    const int row = warp * 16 + (lane & 15); /* this lane's query row */
    const int qi = i0 + row;                 /* its index in the sequence */
    const bool row_ok = row < n_q;
    const int kv_end = mask ? ctx + n_tok : ctx + min(n_tok, i0 + n_q);
    constexpr int CH = HD / 8; /* 16-byte chunks per row */

    /* Q tile: rows past n_q are zero. */
    for (int idx = threadIdx.x; idx < PF_BQ * CH; idx += blockDim.x) {
        int r = idx / CH, c = idx - r * CH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < n_q)
            v = *(const uint4 *)((const bf16_t *)a.d_q +
                                 ((size_t)(tok0 + i0 + r) * a.n_heads + h) *
                                     HD + c * 8);
        *(uint4 *)(Qs + r * SM::LDQ + c * 8) = v;
    }

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[HD / 16];
#pragma unroll
    for (int j = 0; j < HD / 16; j++)
        wmma::fill_fragment(o[j], 0.0f);
    float m = -INFINITY, l = 0.0f;
    const size_t slot_stride = (size_t)a.n_kv_heads * HD;
    const bf16_t *kb_base = (const bf16_t *)a.d_k_cache + (size_t)kvh * HD;
    const bf16_t *vb_base = (const bf16_t *)a.d_v_cache + (size_t)kvh * HD;
    /* FP8 KV: 8 codes (8 bytes) per chunk of 8 elements */
    const uint8_t *kb8 = (const uint8_t *)a.d_k_cache + (size_t)kvh * HD;
    const uint8_t *vb8 = (const uint8_t *)a.d_v_cache + (size_t)kvh * HD;
    const float s_scale = KV8 ? a.scale * a.d_kv_scale[kvh] : a.scale;

    for (int kb = 0; kb < kv_end; kb += PF_BK) {
        __syncthreads(); /* everyone is done with the previous K/V tile */
        for (int idx = threadIdx.x; idx < PF_BK * CH; idx += blockDim.x) {
            int r = idx / CH, c = idx - r * CH;
            int s = kb + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (s < kv_end) {
                int blk = s / bs;
                size_t slot = (size_t)bt[blk] * bs + (s - blk * bs);
                if constexpr (KV8) {
                    kv = kv8_to_bf16x8(*(const uint2 *)(
                        kb8 + slot * slot_stride + c * 8));
                    vv = kv8_to_bf16x8(*(const uint2 *)(
                        vb8 + slot * slot_stride + c * 8));
                } else {
                    kv = *(const uint4 *)(kb_base + slot * slot_stride +
                                          c * 8);
                    vv = *(const uint4 *)(vb_base + slot * slot_stride +
                                          c * 8);
                }
            }
            *(uint4 *)(Ks + r * SM::LDQ + c * 8) = kv;
            *(uint4 *)(Vs + r * SM::LDQ + c * 8) = vv;
        }
        __syncthreads();

        /* S (this warp's 16 rows x 64 keys) = Q K^T. */
#pragma unroll
        for (int n = 0; n < PF_BK / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc;
            wmma::fill_fragment(sacc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t,
                               wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t,
                               wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Qs + warp * 16 * SM::LDQ + kk * 16,
                                       SM::LDQ);
                wmma::load_matrix_sync(fb, Ks + n * 16 * SM::LDQ + kk * 16,
                                       SM::LDQ);
                wmma::mma_sync(sacc, fa, fb, sacc);
            }
            wmma::store_matrix_sync(S + warp * 16 * SM::LDS + n * 16, sacc,
                                    SM::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* Online softmax: lanes r and r+16 share row r, 32 keys each. */
        float *srow = S + row * SM::LDS + half * 32;
        bf16_t *prow = P + row * SM::LDP + half * 32;
        float tmax = -INFINITY;
#pragma unroll 8
        for (int c = 0; c < 32; c++) {
            int s = kb + half * 32 + c;
            bool vis = row_ok && s < kv_end &&
                       (s < ctx || (mask ? mask[(size_t)qi * n_tok + s - ctx]
                                         : s - ctx <= qi));
            float v = vis ? srow[c] * s_scale : -INFINITY;
            srow[c] = v;
            tmax = fmaxf(tmax, v);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
        float m_new = fmaxf(m, tmax);
        float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
        float psum = 0.0f;
#pragma unroll 8
        for (int c = 0; c < 32; c++) {
            float v = srow[c];
            float p = v == -INFINITY ? 0.0f : __expf(v - m_new);
            bf16_t pb = __float2bfloat16_rn(p);
            prow[c] = pb;
            psum += __bfloat162float(pb); /* the P that V is weighted by */
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 16);
        l = l * corr + psum;
        m = m_new;
        if (half == 0)
            corr_sh[row] = corr;
        __syncwarp();

        /* O *= corr (per row), through shared memory. */
        float *ow = Os + warp * 16 * SM::LDO;
#pragma unroll
        for (int j = 0; j < HD / 16; j++)
            wmma::store_matrix_sync(ow + j * 16, o[j], SM::LDO,
                                    wmma::mem_row_major);
        __syncwarp();
        for (int idx = lane; idx < 16 * HD; idx += 32) {
            int r = idx / HD, d = idx - r * HD;
            ow[r * SM::LDO + d] *= corr_sh[warp * 16 + r];
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HD / 16; j++)
            wmma::load_matrix_sync(o[j], ow + j * 16, SM::LDO,
                                   wmma::mem_row_major);

        /* O += P V. */
#pragma unroll
        for (int kk = 0; kk < PF_BK / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t,
                           wmma::row_major> fp;
            wmma::load_matrix_sync(fp, P + warp * 16 * SM::LDP + kk * 16,
                                   SM::LDP);
#pragma unroll
            for (int j = 0; j < HD / 16; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t,
                               wmma::row_major> fv;
                wmma::load_matrix_sync(fv, Vs + kk * 16 * SM::LDQ + j * 16,
                                       SM::LDQ);
                wmma::mma_sync(o[j], fp, fv, o[j]);
            }
        }
    }

    /* Normalise and write this warp's rows. */
    float *ow = Os + warp * 16 * SM::LDO;
#pragma unroll
    for (int j = 0; j < HD / 16; j++)
        wmma::store_matrix_sync(ow + j * 16, o[j], SM::LDO,
                                wmma::mem_row_major);
    __syncwarp();
    if (row_ok) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        if (KV8) /* the V scale of the KV head */
            inv *= a.d_kv_scale[a.n_kv_heads + kvh];
        bf16_t *out = (bf16_t *)a.d_out +
                      ((size_t)(tok0 + qi) * a.n_heads + h) * HD;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d++)
            out[d] = __float2bfloat16_rn(Os[row * SM::LDO + d] * inv);
    }
}


/*
 * The register-resident variant (FlashAttention-2 style): Q fragments,
 * scores, probabilities and the output accumulator stay in registers;
 * only K and V tiles go through shared memory, double-buffered with
 * cp.async so the next tile loads while this one computes.  Relies on
 * the sm_80+ fragment layout of wmma 16x16x16 (the mma.m16n8k16 one):
 * element i of a lane (g = lane/4, t = lane%4) sits at row
 * g + 8*((i/2)%2), column 2t + i%2 + 8*(i/4), the same for f32
 * accumulators and bf16 row-major A fragments, so a score fragment turns
 * into a probability fragment in place.  test_attn checks it.
 */
template <int HD> struct fa_smem {
    static constexpr int LD = HD + 8;
    static constexpr size_t TILE = (size_t)PF_BK * LD; /* elements */
    static constexpr size_t BYTES = (size_t)(PF_BQ * LD + 4 * TILE) * 2;
};

static __device__ __forceinline__ int fa_row(int lane, int i)
{
    return (lane >> 2) + 8 * ((i >> 1) & 1);
}

static __device__ __forceinline__ int fa_col(int lane, int i)
{
    return 2 * (lane & 3) + (i & 1) + 8 * (i >> 2);
}

template <int HD>
static __global__ void __launch_bounds__(PF_WARPS * 32)
attn_prefill_fa_kernel(cuda_attn_args_t a, const int *tiles)
{
    typedef fa_smem<HD> SM;
    constexpr int LD = SM::LD;
    constexpr int CH = HD / 8;
    extern __shared__ __align__(128) char smem[];
    bf16_t *Qs = (bf16_t *)smem;
    bf16_t *Ks = Qs + PF_BQ * LD;      /* 2 buffers */
    bf16_t *Vs = Ks + 2 * SM::TILE;    /* 2 buffers */

    const int *t = tiles + (size_t)blockIdx.x * CUDA_PREFILL_TILE_INTS;
    const int tok0 = t[CUDA_PT_TOK0];
    const int i0 = t[CUDA_PT_I0];
    const int n_q = t[CUDA_PT_NQ];
    const int n_tok = t[CUDA_PT_NTOK];
    const int ctx = t[CUDA_PT_CTX];
    const int *bt = a.d_block_tables + t[CUDA_PT_BT_OFF];
    const int moff = t[CUDA_PT_MASK_OFF];
    const uint8_t *mask = moff >= 0 ? a.d_masks + moff : NULL;
    const int h = blockIdx.y;
    const int kvh = h / (a.n_heads / a.n_kv_heads);
    const int bs = a.block_size;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int kv_end = mask ? ctx + n_tok : ctx + min(n_tok, i0 + n_q);
    const int n_kt = (kv_end + PF_BK - 1) / PF_BK;
    const size_t slot_stride = (size_t)a.n_kv_heads * HD;
    const bf16_t *kb_base = (const bf16_t *)a.d_k_cache + (size_t)kvh * HD;
    const bf16_t *vb_base = (const bf16_t *)a.d_v_cache + (size_t)kvh * HD;

    for (int idx = threadIdx.x; idx < PF_BQ * CH; idx += blockDim.x) {
        int r = idx / CH, c = idx - r * CH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < n_q)
            v = *(const uint4 *)((const bf16_t *)a.d_q +
                                 ((size_t)(tok0 + i0 + r) * a.n_heads + h) *
                                     HD + c * 8);
        *(uint4 *)(Qs + r * LD + c * 8) = v;
    }

    /* Starts the copy of key tile kt into buffer kt % 2. */
    auto load_tile = [&](int kt) {
        bf16_t *kd = Ks + (kt & 1) * SM::TILE;
        bf16_t *vd = Vs + (kt & 1) * SM::TILE;
        for (int idx = threadIdx.x; idx < PF_BK * CH; idx += blockDim.x) {
            int r = idx / CH, c = idx - r * CH;
            int s = kt * PF_BK + r;
            if (s < kv_end) {
                int blk = s / bs;
                size_t slot = (size_t)bt[blk] * bs + (s - blk * bs);
                __pipeline_memcpy_async(kd + r * LD + c * 8,
                                        kb_base + slot * slot_stride + c * 8,
                                        16);
                __pipeline_memcpy_async(vd + r * LD + c * 8,
                                        vb_base + slot * slot_stride + c * 8,
                                        16);
            } else {
                *(uint4 *)(kd + r * LD + c * 8) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(vd + r * LD + c * 8) = make_uint4(0, 0, 0, 0);
            }
        }
        __pipeline_commit();
    };

    if (n_kt > 0)
        load_tile(0);
    __syncthreads(); /* Q is in shared memory */
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>
        qf[HD / 16];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wmma::load_matrix_sync(qf[kk], Qs + warp * 16 * LD + kk * 16, LD);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[HD / 16];
#pragma unroll
    for (int j = 0; j < HD / 16; j++)
        wmma::fill_fragment(o[j], 0.0f);
    float m_r[2] = {-INFINITY, -INFINITY}; /* rows g and g+8 */
    float l_r[2] = {0.0f, 0.0f};           /* this lane's partial sums */
    const int row_base = warp * 16;

    for (int kt = 0; kt < n_kt; kt++) {
        if (kt + 1 < n_kt) {
            load_tile(kt + 1);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const bf16_t *K = Ks + (kt & 1) * SM::TILE;
        const bf16_t *V = Vs + (kt & 1) * SM::TILE;
        const int kb0 = kt * PF_BK;

        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf[PF_BK / 16];
#pragma unroll
        for (int n = 0; n < PF_BK / 16; n++) {
            wmma::fill_fragment(sf[n], 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t,
                               wmma::col_major> kf;
                wmma::load_matrix_sync(kf, K + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(sf[n], qf[kk], kf, sf[n]);
            }
        }

        /* Every key of the tile visible to every row of this warp? */
        const bool full = mask == NULL && kb0 + PF_BK <= kv_end &&
                          kb0 + PF_BK - 1 <= ctx + i0 + row_base;
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < PF_BK / 16; n++) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int rl = fa_row(lane, i);
                int s = kb0 + n * 16 + fa_col(lane, i);
                float v = sf[n].x[i] * a.scale;
                if (!full) {
                    int qrow = row_base + rl;
                    int qi = i0 + qrow;
                    bool vis = s < kv_end;
                    if (vis && qrow < n_q && s >= ctx)
                        vis = mask ? mask[(size_t)qi * n_tok + s - ctx] != 0
                                   : s - ctx <= qi;
                    if (!vis)
                        v = -INFINITY;
                }
                sf[n].x[i] = v;
                tmax[(i >> 1) & 1] = fmaxf(tmax[(i >> 1) & 1], v);
            }
        }
        float corr[2], mnew[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
            mnew[r] = fmaxf(m_r[r], tmax[r]);
            corr[r] = m_r[r] == -INFINITY ? 0.0f : __expf(m_r[r] - mnew[r]);
            l_r[r] *= corr[r];
            m_r[r] = mnew[r];
        }
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>
            pf[PF_BK / 16];
#pragma unroll
        for (int n = 0; n < PF_BK / 16; n++) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int r = (i >> 1) & 1;
                float v = sf[n].x[i];
                float p = v == -INFINITY ? 0.0f : __expf(v - mnew[r]);
                bf16_t pb = __float2bfloat16_rn(p);
                pf[n].x[i] = pb;
                l_r[r] += __bfloat162float(pb);
            }
        }
#pragma unroll
        for (int j = 0; j < HD / 16; j++)
#pragma unroll
            for (int i = 0; i < 8; i++)
                o[j].x[i] *= corr[(i >> 1) & 1];
#pragma unroll
        for (int kk = 0; kk < PF_BK / 16; kk++) {
#pragma unroll
            for (int j = 0; j < HD / 16; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t,
                               wmma::row_major> vf;
                wmma::load_matrix_sync(vf, V + kk * 16 * LD + j * 16, LD);
                wmma::mma_sync(o[j], pf[kk], vf, o[j]);
            }
        }
        __syncthreads(); /* buffer kt % 2 is reloaded next iteration */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
#pragma unroll
    for (int j = 0; j < HD / 16; j++) {
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            int rl = fa_row(lane, i);
            int qrow = row_base + rl;
            if (qrow >= n_q)
                continue;
            float l = l_r[(i >> 1) & 1];
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
            int col = j * 16 + fa_col(lane, i);
            bf16_t *out = (bf16_t *)a.d_out +
                          ((size_t)(tok0 + i0 + qrow) * a.n_heads + h) * HD +
                          col;
            *(__nv_bfloat162 *)out =
                __floats2bfloat162_rn(o[j].x[i] * inv, o[j].x[i + 1] * inv);
        }
    }
}

bool cuda_attn_prefill_ok(int head_dim, cuda_dtype_t dt)
{
    return dt == CUDA_DT_BF16 &&
           (head_dim == 16 || head_dim == 32 || head_dim == 64 ||
            head_dim == 128 || head_dim == 256);
}

/* The kernel for a head size: attn_prefill_fa2.cu at head 64/128 (bf16),
 * the ping-pong on 128-key tiles at head 128 and fa2wqv at head 64 (the
 * ping-pong kernels run as fa2wqv where a block has one warpgroup or the
 * caches cannot be mapped, all as mma.sync without sm_90a wgmma); the
 * WMMA kernel of this file at head 16 and 32; the shared-memory one at
 * 256.  At head 64 fa2wqv beats the ping-pong: its two 64-row
 * warpgroups, one block an SM, hide too little of the softmax when a
 * tile's products are half as long as at head 128, and fa2wqv runs more
 * warps an SM (docs/PERFORMANCE.md has the figures of each kernel).
 * FP8 KV: fa2wqv at head 64 and 128 (fa2 without wgmma), the
 * shared-memory kernel at 16, 32 and 256. */
/* The shared-memory kernel (KV8: over FP8 codes). */
template <int HD, bool KV8>
static cudaError_t attn_prefill_plain_launch(const cuda_attn_args_t *a,
                                             const int *tiles, int n_tiles,
                                             cudaStream_t stream)
{
    size_t bytes = pf_smem<HD>::BYTES;
    cudaError_t err = cudaFuncSetAttribute(
        attn_prefill_kernel<HD, KV8>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);

    if (err != cudaSuccess)
        return err;
    attn_prefill_kernel<HD, KV8><<<dim3(n_tiles, a->n_heads), PF_WARPS * 32,
                                   bytes, stream>>>(*a, tiles);
    return cudaSuccess;
}

template <int HD>
static cudaError_t attn_prefill_launch(const cuda_attn_args_t *a,
                                       const int *tiles, int n_tiles,
                                       cudaStream_t stream)
{
    if constexpr (HD <= 128) {
        size_t fbytes = fa_smem<HD>::BYTES;
        cudaError_t ferr = cudaFuncSetAttribute(
            attn_prefill_fa_kernel<HD>,
            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fbytes);
        if (ferr != cudaSuccess)
            return ferr;
        attn_prefill_fa_kernel<HD><<<dim3(n_tiles, a->n_heads),
                                     PF_WARPS * 32, fbytes, stream>>>(
            *a, tiles);
        return cudaSuccess;
    } else {
        return attn_prefill_plain_launch<HD, false>(a, tiles, n_tiles,
                                                    stream);
    }
}

bt_status_t cuda_attn_prefill(const cuda_attn_args_t *args,
                              const int *d_tiles, int n_tiles,
                              cuda_dtype_t dt, cudaStream_t stream)
{
    cudaError_t err;

    if (n_tiles == 0)
        return BT_OK;
    BT_ASSERT(cuda_attn_prefill_ok(args->head_dim, dt));
    BT_ASSERT(args->n_heads % args->n_kv_heads == 0);
    /* FP8 KV widened to bf16 (kv_widened): the bf16 kernels below read
     * it and apply the scales (FA2 head sizes only) */
    BT_ASSERT(!args->kv_widened ||
              cuda_attn_prefill_fa2_ok(args->head_dim, dt, false));
    if (args->d_kv_scale != NULL && !args->kv_widened &&
        cuda_attn_prefill_fa2_ok(args->head_dim, dt, true)) {
        /* FP8 KV at head 64/128: fa2wqv (fa2 without sm_90a wgmma); the
         * ping-pong kernels are bf16 only (TMA lands the codes as they
         * are), so 2 at both head sizes */
        err = cuda_attn_prefill_fa2(args, d_tiles, n_tiles, 0, 2, stream);
        if (err != cudaSuccess)
            return BT_CUDA_STATUS(err);
        return BT_CUDA_LAUNCH_STATUS();
    }
    if (args->d_kv_scale != NULL && !args->kv_widened) {
        /* FP8 KV at the other head sizes: the shared-memory kernel, which
         * widens the codes as it stages a tile */
        switch (args->head_dim) {
        case 16:
            err = attn_prefill_plain_launch<16, true>(args, d_tiles, n_tiles,
                                                      stream);
            break;
        case 32:
            err = attn_prefill_plain_launch<32, true>(args, d_tiles, n_tiles,
                                                      stream);
            break;
        default:
            err = attn_prefill_plain_launch<256, true>(args, d_tiles,
                                                       n_tiles, stream);
            break;
        }
        if (err != cudaSuccess)
            return BT_CUDA_STATUS(err);
        return BT_CUDA_LAUNCH_STATUS();
    }
    if (cuda_attn_prefill_fa2_ok(args->head_dim, dt, false)) {
        err = cuda_attn_prefill_fa2(args, d_tiles, n_tiles, 0,
                                    args->head_dim == 128 ? 4 : 2, stream);
        if (err != cudaSuccess)
            return BT_CUDA_STATUS(err);
        return BT_CUDA_LAUNCH_STATUS();
    }
    switch (args->head_dim) {
    case 16:
        err = attn_prefill_launch<16>(args, d_tiles, n_tiles, stream);
        break;
    case 32:
        err = attn_prefill_launch<32>(args, d_tiles, n_tiles, stream);
        break;
    default:
        err = attn_prefill_launch<256>(args, d_tiles, n_tiles, stream);
        break;
    }
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}
