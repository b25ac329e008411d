/*
 * sample.cu - token selection on the device.
 *
 * argmax: one block per logits row, each thread keeps (best value, lowest
 * index) over its elements (8 float4 loads in flight), then a warp and
 * block merge.  NaN never wins.
 *
 * top-k + normalizer (cuda_sample_top): one block per row.  Values map to
 * order-preserving 32-bit keys; a 4-pass radix select (8 bits a pass,
 * a shared-memory histogram over the elements that still match the
 * prefix) finds the k-th largest key T and how many elements equal to T
 * are taken.  The first pass also finds the row max, the second adds up
 * expf((x - max) * inv_t) in double.  A last pass gathers the keys above
 * T (any order) and the first `need` elements equal to T in index order
 * (a block-wide ordered count), then a bitonic sort in shared memory
 * orders the k candidates by (value desc, index asc).  Five reads of the
 * row (512 KB at a 128K vocabulary, from L2 after the first).
 * Test: build/gpu/test_sample (tests/kernels/test_sample.cu).
 *
 * whole-distribution sampling (cuda_sample_dist): see the section below
 * and sample_dist.h.  Test: build-cuda/gpu/test_sample_dist [--bench]
 * (tests/gpu/test_sample_dist.c, reference tests/kernels/
 * sample_dist_ref.c).
 */
#include "sample.h"

#include <math.h>

#include "bt_util.h"
#include "../cuda_switches.h"
#include "kern_common.cuh"

#define ARGMAX_U 8 /* loads in flight a thread */

static __device__ __forceinline__ void argmax_merge(float *v, int *i,
                                                    float ov, int oi)
{
    if (ov > *v || (ov == *v && oi < *i)) {
        *v = ov;
        *i = oi;
    }
}

static __global__ void argmax_kernel(const float *logits, size_t ld,
                                     const int *rows, int vocab, int *ids)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *row =
        logits + (size_t)(rows ? rows[blockIdx.x] : (int)blockIdx.x) * ld;
    float best = -INFINITY;
    int bi = vocab; /* "none yet": larger than any index */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    /* ARGMAX_U loads a thread in flight before it compares (one load at
     * a time left a 128K row latency-bound); float4 loads
     * where the row is 16-byte aligned.  The merge is order-free (value,
     * then lower index), so the visiting order does not matter. */
    const int n4 = ((ld & 3) == 0 && ((uintptr_t)logits & 15) == 0)
                       ? vocab >> 2 : 0;
    const float4 *row4 = reinterpret_cast<const float4 *>(row);
    for (int q0 = threadIdx.x; q0 < n4; q0 += blockDim.x * ARGMAX_U) {
        float4 f[ARGMAX_U];
#pragma unroll
        for (int u = 0; u < ARGMAX_U; u++) {
            int q = q0 + u * blockDim.x;
            f[u] = q < n4 ? row4[q] : make_float4(NAN, NAN, NAN, NAN);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_U; u++) {
            int j = 4 * (q0 + u * blockDim.x);
            argmax_merge(&best, &bi, f[u].x, j);
            argmax_merge(&best, &bi, f[u].y, j + 1);
            argmax_merge(&best, &bi, f[u].z, j + 2);
            argmax_merge(&best, &bi, f[u].w, j + 3);
        }
    }
    for (int j0 = 4 * n4 + threadIdx.x; j0 < vocab;
         j0 += blockDim.x * ARGMAX_U) {
        float f[ARGMAX_U];
#pragma unroll
        for (int u = 0; u < ARGMAX_U; u++) {
            int j = j0 + u * blockDim.x;
            f[u] = j < vocab ? row[j] : NAN;
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_U; u++)
            argmax_merge(&best, &bi, f[u], j0 + u * blockDim.x);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_merge(&best, &bi, ov, oi);
    }
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : vocab;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_merge(&best, &bi, ov, oi);
        }
        if (lane == 0)
            ids[blockIdx.x] = bi < vocab ? bi : 0;
    }
}

bt_status_t cuda_argmax(const float *d_logits, int n_rows, int vocab,
                        int *d_ids, cudaStream_t stream)
{
    return cuda_argmax_rows(d_logits, (size_t)vocab, NULL, n_rows, vocab,
                            d_ids, stream);
}

bt_status_t cuda_argmax_rows(const float *d_logits, size_t ld,
                             const int *d_rows, int n, int vocab, int *d_ids,
                             cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && vocab > 0 && ld >= (size_t)vocab);
    if (n == 0)
        return BT_OK;
    argmax_kernel<<<n, 512, 0, stream>>>(d_logits, ld, d_rows, vocab, d_ids);
    return BT_CUDA_LAUNCH_STATUS();
}

// ---------------------------------------------------------------------
// top-k candidates + normalizer

#define TOP_THREADS 1024

/* Order-preserving key: a larger float gives a larger key; NaN -> 0. */
static __device__ __forceinline__ uint32_t top_key(float f)
{
    uint32_t u = __float_as_uint(f);

    if (isnan(f))
        return 0;
    if (f == 0.0f)
        u = 0; /* -0 ranks with +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct op_add {
    template <typename T> __device__ T operator()(T a, T b) const
    {
        return a + b;
    }
};
struct op_max {
    template <typename T> __device__ T operator()(T a, T b) const
    {
        return a > b ? a : b;
    }
};
struct op_min {
    template <typename T> __device__ T operator()(T a, T b) const
    {
        return a < b ? a : b;
    }
};

/* fmaxf: a NaN operand is ignored */
struct op_fmax {
    __device__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

/* Block-wide reduction; every thread gets the result (a fixed order:
 * lanes by xor shuffle, then the warps in order: deterministic).  Starts
 * and ends with a barrier, so it also publishes the scratch row's
 * writes.  buf: one T a warp. */
template <typename T, typename Op>
static __device__ T block_reduce(T v, Op op, T *buf)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = buf[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        v = op(v, buf[w]);
    __syncthreads();
    return v;
}

/* Calls f(j, v, in) for the elements j = tid, tid + blockDim.x, ... of a
 * row x of n floats, in that order (v = x[j]; pad and in = false past
 * the end), loading ROW_ILP of them ahead: with one load in flight a
 * thread, a 1024-thread block walking a 128K row is latency-bound
 * (rounds 7 and 13).  Every thread of the block makes the same number of
 * calls, so f may use warp collectives. */
#define ROW_ILP 8
template <typename F>
static __device__ __forceinline__ void row_walk(const float *x, int n,
                                                float pad, F f)
{
    const int nt = blockDim.x;

    for (int j0 = 0; j0 < n; j0 += ROW_ILP * nt) {
        float v[ROW_ILP];
#pragma unroll
        for (int u = 0; u < ROW_ILP; u++) {
            const int j = j0 + u * nt + threadIdx.x;
            v[u] = j < n ? x[j] : pad;
        }
#pragma unroll
        for (int u = 0; u < ROW_ILP; u++) {
            const int j = j0 + u * nt + threadIdx.x;
            f(j, v[u], j < n);
        }
    }
}

/* The warp's scan of p[lo, end) in steps of 32 (lane l takes lo + 32 s
 * + l), ROW_ILP steps loaded ahead: f(i, v, in) with v = p[i] when in
 * (i < hi), else pad; f returns true to stop (warp-uniformly). */
template <typename F>
static __device__ __forceinline__ void warp_walk(const float *p, int lo,
                                                 int end, int hi, float pad,
                                                 F f)
{
    const int lane = threadIdx.x & 31;

    for (int j0 = lo; j0 < end; j0 += 32 * ROW_ILP) {
        float v[ROW_ILP];
#pragma unroll
        for (int u = 0; u < ROW_ILP; u++) {
            const int i = j0 + 32 * u + lane;
            v[u] = i < hi && j0 + 32 * u < end ? p[i] : pad;
        }
#pragma unroll
        for (int u = 0; u < ROW_ILP; u++) {
            const int i = j0 + 32 * u + lane;
            if (j0 + 32 * u >= end || f(i, v[u], i < hi))
                return;
        }
    }
}

/* Picks the histogram bin holding the *rem-th largest key (warp 0 only;
 * lane l owns bins [8l, 8l + 8)): the picking lane sets *digit and *rem
 * (the rank inside the chosen bin).  *rem >= 1 and <= the histogram's
 * total, so exactly one lane picks. */
static __device__ void top_pick_bin(const unsigned *hist, unsigned *digit,
                                    unsigned *rem)
{
    int lane = threadIdx.x;
    unsigned own = 0, suf, above;
    unsigned r = *rem;

    for (int b = 0; b < 8; b++)
        own += hist[lane * 8 + b];
    /* inclusive suffix sum: bins of lanes >= lane */
    suf = own;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned v = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32)
            suf += v;
    }
    unsigned mask = __ballot_sync(0xffffffffu, suf >= r);
    int ls = 31 - __clz(mask); /* highest lane whose suffix reaches r */
    above = __shfl_sync(0xffffffffu, suf - own, ls);
    if (lane == ls) {
        for (int b = 7; b >= 0; b--) {
            unsigned c = hist[lane * 8 + b];
            if (above + c >= r) {
                *digit = (unsigned)(lane * 8 + b);
                *rem = r - above;
                break;
            }
            above += c;
        }
    }
}

/* Adds one element to bin `bin` of a shared histogram (in: whether this
 * lane has one), one atomic per distinct bin of the warp: logits of a
 * row share their top key byte, so plain per-element atomics on that
 * bin serialize all 1024 threads (round 13).  Every lane of the warp must call it. */
static __device__ __forceinline__ void top_hist_add(unsigned *hist,
                                                    unsigned bin, bool in)
{
    const unsigned peers = __match_any_sync(0xffffffffu, in ? bin : ~0u);

    if (in && (threadIdx.x & 31) == (unsigned)__ffs(peers) - 1)
        atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* cuda_sample_top in three launches, so that a 128K row is walked by
 * TOP_SPLIT_MAX blocks instead of one (the one-block kernel was
 * issue-bound on one SM: round 13):
 *   top_part_kernel  (rows x splits): each block's top kk of its slice
 *                    (radix select, then sorted) and the slice's max;
 *   top_sum_kernel   (rows x splits): the row max from the slices' maxima,
 *                    the slice's sum of expf((x - max) * inv_t) (one
 *                    slice a row, top_splits_for: in top_part_kernel);
 *   top_merge_kernel (rows): the kk best of the slices' sorted lists, each
 *                    candidate placed at its rank (its place in its list
 *                    plus a binary search in every other list: a
 *                    bitonic sort of all 3840 was slower), and the sum
 *                    of the slices' sums in slice order.
 * The candidates are exactly the one-block kernel's (a total order: key,
 * then lower index); each term of the sum is the same, summed in another
 * (fixed) order. */
#define TOP_SPLIT_MAX 16
#define TOP_SPLIT_MIN_LEN 8192 /* elements a slice at least */
#define TOP_MERGE_MAX (TOP_SPLIT_MAX * CUDA_SAMPLE_TOP_MAX)

static int top_splits(int vocab)
{
    return BT_MAX(1, BT_MIN(TOP_SPLIT_MAX, vocab / TOP_SPLIT_MIN_LEN));
}

/* Slices a row for n rows: enough blocks to fill the multiprocessors
 * once.  Short slices cost more a element (each pass's pick, the gather's
 * barriers, the sort): at 64 rows 15 slices a row measured no faster
 * than one (round 13). */
static int top_splits_for(int n, int vocab)
{
    const int sm = kern_sm_count();

    return BT_MAX(1, BT_MIN(top_splits(vocab), (sm > 0 ? sm : 1) / n));
}

/* A candidate: key above, 0xFFFFFFFF - index below (a larger value is a
 * better candidate; 0 = an empty slot). */
static __device__ __forceinline__ unsigned long long top_cand(uint32_t key,
                                                              int j)
{
    return ((unsigned long long)key << 32) |
           (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
}

static __global__ void __launch_bounds__(TOP_THREADS)
    top_part_kernel(const float *logits, size_t ld, const int *rows,
                    int vocab, int kk, int slice, const float *inv_t,
                    unsigned long long *ws_cand, float *ws_max,
                    double *ws_sum)
{
    __shared__ double wsum[32];
    __shared__ unsigned hist[256];
    __shared__ float wmax[32];
    __shared__ unsigned s_digit, s_rem, s_ngt, s_neq_base;
    __shared__ unsigned wcnt[32];
    __shared__ unsigned long long cand[CUDA_SAMPLE_TOP_MAX];
    const int row_i = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const int part = blockIdx.y, n_part = gridDim.y;
    const int lo = part * slice, n = min(vocab, lo + slice) - lo;
    const float *x = logits + (size_t)row_i * ld + lo;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nw = blockDim.x >> 5;
    const int kp = min(kk, n); /* candidates this slice gives */
    unsigned prefix = 0;
    float mx = -INFINITY;

    for (int j = tid; j < CUDA_SAMPLE_TOP_MAX; j += blockDim.x)
        cand[j] = 0ull; /* empty slots (a slice shorter than kk) */
    /* pass 0: max and the top byte's histogram */
    for (int b = tid; b < 256; b += blockDim.x)
        hist[b] = 0;
    if (tid == 0)
        s_rem = (unsigned)kp;
    __syncthreads();
    row_walk(x, n, -INFINITY, [&](int, float v, bool in) {
        mx = fmaxf(mx, v);
        top_hist_add(hist, top_key(v) >> 24, in);
    });
    mx = block_reduce(mx, op_fmax(), wmax);
    if (tid == 0)
        ws_max[(size_t)blockIdx.x * n_part + part] = mx;
    __syncthreads();
    if (kp == 0) { /* an empty slice (vocab < splits: never planned) */
        for (int j = tid; j < kk; j += blockDim.x)
            ws_cand[((size_t)blockIdx.x * n_part + part) * kk + j] = 0ull;
        return;
    }
    if (warp == 0)
        top_pick_bin(hist, &s_digit, &s_rem);
    __syncthreads();
    prefix = s_digit << 24;
    /* passes 1..3: the lower bytes among elements matching the prefix;
     * a row in one slice also sums its exponentials in pass 1 (the
     * slice max is the row max: no top_sum_kernel) */
    const bool one = n_part == 1;
    const float it = inv_t[blockIdx.x];
    double sum = 0.0;
    for (int pass = 1; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        const unsigned hi_mask = 0xFFFFFFFFu << (shift + 8);
        __syncthreads();
        for (int b = tid; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        row_walk(x, n, 0.0f, [&](int, float v, bool in) {
            const uint32_t key = top_key(v);
            if (one && pass == 1 && in && !isnan(v))
                sum += (double)expf((v - mx) * it);
            top_hist_add(hist, (key >> shift) & 255u,
                         in && (key & hi_mask) == prefix);
        });
        __syncthreads();
        if (warp == 0)
            top_pick_bin(hist, &s_digit, &s_rem);
        __syncthreads();
        prefix |= s_digit << shift;
    }

    if (one) {
        sum = block_reduce(sum, op_add(), wsum);
        if (tid == 0)
            ws_sum[blockIdx.x] = sum;
    }

    /* gather: keys > T anywhere, then the first `need` keys == T (index
     * order); slots [0, kp - need) and [kp - need, kp) */
    const uint32_t T = prefix;
    const unsigned need = s_rem;
    if (tid == 0) {
        s_ngt = 0;
        s_neq_base = 0;
    }
    __syncthreads();
    bool done = false;
    for (int j1 = 0; j1 < n && !done; j1 += ROW_ILP * blockDim.x) {
        uint32_t keys[ROW_ILP]; /* loaded ahead (row_walk's reason) */
#pragma unroll
        for (int u = 0; u < ROW_ILP; u++) {
            const int j = j1 + u * blockDim.x + tid;
            keys[u] = j < n ? top_key(x[j]) : 0u;
        }
        for (int u = 0; u < ROW_ILP && !done; u++) {
            const int j0 = j1 + u * blockDim.x;
            if (j0 >= n)
                break;
            const int j = j0 + tid;
            const uint32_t key = keys[u];
            const bool gt = j < n && key > T, eq = j < n && key == T;
            const unsigned bal = __ballot_sync(0xffffffffu, eq);
            const unsigned before = __popc(bal & ((1u << lane) - 1u));
            if (lane == 0)
                wcnt[warp] = __popc(bal);
            if (gt)
                cand[atomicAdd(&s_ngt, 1u)] = top_cand(key, lo + j);
            __syncthreads();
            if (eq) {
                unsigned rank = s_neq_base + before;
                for (int w = 0; w < warp; w++)
                    rank += wcnt[w];
                if (rank < need)
                    cand[(unsigned)kp - need + rank] = top_cand(key, lo + j);
            }
            __syncthreads();
            if (tid == 0) {
                unsigned tot = 0;
                for (int w = 0; w < nw; w++)
                    tot += wcnt[w];
                s_neq_base += tot;
            }
            __syncthreads();
            /* everything taken: the same answer in every thread */
            done = s_neq_base >= need && s_ngt >= (unsigned)kp - need;
            __syncthreads();
        }
    }
    __syncthreads();
    /* bitonic sort, descending (empty slots, 0, sink to the end) */
    for (int size = 2; size <= CUDA_SAMPLE_TOP_MAX; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (tid < CUDA_SAMPLE_TOP_MAX) {
                const int q = tid ^ stride;
                if (q > tid) {
                    const unsigned long long a = cand[tid], b = cand[q];
                    const bool desc = (tid & size) == 0;
                    if (desc ? a < b : a > b) {
                        cand[tid] = b;
                        cand[q] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int j = tid; j < kk; j += blockDim.x)
        ws_cand[((size_t)blockIdx.x * n_part + part) * kk + j] = cand[j];
}

static __global__ void __launch_bounds__(TOP_THREADS)
    top_sum_kernel(const float *logits, size_t ld, const int *rows,
                   int vocab, int slice, const float *inv_t,
                   const float *ws_max, double *ws_sum)
{
    __shared__ double wsum[32];
    const int row_i = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const int part = blockIdx.y, n_part = gridDim.y;
    const int lo = part * slice, n = min(vocab, lo + slice) - lo;
    const float *x = logits + (size_t)row_i * ld + lo;
    const float it = inv_t[blockIdx.x];
    float mx = -INFINITY;
    double sum = 0.0;

    for (int q = 0; q < n_part; q++) /* the row max, NaN ignored */
        mx = fmaxf(mx, ws_max[(size_t)blockIdx.x * n_part + q]);
    row_walk(x, n, 0.0f, [&](int, float v, bool in) {
        if (in && !isnan(v))
            sum += (double)expf((v - mx) * it);
    });
    sum = block_reduce(sum, op_add(), wsum);
    if (threadIdx.x == 0)
        ws_sum[(size_t)blockIdx.x * n_part + part] = sum;
}

static __global__ void __launch_bounds__(TOP_THREADS)
    top_merge_kernel(const float *logits, size_t ld, const int *rows,
                     int k, int kk, int n_part,
                     const unsigned long long *ws_cand, const double *ws_sum,
                     int *out_ids, float *out_vals, double *out_sum)
{
    __shared__ unsigned long long c[TOP_MERGE_MAX];
    const int row_i = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const float *x = logits + (size_t)row_i * ld;
    const int tid = threadIdx.x;
    const int m = n_part * kk;

    for (int j = tid; j < m; j += blockDim.x)
        c[j] = ws_cand[(size_t)blockIdx.x * m + j];
    __syncthreads();
    /* candidate t = list p's i-th: its rank is i plus, in every other
     * list (sorted descending), the count of larger candidates; the
     * candidates are distinct, so ranks 0 .. kk - 1 are each met once */
    for (int t = tid; t < m; t += blockDim.x) {
        const unsigned long long v = c[t];
        const int p = t / kk;
        int rank = t - p * kk;
        if (v == 0ull)
            continue; /* an empty slot */
        for (int q = 0; q < n_part && rank < kk; q++) {
            if (q == p)
                continue;
            const unsigned long long *l = c + q * kk;
            int a = 0, b = kk;
            while (a < b) {
                const int mid = (a + b) >> 1;
                if (l[mid] > v)
                    a = mid + 1;
                else
                    b = mid;
            }
            rank += a;
        }
        if (rank < kk) {
            int id = (int)(0xFFFFFFFFu - (unsigned)(v & 0xFFFFFFFFull));
            out_ids[(size_t)blockIdx.x * k + rank] = id;
            out_vals[(size_t)blockIdx.x * k + rank] = x[id];
        }
    }
    if (tid == 0) {
        double s = 0.0;
        for (int q = 0; q < n_part; q++)
            s += ws_sum[(size_t)blockIdx.x * n_part + q];
        out_sum[blockIdx.x] = s;
    }
}

size_t cuda_sample_top_ws_bytes(int n, int vocab)
{
    const size_t parts = (size_t)BT_MAX(n, 0) * top_splits(BT_MAX(vocab, 1));

    return parts * (CUDA_SAMPLE_TOP_MAX * sizeof(unsigned long long) +
                    sizeof(double) + sizeof(float));
}

bt_status_t cuda_sample_top(const float *d_logits, size_t ld,
                            const int *d_rows, int n, int vocab,
                            const float *d_inv_t, int k, int *d_ids,
                            float *d_vals, double *d_sum, void *d_ws,
                            cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && vocab > 0 && ld >= (size_t)vocab);
    BT_ASSERT(k >= 1 && k <= CUDA_SAMPLE_TOP_MAX);
    if (n == 0)
        return BT_OK;
    BT_ASSERT(d_ws != NULL);
    const int parts = top_splits_for(n, vocab);
    const int slice = (int)BT_DIV_UP(vocab, parts);
    const int kk = BT_MIN(k, vocab);
    const size_t n_parts = (size_t)n * parts;
    /* workspace: candidates (n_parts x kk), sums, maxima */
    unsigned long long *ws_cand = (unsigned long long *)d_ws;
    double *ws_sum = (double *)(ws_cand + n_parts * kk);
    float *ws_max = (float *)(ws_sum + n_parts);
    const dim3 grid((unsigned)n, (unsigned)parts);

    top_part_kernel<<<grid, TOP_THREADS, 0, stream>>>(
        d_logits, ld, d_rows, vocab, kk, slice, d_inv_t, ws_cand, ws_max,
        ws_sum);
    if (parts > 1)
        top_sum_kernel<<<grid, TOP_THREADS, 0, stream>>>(
            d_logits, ld, d_rows, vocab, slice, d_inv_t, ws_max, ws_sum);
    top_merge_kernel<<<n, TOP_THREADS, 0, stream>>>(
        d_logits, ld, d_rows, k, kk, parts, ws_cand, ws_sum, d_ids, d_vals,
        d_sum);
    return BT_CUDA_LAUNCH_STATUS();
}

// ---------------------------------------------------------------------
// whole-distribution sampling (cuda_sample_dist, sample_dist.h)
//
// One thread-block cluster per row: C blocks (1 to 16; sd_cluster_for)
// each own a contiguous slice of the row, and every cross-slice result
// (the max, the normalizer sum, F's count / mass / key range, each radix
// level's histogram, the ordered scans' offsets) is exchanged through
// distributed shared memory in cluster rank order, so every block holds
// the same values and the result does not depend on C's scheduling.
// Passes over the slice: max / NaN; e_i to the scratch row and their
// sum; P_i in place with F's count, mass and key range.  Then each
// selection ("the first position of the (P desc, id asc) order whose
// cumulative count or mass exceeds t") is a radix descent over the P
// keys of F: a 2048-bin histogram (count + fixed-point mass) over the
// current key interval, summed over the cluster, the bin where the
// cumulative crosses t, and again inside that bin until it holds one key
// (3 levels for any row); the rank inside the run of equal P follows
// arithmetically, and the id of the j-th element of a run in id order
// from one ordered scan.  Sorted mode: nucleus by mass (top_p), else by
// count (the limit), then the draw (u * keep): about 12 reads of the row
// from L2.  Id order: one ordered prefix scan of the masses.
// The one-block kernel was issue-bound on one SM (round 13); the
// cluster spreads those passes over 16 SMs.

#include <cooperative_groups.h>

#define SD_THREADS 512
#define SD_WARPS (SD_THREADS / 32)
#define SD_BINS 2048
#define SD_LANE_BINS (SD_BINS / 32)
#define SD_FULL 0xffffffffu
#define SD_CLUSTER_MAX 16
#define SD_XW 4 /* words a cluster exchange */
/* a slice of at least this many elements a block (sd_cluster_for) */
#define SD_SLICE_MIN 4096

typedef struct {
    unsigned cnt[SD_BINS];            /* this block's histogram: count */
    unsigned long long mass[SD_BINS]; /* and fixed-point mass */
    unsigned tcnt[SD_BINS];           /* the cluster's sums (C > 1) */
    unsigned long long tmass[SD_BINS];
    /* the first level's (cluster) histogram over [klo, khi]: the same
     * for every selection of the row, so computed once (sd_select) */
    unsigned h1cnt[SD_BINS];
    unsigned long long h1mass[SD_BINS];
    int h1_ok;
    double d[SD_WARPS];               /* block reductions */
    unsigned long long q[SD_WARPS];
    unsigned u[SD_WARPS];
    float f[SD_WARPS];
    unsigned long long xch[2][SD_XW]; /* published words (two buffers) */
    unsigned long long xv[SD_XW][SD_CLUSTER_MAX]; /* gathered from ranks */
    unsigned long long xall[SD_XW];   /* folded over all ranks */
    unsigned long long xpre[SD_XW];   /* folded over the ranks below */
    unsigned pick_bin;                /* chosen bin; SD_BINS: none */
    unsigned pick_cnt;                /* count above the chosen bin */
    unsigned long long pick_mass;     /* mass above the chosen bin */
    int found;                        /* an id found by a scan */
} sd_smem_t;

/* A block's place in its row's cluster: C blocks, this one rank r,
 * owning the slice [lo, lo + n) of the row (warps: contiguous ranges of
 * `range` elements, a multiple of 32); xp: the exchange buffer next. */
typedef struct {
    int C, r, lo, n, range, xp;
} sd_ctx_t;

/* A position of the (P desc, id asc) order over F. */
typedef struct {
    unsigned key;            /* P's key */
    unsigned j;              /* rank among the elements of that P, id order */
    unsigned cnt_gt;         /* elements of F with a larger P */
    unsigned cnt_eq;         /* elements with this P */
    unsigned long long s_gt; /* mass of F with a larger P */
    int found;
} sd_pos_t;

/* Block q's copy of shared variable p (distributed shared memory). */
template <typename T>
static __device__ __forceinline__ T *sd_remote(T *p, int q)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(p, q);
#else
    (void)q;
    return p;
#endif
}

/* Every thread of every block of the cluster; also a block barrier. */
static __device__ __forceinline__ void sd_cluster_sync(const sd_ctx_t &cx)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cx.C > 1) {
        cooperative_groups::this_cluster().sync();
        return;
    }
#endif
    (void)cx;
    __syncthreads();
}

/* Folds K words over the cluster's blocks in rank order, every thread
 * calling with its block's w (the same in all its threads): all[k] =
 * fold over ranks 0..C-1, pre[k] = fold over the ranks below this block
 * (id when there are none).  fold(k, a, b) combines bit patterns.  The
 * published words alternate between two buffers: a block writes one
 * only after the cluster barrier that follows every read of its previous
 * use. */
template <int K, typename Fold>
static __device__ void sd_fold(sd_smem_t *sh, sd_ctx_t &cx,
                               const unsigned long long (&w)[K],
                               const unsigned long long (&id)[K], Fold fold,
                               unsigned long long (&all)[K],
                               unsigned long long (&pre)[K])
{
    static_assert(K <= SD_XW, "sd_fold: at most SD_XW words");
    if (cx.C == 1) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            all[k] = w[k];
            pre[k] = id[k];
        }
        return;
    }
    unsigned long long *slot = sh->xch[cx.xp];
    cx.xp ^= 1;
    if (threadIdx.x == 0)
#pragma unroll
        for (int k = 0; k < K; k++)
            slot[k] = w[k];
    sd_cluster_sync(cx);
    /* every remote word read at once (one thread each: the reads'
     * latencies overlap), then folded in rank order from shared memory */
    if (threadIdx.x < K * SD_CLUSTER_MAX) {
        const int k = threadIdx.x / SD_CLUSTER_MAX;
        const int q = threadIdx.x % SD_CLUSTER_MAX;
        if (q < cx.C)
            sh->xv[k][q] = sd_remote(slot, q)[k];
    }
    __syncthreads();
    if (threadIdx.x < K) {
        const int k = threadIdx.x;
        unsigned long long a = id[k], b = id[k];
        for (int q = 0; q < cx.C; q++) {
            if (q == cx.r)
                b = a;
            a = fold(k, a, sh->xv[k][q]);
        }
        sh->xall[k] = a;
        sh->xpre[k] = b;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) {
        all[k] = sh->xall[k];
        pre[k] = sh->xpre[k];
    }
}

static __device__ __forceinline__ unsigned long long sd_bits(double v)
{
    return (unsigned long long)__double_as_longlong(v);
}

static __device__ __forceinline__ double sd_dbl(unsigned long long b)
{
    return __longlong_as_double((long long)b);
}

/* Integer sums over the cluster: all[k] and the ranks below (pre[k]). */
template <int K>
static __device__ void sd_fold_add(sd_smem_t *sh, sd_ctx_t &cx,
                                   const unsigned long long (&w)[K],
                                   unsigned long long (&all)[K],
                                   unsigned long long (&pre)[K])
{
    unsigned long long zero[K];
#pragma unroll
    for (int k = 0; k < K; k++)
        zero[k] = 0;
    sd_fold<K>(sh, cx, w, zero,
               [](int, unsigned long long a, unsigned long long b) {
                   return a + b;
               },
               all, pre);
}

/* Adds a warp's elements to the histogram (bin -1: none); a bin shared
 * by many lanes (ties) costs one atomic. */
static __device__ void sd_hist_add(sd_smem_t *sh, int bin,
                                   unsigned long long w)
{
    const int lane = threadIdx.x & 31;
    unsigned peers = __match_any_sync(SD_FULL, bin);

    if (peers == SD_FULL) {
        for (int o = 16; o > 0; o >>= 1)
            w += __shfl_xor_sync(SD_FULL, w, o);
        if (lane == 0 && bin >= 0) {
            atomicAdd(&sh->cnt[bin], 32u);
            if (w)
                atomicAdd(&sh->mass[bin], w);
        }
        return;
    }
    if (bin >= 0) {
        if (lane == __ffs(peers) - 1)
            atomicAdd(&sh->cnt[bin], (unsigned)__popc(peers));
        if (w)
            atomicAdd(&sh->mass[bin], w);
    }
}

/* The cluster's histogram (C > 1) into tcnt / tmass of every block:
 * block r sums bins [r * per, (r + 1) * per) over the blocks, then each
 * block gathers the others' sums.  The two cluster barriers also order
 * the next level's clearing of cnt / mass after every remote read. */
static __device__ void sd_hist_merge(sd_smem_t *sh, const sd_ctx_t &cx)
{
    const int per = SD_BINS / cx.C, b0 = cx.r * per;
    /* tpb adjacent threads a bin (per < SD_THREADS when C > 4), each
     * summing every tpb-th rank: a thread's remote reads are at most
     * ceil(C / tpb) = 4, all in flight; the sums are integers, so the
     * order of the adds does not matter */
    const int tpb = per >= SD_THREADS ? 1 : SD_THREADS / per;
    const int sub = threadIdx.x % tpb;

    sd_cluster_sync(cx); /* every block's histogram is complete */
    for (int i = threadIdx.x / tpb; i < per; i += SD_THREADS / tpb) {
        unsigned c = 0;
        unsigned long long m = 0;
#pragma unroll 4
        for (int q = sub; q < cx.C; q += tpb) {
            c += sd_remote(sh->cnt, q)[b0 + i];
            m += sd_remote(sh->mass, q)[b0 + i];
        }
        /* tpb divides 32 and every lane of the warp is here (one pass
         * of the loop when tpb > 1) */
        for (int o = 1; o < tpb; o <<= 1) {
            c += __shfl_xor_sync(SD_FULL, c, o);
            m += __shfl_xor_sync(SD_FULL, m, o);
        }
        if (sub == 0) {
            sh->tcnt[b0 + i] = c;
            sh->tmass[b0 + i] = m;
        }
    }
    sd_cluster_sync(cx); /* every block's share is summed */
    for (int i = threadIdx.x; i < SD_BINS; i += SD_THREADS) {
        const int q = i / per;
        if (q != cx.r) {
            sh->tcnt[i] = sd_remote(sh->tcnt, q)[i];
            sh->tmass[i] = sd_remote(sh->tmass, q)[i];
        }
    }
    __syncthreads();
}

/* Warp 0: the highest bin of (cnt, mass) at which the cumulative metric
 * (count or mass, from the top bin down) exceeds t; sets pick_*
 * (pick_bin = SD_BINS when the total does not exceed t). */
static __device__ void sd_pick(sd_smem_t *sh, const unsigned *cnt,
                               const unsigned long long *mass, bool by_mass,
                               unsigned long long t)
{
    const int lane = threadIdx.x;
    unsigned long long oc = 0, om = 0, sc, sm, so;

    for (int b = 0; b < SD_LANE_BINS; b++) {
        oc += cnt[lane * SD_LANE_BINS + b];
        om += mass[lane * SD_LANE_BINS + b];
    }
    sc = oc;
    sm = om;
    for (int o = 1; o < 32; o <<= 1) { /* inclusive suffix sums */
        unsigned long long vc = __shfl_down_sync(SD_FULL, sc, o);
        unsigned long long vm = __shfl_down_sync(SD_FULL, sm, o);
        if (lane + o < 32) {
            sc += vc;
            sm += vm;
        }
    }
    so = by_mass ? sm : sc;
    unsigned mask = __ballot_sync(SD_FULL, so > t);
    if (mask == 0) {
        if (lane == 0)
            sh->pick_bin = SD_BINS;
        return;
    }
    if (lane == 31 - __clz(mask)) {
        unsigned long long ac = sc - oc, am = sm - om;
        for (int b = SD_LANE_BINS - 1; b >= 0; b--) {
            int bin = lane * SD_LANE_BINS + b;
            unsigned long long c = cnt[bin], m = mass[bin];
            if ((by_mass ? am + m : ac + c) > t) {
                sh->pick_bin = (unsigned)bin;
                sh->pick_cnt = (unsigned)ac;
                sh->pick_mass = am;
                break;
            }
            ac += c;
            am += m;
        }
    }
}

/* The first position of the (P desc, id asc) order over F (P >= cut_m,
 * keys in [a, b]) whose cumulative count (by_mass false) or mass exceeds
 * t.  found = 0 when the total does not.  p: the block's slice.  Every
 * call of a row passes the same cut_m and [a, b] = [klo, khi], so the
 * first level's histogram is kept (h1) for the calls after the first. */
static __device__ sd_pos_t sd_select(const float *p, const sd_ctx_t &cx,
                                     float cut_m, unsigned a, unsigned b,
                                     bool by_mass, unsigned long long t,
                                     sd_smem_t *sh)
{
    const int tid = threadIdx.x;
    unsigned cgt = 0;
    unsigned long long sgt = 0;
    sd_pos_t r;

    memset(&r, 0, sizeof(r));
    for (int level = 0;; level++) {
        int shift = 0;
        unsigned bin, na;
        const unsigned *cnt = cx.C > 1 ? sh->tcnt : sh->cnt;
        const unsigned long long *mass = cx.C > 1 ? sh->tmass : sh->mass;

        while (((b - a) >> shift) >= SD_BINS)
            shift++;
        if (level == 0 && sh->h1_ok) {
            cnt = sh->h1cnt; /* the row's first level, kept */
            mass = sh->h1mass;
        } else {
            for (int i = tid; i < SD_BINS; i += SD_THREADS) {
                sh->cnt[i] = 0;
                sh->mass[i] = 0;
            }
            __syncthreads();
            row_walk(p, cx.n, -1.0f, [&](int, float q, bool valid) {
                unsigned k = sd_key(q);
                bool in = valid && q >= cut_m && k >= a && k <= b;
                sd_hist_add(sh, in ? (int)((k - a) >> shift) : -1,
                            in ? sd_fx(q) : 0ull);
            });
            __syncthreads();
            if (cx.C > 1)
                sd_hist_merge(sh, cx);
            if (level == 0) { /* read after the barriers below */
                for (int i = tid; i < SD_BINS; i += SD_THREADS) {
                    sh->h1cnt[i] = cnt[i];
                    sh->h1mass[i] = mass[i];
                }
                if (tid == 0)
                    sh->h1_ok = 1;
            }
        }
        if (tid < 32)
            sd_pick(sh, cnt, mass, by_mass, t - (by_mass ? sgt : cgt));
        __syncthreads();
        bin = sh->pick_bin;
        if (bin >= SD_BINS) {
            __syncthreads();
            return r; /* not found (the same in every thread) */
        }
        cgt += sh->pick_cnt;
        sgt += sh->pick_mass;
        na = a + (bin << shift);
        if (shift == 0) {
            r.key = na;
            r.cnt_gt = cgt;
            r.s_gt = sgt;
            r.cnt_eq = cnt[bin];
            r.j = by_mass ? sd_rank_in_run(t, sgt, sd_fx(sd_unkey(na)),
                                           r.cnt_eq)
                          : sd_rank_in_run(t, cgt, 1, r.cnt_eq);
            r.found = 1;
            __syncthreads();
            return r;
        }
        b = na + ((1u << shift) - 1u) < b ? na + ((1u << shift) - 1u) : b;
        a = na;
        __syncthreads();
    }
}

/* The found id of the cluster (-1: none): the blocks' found ids, at most
 * one of them >= 0, folded by max. */
static __device__ int sd_found(sd_smem_t *sh, sd_ctx_t &cx, int found)
{
    const unsigned long long w[1] = {(unsigned long long)(found + 1)};
    const unsigned long long id[1] = {0};
    unsigned long long all[1], pre[1];

    sd_fold<1>(sh, cx, w, id,
               [](int, unsigned long long a, unsigned long long b) {
                   return a > b ? a : b;
               },
               all, pre);
    return (int)all[0] - 1;
}

/* The part of an id-ordered scan before this warp: the sum of a per-warp
 * total (mine, the same in all the warp's lanes) over the warps below in
 * this block and the blocks below in the cluster.  Also clears
 * sh->found for the scan that follows. */
static __device__ unsigned long long sd_before(sd_smem_t *sh, sd_ctx_t &cx,
                                               unsigned long long mine)
{
    const int warp = threadIdx.x >> 5;
    unsigned long long before = 0, total = 0;

    if ((threadIdx.x & 31) == 0)
        sh->q[warp] = mine;
    if (threadIdx.x == 0)
        sh->found = -1;
    __syncthreads();
    for (int w = 0; w < SD_WARPS; w++) {
        if (w < warp)
            before += sh->q[w];
        total += sh->q[w];
    }
    const unsigned long long wt[1] = {total};
    unsigned long long all[1], pre[1];
    sd_fold_add<1>(sh, cx, wt, all, pre);
    return before + pre[0];
}

/* The id of the j-th (1-based, id order) element whose key is v; -1 if
 * there is none. */
static __device__ int sd_lookup(const float *p, sd_ctx_t &cx, unsigned v,
                                unsigned j, sd_smem_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lo = warp * cx.range, hi = min(lo + cx.range, cx.n);
    unsigned c = 0;

    warp_walk(p, lo, lo + cx.range, hi, 0.0f, [&](int, float q, bool in) {
        c += __popc(__ballot_sync(SD_FULL, in && sd_key(q) == v));
        return false;
    });
    unsigned before = (unsigned)sd_before(sh, cx, c);
    if (before < j && j <= before + c) {
        warp_walk(p, lo, lo + cx.range, hi, 0.0f,
                  [&](int i, float q, bool in) {
                      bool m = in && sd_key(q) == v;
                      unsigned bal = __ballot_sync(SD_FULL, m);
                      if (before + __popc(bal) >= j) {
                          if (m && before +
                                           __popc(bal & ((1u << lane) - 1u)) +
                                           1u ==
                                       j)
                              sh->found = cx.lo + i;
                          return true;
                      }
                      before += __popc(bal);
                      return false;
                  });
    }
    __syncthreads();
    return sd_found(sh, cx, sh->found);
}

/* The first id of F (id order) whose cumulative mass exceeds t; -1 if
 * the total does not. */
static __device__ int sd_find_mass(const float *p, sd_ctx_t &cx,
                                   float cut_m, unsigned long long t,
                                   sd_smem_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lo = warp * cx.range, hi = min(lo + cx.range, cx.n);
    unsigned long long tot = 0;

    warp_walk(p, lo, lo + cx.range, hi, 0.0f, [&](int, float q, bool in) {
        tot += in && q >= cut_m ? sd_fx(q) : 0ull;
        return false;
    });
    for (int o = 16; o > 0; o >>= 1)
        tot += __shfl_xor_sync(SD_FULL, tot, o);
    unsigned long long before = sd_before(sh, cx, tot);
    if (before <= t && t < before + tot) {
        warp_walk(p, lo, lo + cx.range, hi, 0.0f,
                  [&](int i, float q, bool in) {
                      unsigned long long w = in && q >= cut_m ? sd_fx(q)
                                                              : 0ull;
                      unsigned long long inc = w;
                      for (int o = 1; o < 32; o <<= 1) {
                          unsigned long long v =
                              __shfl_up_sync(SD_FULL, inc, o);
                          if (lane >= o)
                              inc += v;
                      }
                      unsigned bal = __ballot_sync(SD_FULL, before + inc > t);
                      if (bal) {
                          if (lane == __ffs(bal) - 1)
                              sh->found = cx.lo + i;
                          return true;
                      }
                      before += __shfl_sync(SD_FULL, inc, 31);
                      return false;
                  });
    }
    __syncthreads();
    return sd_found(sh, cx, sh->found);
}

/* Each warp's id range for a row of vocab over C blocks (a multiple of
 * 32; a block's slice is SD_WARPS of them). */
static __device__ int sd_warp_range(int vocab, int C)
{
    const int per = SD_THREADS * C;
    return ((vocab + per - 1) / per) * 32;
}

static __global__ void __launch_bounds__(SD_THREADS, 2)
    sd_kernel(const float *logits, size_t ld, int vocab,
              const cuda_dist_spec_t *specs, float *scratch,
              cuda_dist_out_t *outs, int C)
{
    extern __shared__ __align__(16) unsigned char sd_raw[];
    sd_smem_t *sh = reinterpret_cast<sd_smem_t *>(sd_raw);
    sd_ctx_t cx;
    cx.C = C;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cx.r = C > 1 ? (int)cooperative_groups::this_cluster().block_rank() : 0;
#else
    cx.r = 0;
#endif
    cx.range = sd_warp_range(vocab, C);
    cx.lo = cx.r * cx.range * SD_WARPS;
    cx.n = max(0, min(vocab - cx.lo, cx.range * SD_WARPS));
    cx.xp = 0;
    const int row = blockIdx.x / C;
    const cuda_dist_spec_t sp = specs[row];
    const float *x = logits + (size_t)sp.row * ld + cx.lo;
    float *p = scratch + (size_t)row * vocab + cx.lo;
    const int tid = threadIdx.x;
    cuda_dist_out_t out;
    float mx = -INFINITY, cut_m;
    unsigned bad = 0, n_f = 0, khi = 0, klo = 0xFFFFFFFFu;
    unsigned long long m_f = 0, keep, t;
    double sum = 0.0;
    int mode;
    sd_pos_t nuc, pd;

    if (tid == 0)
        sh->h1_ok = 0; /* published by the barriers of the first pass */
    out.token = CUDA_DIST_NONFINITE;
    out.n = 0;
    out.keep = 0;
    out.sum = 0.0;
    row_walk(x, cx.n, -INFINITY, [&](int, float v, bool in) {
        if (in && isnan(v))
            bad = 1;
        else if (in)
            mx = fmaxf(mx, v);
    });
    mx = block_reduce(mx, op_max(), sh->f);
    bad = block_reduce(bad, op_max(), sh->u);
    {
        const unsigned long long w[2] = {__float_as_uint(mx), bad};
        const unsigned long long id[2] = {__float_as_uint(-INFINITY), 0};
        unsigned long long all[2], pre[2];
        sd_fold<2>(sh, cx, w, id,
                   [](int k, unsigned long long a, unsigned long long b) {
                       if (k == 1)
                           return a > b ? a : b;
                       return (unsigned long long)__float_as_uint(
                           fmaxf(__uint_as_float((unsigned)a),
                                 __uint_as_float((unsigned)b)));
                   },
                   all, pre);
        mx = __uint_as_float((unsigned)all[0]);
        bad = (unsigned)all[1];
    }
    if (bad || isinf(mx))
        goto done;
    row_walk(x, cx.n, 0.0f, [&](int j, float v, bool in) {
        if (in) {
            float e = expf((v - mx) * sp.inv_t);
            p[j] = e;
            sum += (double)e;
        }
    });
    sum = block_reduce(sum, op_add(), sh->d);
    {
        const unsigned long long w[1] = {sd_bits(sum)};
        const unsigned long long id[1] = {sd_bits(0.0)};
        unsigned long long all[1], pre[1];
        sd_fold<1>(sh, cx, w, id,
                   [](int, unsigned long long a, unsigned long long b) {
                       return sd_bits(sd_dbl(a) + sd_dbl(b));
                   },
                   all, pre);
        sum = sd_dbl(all[0]);
    }
    out.sum = sum;
    cut_m = sd_cut_m(sp.min_p, sum);
    row_walk(p, cx.n, 0.0f, [&](int j, float e, bool in) {
        if (!in)
            return;
        float q = (float)((double)e / sum); /* this thread's e_j */
        p[j] = q;
        if (q >= cut_m) {
            unsigned k = sd_key(q);
            n_f++;
            m_f += sd_fx(q);
            khi = max(khi, k);
            klo = min(klo, k);
        }
    });
    n_f = block_reduce(n_f, op_add(), sh->u);
    m_f = block_reduce(m_f, op_add(), sh->q);
    khi = block_reduce(khi, op_max(), sh->u);
    klo = block_reduce(klo, op_min(), sh->u);
    {
        const unsigned long long w[4] = {n_f, m_f, khi, klo};
        const unsigned long long id[4] = {0, 0, 0, 0xFFFFFFFFu};
        unsigned long long all[4], pre[4];
        sd_fold<4>(sh, cx, w, id,
                   [](int k, unsigned long long a, unsigned long long b) {
                       if (k < 2)
                           return a + b;
                       if (k == 2)
                           return a > b ? a : b;
                       return a < b ? a : b;
                   },
                   all, pre);
        n_f = (unsigned)all[0];
        m_f = all[1];
        khi = (unsigned)all[2];
        klo = (unsigned)all[3];
    }
    mode = sd_mode(&sp, (int)n_f);
    if (mode == SD_MODE_ORDER) {
        out.token = CUDA_DIST_ORDER;
        goto done;
    }
    if (mode == SD_MODE_ID) {
        out.n = (int)n_f;
        out.keep = m_f;
        out.token = sd_find_mass(p, cx, cut_m, sd_target(m_f, sp.u), sh);
        goto done;
    }
    if (mode == SD_MODE_TOP1) {
        nuc = sd_select(p, cx, cut_m, klo, khi, false, 0, sh);
    } else {
        int nk = sp.top_k > 0 && sp.top_k < (int)n_f ? sp.top_k : (int)n_f;
        float cut_p = sd_cut_p(sp.top_p, nk);
        unsigned g = 0;
        unsigned long long fx_top = sd_fx(sp.top_p);
        int limit;

        row_walk(p, cx.n, -1.0f, [&](int, float q, bool in) {
            g += in && q >= cut_m && q >= cut_p;
        });
        g = block_reduce(g, op_add(), sh->u);
        {
            const unsigned long long w[1] = {g};
            unsigned long long all[1], pre[1];
            sd_fold_add<1>(sh, cx, w, all, pre);
            g = (unsigned)all[0];
        }
        limit = sd_limit(&sp, (int)n_f, (int)g);
        nuc = fx_top == 0
                  ? sd_select(p, cx, cut_m, klo, khi, false, 0, sh)
                  : sd_select(p, cx, cut_m, klo, khi, true, fx_top - 1, sh);
        if (!nuc.found || nuc.cnt_gt + nuc.j > (unsigned)limit)
            nuc = sd_select(p, cx, cut_m, klo, khi, false,
                            (unsigned long long)limit - 1, sh);
    }
    keep = nuc.s_gt + (unsigned long long)nuc.j * sd_fx(sd_unkey(nuc.key));
    out.n = (int)(nuc.cnt_gt + nuc.j);
    out.keep = keep;
    t = sd_target(keep, sp.u);
    pd = sd_select(p, cx, cut_m, klo, khi, true, t, sh);
    if (!pd.found || pd.cnt_gt + pd.j > (unsigned)out.n)
        pd = nuc; /* rounding: the last candidate, as the host */
    out.token = sd_lookup(p, cx, pd.key, pd.j, sh);
done:
    if (tid == 0 && cx.r == 0)
        outs[row] = out;
    /* no block leaves while another may still read its shared memory */
    sd_cluster_sync(cx);
}

/* Blocks a row for n rows: 16 (a non-portable cluster, when the device
 * can run one), else 8; fewer when the row is short (SD_SLICE_MIN
 * elements a block at least) or when n rows would need more than two
 * blocks an SM (64 rows at 16 blocks a row queued behind each other:
 * round 19); 1 without clusters
 * (before sm_90).  BT_SAMPLE_DIST_CLUSTER=N sets it whatever the row
 * count (at most the device's, a power of two; 1: one block a row). */
static int sd_cluster_for(int vocab, int n)
{
    static int max_c[64], n_sm[64];
    int dev = 0, cc = 0, c;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 1;
    if (max_c[dev] == 0) {
        int m = 1;
        if (cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor,
                                   dev) == cudaSuccess &&
            cc >= 9) {
            m = 8;
            if (cudaFuncSetAttribute(
                    sd_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                    1) == cudaSuccess) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr[1];
                int n_cl = 0;
                cfg.gridDim = dim3(16);
                cfg.blockDim = dim3(SD_THREADS);
                cfg.dynamicSmemBytes = sizeof(sd_smem_t);
                attr[0].id = cudaLaunchAttributeClusterDimension;
                attr[0].val.clusterDim.x = 16;
                attr[0].val.clusterDim.y = 1;
                attr[0].val.clusterDim.z = 1;
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                if (cudaOccupancyMaxActiveClusters(&n_cl, sd_kernel, &cfg) ==
                        cudaSuccess &&
                    n_cl >= 1)
                    m = 16;
            }
            (void)cudaGetLastError();
        }
        max_c[dev] = m;
        if (cudaDeviceGetAttribute(&n_sm[dev], cudaDevAttrMultiProcessorCount,
                                   dev) != cudaSuccess)
            n_sm[dev] = 1;
    }
    c = max_c[dev];
    const char *env = cuda_switches()->sample_dist_cluster;
    const int force = env && *env ? atoi(env) : 0;
    while (c > 1 && force > 0 && c > force)
        c >>= 1;
    while (c > 1 && vocab / c < SD_SLICE_MIN)
        c >>= 1;
    while (c > 1 && force <= 0 && (long long)n * c > 2LL * n_sm[dev])
        c >>= 1;
    return c;
}

bt_status_t cuda_sample_dist(const float *d_logits, size_t ld, int vocab,
                             const cuda_dist_spec_t *d_spec, int n,
                             float *d_p, cuda_dist_out_t *d_out,
                             cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && vocab > 0 && ld >= (size_t)vocab);
    if (n == 0)
        return BT_OK;
    /* the dynamic shared-memory opt-in is per device */
    static bool attr_set[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return BT_CUDA_LAUNCH_STATUS();
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        cudaError_t err = cudaFuncSetAttribute(
            sd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
            (int)sizeof(sd_smem_t));
        if (err != cudaSuccess)
            return BT_CUDA_STATUS(err);
        if (dev >= 0 && dev < 64)
            attr_set[dev] = true;
    }
    const int C = sd_cluster_for(vocab, n);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3((unsigned)n * (unsigned)C);
    cfg.blockDim = dim3(SD_THREADS);
    cfg.dynamicSmemBytes = sizeof(sd_smem_t);
    cfg.stream = stream;
    if (C > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)C;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t err = cudaLaunchKernelEx(&cfg, sd_kernel, d_logits, ld, vocab,
                                         d_spec, d_p, d_out, C);
    if (err != cudaSuccess)
        return BT_CUDA_STATUS(err);
    return BT_CUDA_LAUNCH_STATUS();
}
