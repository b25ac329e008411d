/*
 * attn_decode.cu - paged attention, one query token per work item, for
 * decode steps (and every other token the tiled prefill kernel does not
 * take).  Grid (kv heads x head groups, tokens, key splits); a block of 4
 * warps reads each key/value row of its KV head ONCE for up to MAXG query
 * heads (GQA).  A key row is spread over L = hd/E lanes (E elements each,
 * 16-byte loads), so a warp scores 32/L keys per step with a log2(L)-step
 * shuffle reduction; each lane group keeps an online softmax, merged over
 * the warp, then over warps in shared memory.  With n_splits > 1 each
 * block writes (max, sum, acc) partials and attn_combine_kernel merges
 * them (flash-decoding), so batch 1 at long context still fills the GPU.
 * q (tokens, nh, hd); K/V cache (slots, nkv, hd); f32 or bf16, f32 math.
 * FP8 KV (kv8.cuh, bf16 only): the same loop over E4M3 codes, half the
 * bytes a key; a KV head's K scale is folded into q (score = q.k_code *
 * k_scale) and its V scale into the output ((P.v_code) * v_scale).
 * Test: build-cuda/tests/kernels/test_attn (make gpu-test runs it).
 */
#include "attn_decode.h"

#include <math.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "kv8.cuh"

#define ATTN_WARPS 4
#define ATTN_UNROLL 4
#define ATTN_BT_SMEM 512 /* block-table entries staged in shared memory */

template <typename T> static __device__ __forceinline__ float attn_exp(float x)
{
    return __expf(x);
}
template <> __device__ __forceinline__ float attn_exp<float>(float x)
{
    return expf(x); /* exactness mode: accurate exp */
}

template <typename T, typename KT, int HD, int MAXG>
static __global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_decode_kernel(cuda_attn_args_t a, const int *tok_idx, int n_hgroups,
                   int split_len, int n_splits, float *ws)
{
    constexpr bool KV8 = std::is_same<KT, kv8_t>::value;
    constexpr int VE = 16 / (int)sizeof(T);
    constexpr int E = (HD / 32 > VE) ? HD / 32 : (HD < VE ? HD : VE);
    constexpr int L = HD / E;    /* lanes per key row */
    constexpr int KPW = 32 / L;  /* keys per warp step */
    constexpr int STEP = ATTN_WARPS * KPW;
    __shared__ float sh_m[ATTN_WARPS][MAXG];
    __shared__ float sh_l[ATTN_WARPS][MAXG];
    __shared__ float sh_acc[ATTN_WARPS][MAXG][HD];

    if (!a.pdl_late)
        kern_pdl_trigger();
    kern_pdl_wait();
    const int G = a.n_heads / a.n_kv_heads;
    const int kvh = blockIdx.x / n_hgroups;
    const int hg = blockIdx.x - kvh * n_hgroups;
    const int h0 = kvh * G + hg * MAXG;
    const int ng = min(MAXG, G - hg * MAXG);
    const int ti = blockIdx.y;
    const int tok = tok_idx ? tok_idx[ti] : ti;
    const int split = blockIdx.z;
    const int kv_len = a.d_kv_len[tok];
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int grp = lane / L;
    const int li = lane - grp * L;
    const int bs = a.block_size;

    float q[MAXG][E];
    float m[MAXG], l[MAXG], acc[MAXG][E];
    const float qscale = KV8 ? a.scale * a.d_kv_scale[kvh] : a.scale;
    const T *qp = (const T *)a.d_q + ((size_t)tok * a.n_heads + h0) * HD +
                  li * E;
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g < ng) {
            kern_load_vec<T, E>(qp + g * HD, q[g]);
#pragma unroll
            for (int e = 0; e < E; e++)
                q[g][e] *= qscale;
        } else {
#pragma unroll
            for (int e = 0; e < E; e++)
                q[g][e] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
            acc[g][e] = 0.0f;
    }

    const int *bt = a.d_block_tables + a.d_bt_off[tok];
    const int ctx = a.d_ctx_len[tok];
    const int moff = a.d_mask_off[tok];
    const uint8_t *mrow = moff >= 0 ? a.d_masks + moff : NULL;
    const size_t slot_stride = (size_t)a.n_kv_heads * HD;
    const KT *kbase = (const KT *)a.d_k_cache + (size_t)kvh * HD + li * E;
    const KT *vbase = (const KT *)a.d_v_cache + (size_t)kvh * HD + li * E;
    /* a lane's E elements of a row: NV loads of W bytes */
    constexpr int RB = E * (int)sizeof(KT);
    constexpr int W = RB < 16 ? RB : 16;
    constexpr int NV = RB / W;
    typedef typename kv_word<W>::type word_t;

    /* This split's slice of the block table, staged once, so a key's
     * address costs no dependent global load. */
    __shared__ int sh_bt[ATTN_BT_SMEM];
    const int blk0 = start / bs;
    const int n_blk = end > start ? (end - 1) / bs - blk0 + 1 : 0;
    const bool bt_sm = n_blk <= ATTN_BT_SMEM;
    if (bt_sm)
        for (int i = threadIdx.x; i < n_blk; i += blockDim.x)
            sh_bt[i] = bt[blk0 + i];
    __syncthreads();

    for (int k0 = start + warp * KPW; k0 < end; k0 += ATTN_UNROLL * STEP) {
        word_t kr[ATTN_UNROLL][NV], vr[ATTN_UNROLL][NV];
        bool valid[ATTN_UNROLL];

        /* Issue every load of the step before using any. */
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            int k = k0 + u * STEP + grp;
            valid[u] = k < end;
            if (valid[u] && mrow && k >= ctx && !mrow[k - ctx])
                valid[u] = false;
            if (valid[u]) {
                int blk = k / bs;
                int bid = bt_sm ? sh_bt[blk - blk0] : bt[blk];
                size_t slot = (size_t)bid * bs + (k - blk * bs);
                const word_t *kp =
                    (const word_t *)(kbase + slot * slot_stride);
                const word_t *vp =
                    (const word_t *)(vbase + slot * slot_stride);
#pragma unroll
                for (int c = 0; c < NV; c++) {
                    kr[u][c] = kp[c];
                    vr[u][c] = vp[c];
                }
            } else {
#pragma unroll
                for (int c = 0; c < NV; c++)
                    kr[u][c] = vr[u][c] = word_t{};
            }
        }
        /* Scores of the step's keys, then ONE softmax rescale per head
         * for all of them (fewer exps and a shorter dependent chain). */
        float sc[ATTN_UNROLL][MAXG];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            float kv[E];
            kern_load_vec<KT, E>((const KT *)kr[u], kv);
#pragma unroll
            for (int g = 0; g < MAXG; g++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++)
                    d += q[g][e] * kv[e];
                sc[u][g] = d;
            }
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++)
#pragma unroll
                for (int g = 0; g < MAXG; g++)
                    sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
        float vv[ATTN_UNROLL][E];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++)
            kern_load_vec<KT, E>((const KT *)vr[u], vv[u]);
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g >= ng)
                continue;
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++)
                if (valid[u])
                    mx = fmaxf(mx, sc[u][g]);
            if (mx == -INFINITY)
                continue; /* no visible key yet */
            float corr = attn_exp<T>(m[g] - mx);
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++) {
                if (!valid[u])
                    continue;
                float p = attn_exp<T>(sc[u][g] - mx);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[g][e] += p * vv[u][e];
            }
            m[g] = mx;
        }
    }

    if (KV8) { /* the V scale, once per output element */
        const float vs = a.d_kv_scale[a.n_kv_heads + kvh];
#pragma unroll
        for (int g = 0; g < MAXG; g++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][e] *= vs;
    }

    /* Merge the lane groups of this warp (lanes li, li+L, li+2L, ...). */
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        float mx = m[g];
#pragma unroll
        for (int o = L; o < 32; o <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sc = m[g] == -INFINITY ? 0.0f : attn_exp<T>(m[g] - mx);
        l[g] *= sc;
#pragma unroll
        for (int e = 0; e < E; e++)
            acc[g][e] *= sc;
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
        }
        m[g] = mx;
        if (grp == 0) {
#pragma unroll
            for (int e = 0; e < E; e++)
                sh_acc[warp][g][li * E + e] = acc[g][e];
            if (li == 0) {
                sh_m[warp][g] = m[g];
                sh_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();

    /* Merge the warps; write the output or this split's partial. */
    for (int idx = threadIdx.x; idx < ng * HD; idx += blockDim.x) {
        int g = idx / HD;
        int d = idx - g * HD;
        float mx = -INFINITY, ls = 0.0f, as = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++)
            mx = fmaxf(mx, sh_m[w][g]);
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) {
            float sc = sh_m[w][g] == -INFINITY
                           ? 0.0f : attn_exp<T>(sh_m[w][g] - mx);
            ls += sh_l[w][g] * sc;
            as += sh_acc[w][g][d] * sc;
        }
        int h = h0 + g;
        if (n_splits == 1) {
            T *o = (T *)a.d_out + ((size_t)tok * a.n_heads + h) * HD;
            o[d] = kern_from_f<T>(ls > 0.0f ? as / ls : 0.0f);
        } else {
            float *p = ws + (((size_t)ti * a.n_heads + h) * n_splits + split) *
                                (HD + 2);
            p[2 + d] = as;
            if (d == 0) {
                p[0] = mx;
                p[1] = ls;
            }
        }
    }
}

/* Merges the n_splits partials of each (token, head). */
template <typename T>
static __global__ void attn_combine_kernel(cuda_attn_args_t a,
                                           const int *tok_idx, int n_splits,
                                           const float *ws)
{
    if (!a.pdl_late)
        kern_pdl_trigger();
    kern_pdl_wait();
    const int hd = a.head_dim;
    const int ti = blockIdx.x;
    const int h = blockIdx.y;
    const int tok = tok_idx ? tok_idx[ti] : ti;
    const float *p0 = ws + ((size_t)ti * a.n_heads + h) * n_splits * (hd + 2);
    float mx = -INFINITY;

    for (int s = 0; s < n_splits; s++)
        mx = fmaxf(mx, p0[s * (hd + 2)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float ls = 0.0f, as = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *p = p0 + s * (hd + 2);
            float sc = p[0] == -INFINITY ? 0.0f : attn_exp<T>(p[0] - mx);
            ls += p[1] * sc;
            as += p[2 + d] * sc;
        }
        T *o = (T *)a.d_out + ((size_t)tok * a.n_heads + h) * hd;
        o[d] = kern_from_f<T>(ls > 0.0f ? as / ls : 0.0f);
    }
}

/* attn_combine_kernel with the (token, head)'s partials staged in shared
 * memory first, then merged from there: same operations in the same
 * order, so the same result bit for bit.  The staging copy keeps
 * COMBINE_ILP 8-byte loads in flight per thread: one load at a time, as
 * a plain copy loop compiles, left the kernel waiting on L1TEX most of
 * its time, twice as long as the attention it merges at batch 1. */
#define COMBINE_ILP 8
#define COMBINE_THREADS 256
template <typename T>
static __global__ void attn_combine_smem_kernel(cuda_attn_args_t a,
                                                const int *tok_idx,
                                                int n_splits, const float *ws)
{
    extern __shared__ float cs[]; /* n_splits x (hd + 2), then scales */
    KPROF(0, 0);
    if (!a.pdl_late)
        kern_pdl_trigger();
    kern_pdl_wait();
    KPROF(0, 1);
    const int hd = a.head_dim, stride = hd + 2;
    const int ti = blockIdx.x;
    const int h = blockIdx.y;
    const int tok = tok_idx ? tok_idx[ti] : ti;
    const float *p0 = ws + ((size_t)ti * a.n_heads + h) * n_splits * stride;
    float *sc = cs + n_splits * stride;

    {
        /* stride is even and so is the (token, head) offset: float2 */
        const float2 *src = reinterpret_cast<const float2 *>(p0);
        float2 *dst = reinterpret_cast<float2 *>(cs);
        const int n2 = n_splits * stride / 2;
        const int nb = blockDim.x;
        int i = threadIdx.x;
        for (; i + (COMBINE_ILP - 1) * nb < n2; i += COMBINE_ILP * nb) {
            float2 v[COMBINE_ILP];
#pragma unroll
            for (int u = 0; u < COMBINE_ILP; u++)
                v[u] = __ldcg(src + i + u * nb);
#pragma unroll
            for (int u = 0; u < COMBINE_ILP; u++)
                dst[i + u * nb] = v[u];
        }
        for (; i < n2; i += nb)
            dst[i] = __ldcg(src + i);
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; s++)
        mx = fmaxf(mx, cs[s * stride]);
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x)
        sc[s] = cs[s * stride] == -INFINITY ? 0.0f
                                            : attn_exp<T>(cs[s * stride] - mx);
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float ls = 0.0f, as = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            ls += cs[s * stride + 1] * sc[s];
            as += cs[s * stride + 2 + d] * sc[s];
        }
        T *o = (T *)a.d_out + ((size_t)tok * a.n_heads + h) * hd;
        o[d] = kern_from_f<T>(ls > 0.0f ? as / ls : 0.0f);
    }
#ifdef BT_KPROF
    __syncthreads();
#endif
    KPROF(0, 4);
}

/* Under cuda__pdl_late (steps of <= 2 tokens) the combine still triggers
 * its dependents at its top: the o projection's blocks are then resident
 * and issue their first weight loads while it runs (faster than
 * triggering by ending, as the decode kernels do: round 14 of
 * docs/PERFORMANCE.md).  The unstaged combine takes what does not fit in
 * 48 KB of shared memory. */
template <typename T>
static void attn_combine_launch(const cuda_attn_args_t *a, const int *tok_idx,
                                int n, int n_splits, const float *ws,
                                cudaStream_t stream)
{
    const size_t smem = ((size_t)n_splits * (a->head_dim + 2) + n_splits) *
                        sizeof(float);
    cuda_attn_args_t al = *a;

    al.pdl_late = 0; /* triggers at its top, late step or not */
    a = &al;

    if (smem <= 48 * 1024) {
        kern_launch(attn_combine_smem_kernel<T>, dim3(n, a->n_heads),
                    dim3(COMBINE_THREADS), smem, stream, *a, tok_idx,
                    n_splits, ws);
        return;
    }
    kern_launch(attn_combine_kernel<T>, dim3(n, a->n_heads),
                dim3(BT_MIN(a->head_dim, 128)), 0, stream, *a, tok_idx,
                n_splits, ws);
}

bool cuda_attn_head_dim_ok(int head_dim)
{
    return head_dim == 8 || head_dim == 16 || head_dim == 32 ||
           head_dim == 64 || head_dim == 128 || head_dim == 256;
}

static int attn_maxg(int group)
{
    return group >= 8 ? 8 : group >= 4 ? 4 : group >= 2 ? 2 : 1;
}

/* Cost-model constants, in keys: a block's fixed cost (block table, Q,
 * pipeline fill and drain, merge) and the combine pass of a split run.
 * ATTN_PLAN_STREAMS: blocks whose streams together take an SM's share of
 * DRAM bandwidth (H100, FP8 KV: a block alone streams 23.7 GB/s, an SM's
 * share of the 2.97 TB/s a full wave reads is 22.5), so a step never
 * costs less than its keys over n_sm x that many streams, however it is
 * split. */
#define ATTN_PLAN_RAMP 64
#define ATTN_PLAN_COMBINE 128
#define ATTN_PLAN_STREAMS 1

void cuda_attn_decode_plan(int n, int max_kv, int n_heads, int n_kv_heads,
                           int n_sm, int blocks_per_sm, int max_splits,
                           int *n_splits_p, int *split_len_p)
{
    int group = n_heads / n_kv_heads;
    int maxg = attn_maxg(group);
    long base = (long)n * n_kv_heads * BT_DIV_UP(group, maxg);
    int split_len = 4096;
    int n_splits;

    if (max_kv < 1)
        max_kv = 1;
    if (max_splits < 1)
        max_splits = 1;
    if (n_sm < 1)
        n_sm = 1;
    if (blocks_per_sm < 1)
        blocks_per_sm = 1;
    {
        /* Every block of a wave streams about the same keys, so a step
         * costs waves x (ramp + keys per block), but never less than
         * its keys at the bandwidth (ATTN_PLAN_STREAMS), plus the
         * combine pass when split: the fewest splits whose waves stay
         * full win (batch 64 at 2k: one split of 2048, no combine), many
         * short splits only when one wave is not full (batch 1), none
         * once the bandwidth bounds the step anyway (H100, FP8 KV at four
         * blocks an SM, `bench_kernels --dec-kv8 --dec-splits`: batch 32
         * @2k 51.8 us a layer in one split, 54.7 in two; batch 8 20.7 in
         * four, 21.4 in eight). */
        const long slots = (long)blocks_per_sm * n_sm;
        const long stream =
            BT_DIV_UP(base * (long)max_kv, (long)n_sm * ATTN_PLAN_STREAMS);
        long best_cost = -1;
        int best_len = 0;
        for (int len = 64; len <= 4096; len *= 2) {
            long ns = BT_DIV_UP(max_kv, len);
            if (ns > max_splits)
                continue;
            long waves = BT_DIV_UP(base * ns, slots);
            long keys = BT_MIN((long)len, (long)max_kv);
            long cost = BT_MAX(waves * (ATTN_PLAN_RAMP + keys), stream) +
                        (ns > 1 ? ATTN_PLAN_COMBINE : 0);
            if (best_cost < 0 || cost <= best_cost) {
                best_cost = cost;
                best_len = len;
            }
            if (len >= max_kv)
                break; /* longer splits change nothing */
        }
        if (best_len > 0) {
            *split_len_p = best_len;
            *n_splits_p = (int)BT_MAX(BT_DIV_UP(max_kv, best_len), 1L);
            return;
        }
        split_len = 4096; /* too many keys for max_splits: below */
    }
    while (split_len > 64 && split_len / 2 >= max_kv)
        split_len /= 2;
    while (BT_DIV_UP(max_kv, split_len) > max_splits)
        split_len *= 2;
    n_splits = (int)BT_DIV_UP(max_kv, split_len);
    if (n_splits < 1)
        n_splits = 1;
    *n_splits_p = n_splits;
    *split_len_p = split_len;
}

size_t cuda_attn_decode_ws_floats(int n, int n_heads, int head_dim,
                                  int n_splits)
{
    if (n_splits <= 1)
        return 0;
    return (size_t)n * n_heads * n_splits * (head_dim + 2);
}

template <typename T, typename KT, int HD>
static void attn_decode_launch_hd(const cuda_attn_args_t *a,
                                  const int *tok_idx, int n, int n_splits,
                                  int split_len, float *ws,
                                  cudaStream_t stream)
{
    int group = a->n_heads / a->n_kv_heads;
    int maxg = attn_maxg(group);
    int n_hgroups = (int)BT_DIV_UP(group, maxg);
    dim3 grid(a->n_kv_heads * n_hgroups, n, n_splits);

    switch (maxg) {
    case 1:
        kern_launch(attn_decode_kernel<T, KT, HD, 1>, grid, ATTN_WARPS * 32, 0,
                    stream, *a, tok_idx, n_hgroups, split_len, n_splits,
                    ws);
        break;
    case 2:
        kern_launch(attn_decode_kernel<T, KT, HD, 2>, grid, ATTN_WARPS * 32, 0,
                    stream, *a, tok_idx, n_hgroups, split_len, n_splits,
                    ws);
        break;
    case 4:
        kern_launch(attn_decode_kernel<T, KT, HD, 4>, grid, ATTN_WARPS * 32, 0,
                    stream, *a, tok_idx, n_hgroups, split_len, n_splits,
                    ws);
        break;
    default:
        kern_launch(attn_decode_kernel<T, KT, HD, 8>, grid, ATTN_WARPS * 32, 0,
                    stream, *a, tok_idx, n_hgroups, split_len, n_splits,
                    ws);
        break;
    }
    if (n_splits > 1)
        attn_combine_launch<T>(a, tok_idx, n, n_splits, ws, stream);
}

template <typename T, typename KT>
static void attn_decode_launch(const cuda_attn_args_t *a, const int *tok_idx,
                               int n, int n_splits, int split_len, float *ws,
                               cudaStream_t stream)
{
    switch (a->head_dim) {
    case 8:
        attn_decode_launch_hd<T, KT, 8>(a, tok_idx, n, n_splits,
                                        split_len, ws, stream);
        break;
    case 16:
        attn_decode_launch_hd<T, KT, 16>(a, tok_idx, n, n_splits,
                                         split_len, ws, stream);
        break;
    case 32:
        attn_decode_launch_hd<T, KT, 32>(a, tok_idx, n, n_splits,
                                         split_len, ws, stream);
        break;
    case 64:
        attn_decode_launch_hd<T, KT, 64>(a, tok_idx, n, n_splits,
                                         split_len, ws, stream);
        break;
    case 128:
        attn_decode_launch_hd<T, KT, 128>(a, tok_idx, n, n_splits,
                                          split_len, ws, stream);
        break;
    default:
        attn_decode_launch_hd<T, KT, 256>(a, tok_idx, n, n_splits,
                                          split_len, ws, stream);
        break;
    }
}

bool cuda_attn_decode_rope_ok(const cuda_attn_args_t *args, int n,
                              cuda_dtype_t dt)
{
    (void)n;
    return cuda_attn_decode_tc_ok(args, dt);
}

bt_status_t cuda_attn_decode(const cuda_attn_args_t *args,
                             const int *d_tok_idx, int n, int n_splits,
                             int split_len, float *d_ws, cuda_dtype_t dt,
                             cudaStream_t stream)
{
    BT_ASSERT(cuda_attn_head_dim_ok(args->head_dim));
    BT_ASSERT(args->n_heads % args->n_kv_heads == 0);
    BT_ASSERT(n_splits >= 1 && split_len >= 1);
    BT_ASSERT(n_splits == 1 || d_ws != NULL);
    if (n == 0)
        return BT_OK;
    cuda_attn_args_t al = *args;
    al.pdl_late = cuda__pdl_late;
    args = &al;
    BT_ASSERT(args->d_qkv == NULL || cuda_attn_decode_rope_ok(args, n, dt));
    if (cuda_attn_decode_tc_ok(args, dt)) {
        bt_status_t st = cuda_attn_decode_tc(args, d_tok_idx, n, n_splits,
                                             split_len, d_ws, stream);
        if (st != BT_OK || n_splits == 1)
            return st;
        attn_combine_launch<bf16_t>(args, d_tok_idx, n, n_splits, d_ws,
                                    stream);
        return BT_CUDA_LAUNCH_STATUS();
    }
    if (args->d_kv_scale != NULL) {
        BT_ASSERT(dt == CUDA_DT_BF16); /* FP8 KV: bf16 activations */
        attn_decode_launch<bf16_t, kv8_t>(args, d_tok_idx, n, n_splits,
                                          split_len, d_ws, stream);
        return BT_CUDA_LAUNCH_STATUS();
    }
    KERN_DISPATCH_DT(dt, T,
                     attn_decode_launch<T, T>(args, d_tok_idx, n, n_splits,
                                              split_len, d_ws, stream));
    return BT_CUDA_LAUNCH_STATUS();
}

#ifdef BT_KPROF
extern "C" void cuda_kprof_dump_combine(FILE *f)
{
    kprof_dump("combine", f);
}
#endif
