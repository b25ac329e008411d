/*
 * attn_decode_sk.cu - stream-K decode attention: the tensor-core kernel's
 * per-warp pipeline (attn_decode_tc.cuh) on a fixed grid of about two
 * blocks an SM, in groups of n_kv_heads blocks: group j takes the j-th
 * equal run of the step's (token, 64-key tile) positions, its block kvh
 * that run for KV head kvh, instead of one block per (token, KV head)
 * item.
 *
 * Why: with one block an item, batch 64 at 2k context is 512 items on
 * 264 block slots, so the second wave leaves 16 slots idle and the
 * kernel (most of the step at that shape) ends at the speed of its
 * longest wave.  Here every block streams the same number of tiles, and
 * the warps' pipelines run on across item boundaries (the next item's
 * first tiles load while this one's last are used).
 *
 * An item inside one run is merged there and written out.  An item cut
 * by run boundaries (at most the first and the last of each run) is
 * written as a partial (max in log2 units, sum, unnormalised O) to the
 * block's slot 0 (the run's first item) or 1 (its last); the block that
 * brings the item's counter to its number of pieces merges the pieces in
 * block order (deterministic: the same bits whoever arrives last) and
 * resets the counter, so the counters stay zero between launches.
 *
 * The grid is fixed at launch (CUDA graphs replay it while context
 * lengths change): every block computes the tile count from d_kv_len.
 *
 * Opt-in (BT_ATTN_SK=1: cuda_attn_decode() takes it for one split
 * whenever the args carry its buffers), because it measured slower than
 * the split kernel where it was meant to win (round 12, H200, µs a layer,
 * same call: 64 x 2048 keys 149.9 vs 140.4, 64 x 512 53.9 vs 42.1; equal
 * at 64 x 8192, 538.6 vs 541.5 with two splits; 2% faster on 512 tokens
 * of one KV head).  The loss is a fixed ~10 us a launch, not per tile:
 * candidates are the __threadfence before each piece's counter (it may
 * wait for the warp's cp.async copies in flight) and the Q loads and
 * block barriers at each item start and end (2-3 a block).
 *
 * BT_ATTN_SK=2 (round 20): runs of whole tokens where the items
 * outnumber the block slots (batch 64 at 2k: 256 blocks of two tokens'
 * items each, against 512 blocks in two waves), so no item is cut: no
 * pieces, fences or counters, but the pipeline still runs on from one
 * item into the next, where the split kernel's second wave starts all
 * its blocks' pipelines at once.  (3: whole tokens always, for tests.)
 * Tested by tests/kernels/test_attn.cu against the CPU reference.
 */
#include "attn_decode.h"

#include <math.h>

#include "attn_decode_tc.cuh"
#include "bt_util.h"
#include "kern_common.cuh"

#define SK_THREADS (TC_WARPS * 32)
#define SK_BLOCKS_PER_SM 2 /* 2 x 113 KB of shared memory */

template <int HD> struct sk_smem {
    static constexpr size_t MERGE_O =
        (size_t)TC_WARPS * CUDA_ATTN_SK_MAX_GROUP * HD * sizeof(float);
    static constexpr size_t MERGE_ML =
        (size_t)TC_WARPS * CUDA_ATTN_SK_MAX_GROUP * 2 * sizeof(float);
    static constexpr size_t BYTES = tc_rows<HD>::PIPE + MERGE_O + MERGE_ML;
};

/* What the kernel needs of one query token. */
typedef struct {
    int tok, kv_len, ctx, bt_off, moff;
    int n_tiles; /* >= 1: a token without keys gets one empty tile (O = 0) */
} sk_tok_t;

static __device__ __forceinline__ sk_tok_t sk_tok(const cuda_attn_args_t &a,
                                                  const int *tok_idx, int ti)
{
    sk_tok_t t;
    t.tok = tok_idx ? tok_idx[ti] : ti;
    t.kv_len = a.d_kv_len[t.tok];
    t.ctx = a.d_ctx_len[t.tok];
    t.bt_off = a.d_bt_off[t.tok];
    t.moff = a.d_mask_off[t.tok];
    t.n_tiles = max(1, (t.kv_len + TC_TK - 1) / TC_TK);
    return t;
}

static __device__ __forceinline__ int sk_tiles(const cuda_attn_args_t &a,
                                               const int *tok_idx, int ti)
{
    int tok = tok_idx ? tok_idx[ti] : ti;
    return max(1, (a.d_kv_len[tok] + TC_TK - 1) / TC_TK);
}

/* A position in the (token, key tile) order: token ti (described by t),
 * tile kt of it, and the token's first position. */
typedef struct {
    int ti, kt;
    long long tok0;
    sk_tok_t t;
} sk_cur_t;

static __device__ __forceinline__ void sk_next(sk_cur_t &c,
                                               const cuda_attn_args_t &a,
                                               const int *tok_idx, int n)
{
    if (++c.kt < c.t.n_tiles)
        return;
    c.kt = 0;
    c.tok0 += c.t.n_tiles;
    if (++c.ti < n)
        c.t = sk_tok(a, tok_idx, c.ti);
}

/* First position of group j's run, and the group whose run holds
 * position g (the runs [j P / ng, (j + 1) P / ng) are non-empty when
 * P >= ng). */
static __device__ __forceinline__ long long sk_lo(int j, long long P, int ng)
{
    return (long long)j * P / ng;
}
static __device__ __forceinline__ int sk_group_of(long long g, long long P,
                                                  int ng)
{
    return (int)(((g + 1) * ng + P - 1) / P) - 1;
}

/* The grid is groups of n_kv_heads blocks, block kvh of a group taking KV
 * head kvh, every block of group j the same run of (token, tile)
 * positions: the group's blocks read the same cache slots (each its 256
 * bytes of a 2 KB row) at about the same time, as the split kernel's
 * blocks of one token do.  Round 12: with runs over (token, KV head,
 * tile) instead, neighbouring blocks read unrelated slots and 64 x 2048
 * keys took 155 us a layer against the split kernel's 141. */
template <int HD>
static __global__ void __launch_bounds__(SK_THREADS)
attn_decode_sk_kernel(cuda_attn_args_t a, const int *tok_idx, int n,
                      bool early, int tpg)
{
    constexpr int ROW = tc_rows<HD>::ROW;
    constexpr int TILE = tc_rows<HD>::TILE;
    constexpr int NT = HD / 8;
    constexpr int MG = CUDA_ATTN_SK_MAX_GROUP;
    extern __shared__ __align__(16) unsigned char sk_sm[];
    bf16_t *sk = reinterpret_cast<bf16_t *>(sk_sm); /* [STAGES][TK][ROW] */
    bf16_t *sv = sk + TC_STAGES * TILE;
    float *mo = reinterpret_cast<float *>(sk_sm + tc_rows<HD>::PIPE);
    float *mm = mo + TC_WARPS * MG * HD; /* [W][MG] max (log2) */
    float *ml = mm + TC_WARPS * MG;      /* [W][MG] sum */
    __shared__ long long sh_warp[TC_WARPS];
    __shared__ long long sh_p0, sh_lo, sh_hi;
    __shared__ int sh_ti, sh_last;

    const int G = a.n_heads / a.n_kv_heads;
    const int nkv = a.n_kv_heads;
    const int kvh = blockIdx.x % nkv;
    const int grp = blockIdx.x / nkv;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int gr = lane >> 2;
    const int tq = lane & 3;

    /* Up to kern_pdl_wait() only the host's metadata and cached K/V are
     * read (as in attn_decode_tc.cu); q, the new keys, the counters and
     * the partials only after it. */
    if (!a.pdl_late)
        kern_pdl_trigger();

    /* 1. The step's positions by an exclusive scan over the tokens, each
     * thread a contiguous share; the token holding this run's first. */
    const int per = (n + SK_THREADS - 1) / SK_THREADS;
    const int t0 = threadIdx.x * per, t1 = min(n, t0 + per);
    long long mine = 0;
    for (int ti = t0; ti < t1; ti++)
        mine += sk_tiles(a, tok_idx, ti);
    long long incl = mine;
#pragma unroll
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
        long long v = __shfl_up_sync(0xffffffffu, incl, o2);
        if (lane >= o2)
            incl += v;
    }
    if (lane == 31)
        sh_warp[warp] = incl;
    __syncthreads();
    long long before = incl - mine, P = 0;
#pragma unroll
    for (int w = 0; w < TC_WARPS; w++) {
        if (w < warp)
            before += sh_warp[w];
        P += sh_warp[w];
    }
    const int ng = (int)min((long long)(gridDim.x / nkv), P);
    if (grp >= ng)
        return; /* fewer positions than groups */
    long long lo, hi;
    if (tpg > 0) {
        /* whole tokens: group grp takes tokens [T0, T1), every item
         * inside one run (no pieces, no counters) */
        const int T0 = grp * tpg, T1 = min(n, T0 + tpg);
        if (T0 >= n)
            return; /* the same in every thread */
        long long p = before; /* the positions where T0 and T1 start */
        for (int ti = t0; ti < t1; ti++) {
            if (ti == T0)
                sh_lo = p;
            if (ti == T1)
                sh_hi = p;
            p += sk_tiles(a, tok_idx, ti);
        }
        if (T1 == n && threadIdx.x == 0)
            sh_hi = P;
        __syncthreads();
        lo = sh_lo;
        hi = sh_hi;
    } else {
        lo = sk_lo(grp, P, ng);
        hi = sk_lo(grp + 1, P, ng);
    }
    if (mine > 0 && before <= lo && lo < before + mine) {
        long long p = before;
        int ti = t0;
        for (;; ti++) {
            long long nt = sk_tiles(a, tok_idx, ti);
            if (lo < p + nt)
                break;
            p += nt;
        }
        sh_ti = ti;
        sh_p0 = p;
    }
    __syncthreads();

    sk_cur_t cc; /* the tile being computed */
    cc.ti = sh_ti;
    cc.t = sk_tok(a, tok_idx, cc.ti);
    cc.tok0 = sh_p0;
    cc.kt = (int)(lo - sh_p0);
    sk_cur_t lc = cc; /* the next tile to load */
    const int n_run = (int)(hi - lo);
    const int bs = a.block_size;
    const int bs_sh = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1; /* log2 */
    const long long slot_stride = (long long)nkv * HD;
    const bf16_t *kbase = (const bf16_t *)a.d_k_cache + (size_t)kvh * HD;
    const bf16_t *vbase = (const bf16_t *)a.d_v_cache + (size_t)kvh * HD;

    /* Lane r < 16: the cache offset of row r of tile c (-1: past the
     * keys).  Taken one tile ahead of its copy, so the block-table load
     * is in flight while a tile is computed (the split kernel reads the
     * table from shared memory instead). */
    auto tile_off = [&](const sk_cur_t &c) -> long long {
        const int k = c.kt * TC_TK + warp * 16 + (lane & 15);
        if (k >= c.t.kv_len)
            return -1;
        int blk = bs_sh >= 0 ? k >> bs_sh : k / bs;
        int bid = a.d_block_tables[c.t.bt_off + blk];
        return ((long long)bid * bs + (k - blk * bs)) * slot_stride;
    };
    auto copy_tile = [&](int stage, long long off) {
        tc_copy_rows16<HD>(sk + stage * TILE + warp * 16 * ROW,
                           sv + stage * TILE + warp * 16 * ROW, kbase, vbase,
                           off, lane);
    };
    int n_loaded = 0;
    long long off_nx = tile_off(lc);
    auto load_next = [&](int stage) {
        copy_tile(stage, off_nx);
        if (++n_loaded < n_run) {
            sk_next(lc, a, tok_idx, n);
            off_nx = tile_off(lc);
        }
    };
    if (early)
        while (n_loaded < TC_STAGES - 1 && n_loaded < n_run &&
               min(lc.t.kv_len, (lc.kt + 1) * TC_TK) <= lc.t.ctx) {
            load_next(n_loaded);
            tc_cp_commit();
        }
    kern_pdl_wait();
    for (int s = n_loaded; s < TC_STAGES - 1; s++) {
        if (s < n_run)
            load_next(s);
        tc_cp_commit();
    }

    uint32_t qa[HD / 16][4];
    float o[NT][4];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 */
    float *const ws = a.d_sk_ws;

    for (int i = 0; i < n_run; i++) {
        tc_cp_wait<TC_STAGES - 2>();
        __syncwarp(); /* tile i landed in this warp's rows */
        if (i + TC_STAGES - 1 < n_run)
            load_next((i + TC_STAGES - 1) % TC_STAGES);
        tc_cp_commit();
        if (i == 0 || cc.kt == 0) { /* an item starts */
            tc_load_q<HD>(qa,
                          (const bf16_t *)a.d_q +
                              ((size_t)cc.t.tok * a.n_heads + kvh * G) * HD,
                          G, lane);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
            m0 = m1 = -INFINITY;
            l0 = l1 = 0.0f;
        }
        const int kb = cc.kt * TC_TK + warp * 16;
        if (kb < cc.t.kv_len) {
            const int st = i % TC_STAGES;
            const bf16_t *tk = sk + st * TILE + warp * 16 * ROW;
            const bf16_t *tv = sv + st * TILE + warp * 16 * ROW;
            if (cc.t.moff >= 0)
                tc_attend16<HD, true>(qa, tk, tv, kb, cc.t.kv_len, cc.t.ctx,
                                      a.d_masks + cc.t.moff, sl2, o, m0, m1,
                                      l0, l1, lane);
            else
                tc_attend16<HD, false>(qa, tk, tv, kb, cc.t.kv_len,
                                       cc.t.ctx, NULL, sl2, o, m0, m1, l0,
                                       l1, lane);
        }
        if (i < n_run - 1 && cc.kt < cc.t.n_tiles - 1) {
            sk_next(cc, a, tok_idx, n);
            continue;
        }

        /* 2. The item's piece ends here: the warps' (m, l, O) merged. */
        float ls0 = l0;
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1)
            ls0 += __shfl_xor_sync(0xffffffffu, ls0, o2);
        if (gr < G) { /* G <= 4: rows gr + 8 are padding */
            float *ow = mo + (warp * MG + gr) * HD;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                ow[nt * 8 + 2 * tq] = o[nt][0];
                ow[nt * 8 + 2 * tq + 1] = o[nt][1];
            }
            if (tq == 0) {
                mm[warp * MG + gr] = m0;
                ml[warp * MG + gr] = ls0;
            }
        }
        __syncthreads();
        const int g0 = sk_group_of(cc.tok0, P, ng);
        const int g1 = sk_group_of(cc.tok0 + cc.t.n_tiles - 1, P, ng);
        const bool whole = tpg > 0 || g0 == g1;
        const int slot = cc.tok0 <= lo ? 0 : 1;
        bf16_t *op = (bf16_t *)a.d_out +
                     ((size_t)cc.t.tok * a.n_heads + kvh * G) * HD;
        for (int idx = threadIdx.x; idx < G * HD; idx += SK_THREADS) {
            const int g = idx / HD, d = idx - g * HD;
            float mx = -INFINITY, ls = 0.0f, as = 0.0f;
#pragma unroll
            for (int w = 0; w < TC_WARPS; w++)
                mx = fmaxf(mx, mm[w * MG + g]);
#pragma unroll
            for (int w = 0; w < TC_WARPS; w++) {
                float mw = mm[w * MG + g];
                float sc = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
                ls += ml[w * MG + g] * sc;
                as += mo[(w * MG + g) * HD + d] * sc;
            }
            if (whole) {
                op[idx] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
            } else {
                float *p = ws + ((size_t)(blockIdx.x * 2 + slot) * MG + g) *
                                    (HD + 2);
                p[2 + d] = as;
                if (d == 0) {
                    p[0] = mx;
                    p[1] = ls;
                }
            }
        }
        if (!whole) {
            __threadfence(); /* the piece, before the counter says so */
            __syncthreads();
            if (threadIdx.x == 0) {
                int *cnt = a.d_sk_count + (size_t)cc.ti * nkv + kvh;
                int old = atomicAdd(cnt, 1);
                sh_last = old == g1 - g0;
                if (sh_last)
                    *cnt = 0; /* every piece has arrived: ready for the
                                 next launch */
            }
            __syncthreads();
            if (sh_last) {
                __threadfence();
                for (int idx = threadIdx.x; idx < G * HD;
                     idx += SK_THREADS) {
                    const int g = idx / HD, d = idx - g * HD;
                    float mx = -INFINITY, ls = 0.0f, as = 0.0f;
                    for (int j = g0; j <= g1; j++) {
                        const int sj = cc.tok0 <= sk_lo(j, P, ng) ? 0 : 1;
                        mx = fmaxf(mx, __ldcg(ws + ((size_t)((j * nkv + kvh) *
                                                                 2 + sj) *
                                                        MG + g) * (HD + 2)));
                    }
                    for (int j = g0; j <= g1; j++) {
                        const int sj = cc.tok0 <= sk_lo(j, P, ng) ? 0 : 1;
                        const float *p =
                            ws + ((size_t)((j * nkv + kvh) * 2 + sj) * MG +
                                  g) * (HD + 2);
                        float mj = __ldcg(p);
                        float sc = mj == -INFINITY ? 0.0f : exp2f(mj - mx);
                        ls += __ldcg(p + 1) * sc;
                        as += __ldcg(p + 2 + d) * sc;
                    }
                    op[idx] = __float2bfloat16_rn(ls > 0.0f ? as / ls
                                                            : 0.0f);
                }
            }
        }
        __syncthreads(); /* the merge buffers and sh_last are free again */
        sk_next(cc, a, tok_idx, n);
    }
    tc_cp_wait<0>();
}

/* Block slots of the device: SK_BLOCKS_PER_SM an SM. */
static int sk_slots(void)
{
    static int n_sm[64];
    int dev = 0;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 0;
    if (n_sm[dev] == 0 &&
        cudaDeviceGetAttribute(&n_sm[dev], cudaDevAttrMultiProcessorCount,
                               dev) != cudaSuccess)
        return 0;
    return SK_BLOCKS_PER_SM * n_sm[dev];
}

/* The grid: as many whole groups of n_kv_heads blocks as fit the slots. */
static int sk_grid(int n_kv_heads)
{
    return sk_slots() / n_kv_heads * n_kv_heads;
}

size_t cuda_attn_decode_sk_ws_floats(int head_dim)
{
    return (size_t)sk_slots() * 2 * CUDA_ATTN_SK_MAX_GROUP * (head_dim + 2);
}

/* BT_ATTN_SK (read every call, as BT_ATTN_TC: tests switch it): 0 off
 * (the default, see the round-12 note at the top), 1 equal runs of
 * positions, 2 runs of whole tokens where the items outnumber the block
 * slots (one block an item would take more than one wave), 3 runs of
 * whole tokens always (tests). */
static int sk_mode(void)
{
    const char *env = getenv("BT_ATTN_SK");
    const int m = env ? atoi(env) : 0;

    return m >= 1 && m <= 3 ? m : 0;
}

bool cuda_attn_decode_sk_enabled(void)
{
    return sk_mode() != 0;
}

/* Tokens a group in the whole-token modes (0: equal runs): as few as
 * fill the slots' groups, so that every group takes the same count. */
static int sk_tpg(int n, int n_kv_heads)
{
    const int groups = sk_grid(n_kv_heads) / n_kv_heads;

    if (sk_mode() < 2 || groups < 1)
        return 0;
    return (n + groups - 1) / groups;
}

bool cuda_attn_decode_sk_ok(const cuda_attn_args_t *a, int n)
{
    const int mode = sk_mode();
    const int grid = a->n_kv_heads > 0 ? sk_grid(a->n_kv_heads) : 0;

    return mode != 0 && a->d_sk_count != NULL && a->d_sk_ws != NULL &&
           grid > 0 && n >= 1 && n <= a->sk_max_tokens &&
           a->n_heads / a->n_kv_heads <= CUDA_ATTN_SK_MAX_GROUP &&
           (mode != 2 || (long long)n * a->n_kv_heads > sk_slots());
}

template <int HD>
static cudaError_t sk_launch(const cuda_attn_args_t *a, const int *tok_idx,
                             int n, cudaStream_t stream)
{
    const size_t bytes = sk_smem<HD>::BYTES;
    static bool attr_set[64]; /* per device, as in attn_decode_tc.cu */
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);

    if (err != cudaSuccess)
        return err;
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        err = cudaFuncSetAttribute(attn_decode_sk_kernel<HD>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)bytes);
        if (err != cudaSuccess)
            return err;
        if (dev >= 0 && dev < 64)
            attr_set[dev] = true;
    }
    const char *env = getenv("BT_ATTN_EARLY");
    const bool early = !(env && strcmp(env, "0") == 0);
    const int tpg = sk_tpg(n, a->n_kv_heads);
    const int grid = tpg > 0 ? (n + tpg - 1) / tpg * a->n_kv_heads
                             : sk_grid(a->n_kv_heads);
    kern_launch(attn_decode_sk_kernel<HD>, dim3(grid), dim3(SK_THREADS),
                bytes, stream, *a, tok_idx, n, early, tpg);
    return cudaSuccess;
}

bt_status_t cuda_attn_decode_sk(const cuda_attn_args_t *a, const int *tok_idx,
                                int n, cudaStream_t stream)
{
    BT_ASSERT(cuda_attn_decode_sk_ok(a, n));
    cudaError_t err = a->head_dim == 64 ? sk_launch<64>(a, tok_idx, n, stream)
                                        : sk_launch<128>(a, tok_idx, n,
                                                         stream);
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}
