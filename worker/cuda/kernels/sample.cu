/*
 * sample.cu - token selection on the device.
 *
 * argmax: one block per logits row, each thread keeps (best value, lowest
 * index), then a warp and block merge.  NaN never wins.
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
 */
#include "sample.h"

#include <math.h>

#include "bt_util.h"
#include "kern_common.cuh"

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

    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        argmax_merge(&best, &bi, row[j], j);
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

static __global__ void __launch_bounds__(TOP_THREADS)
    top_kernel(const float *logits, size_t ld, const int *rows, int vocab,
               const float *inv_t, int k, int *out_ids, float *out_vals,
               double *out_sum)
{
    __shared__ unsigned hist[256];
    __shared__ float wmax[32];
    __shared__ double wsum[32];
    __shared__ unsigned s_digit, s_rem, s_ngt, s_neq_base;
    __shared__ unsigned wcnt[32];
    __shared__ unsigned long long cand[CUDA_SAMPLE_TOP_MAX];
    const int row_i = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const float *x = logits + (size_t)row_i * ld;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nw = blockDim.x >> 5;
    const int kk = min(k, vocab);
    unsigned prefix = 0;
    float mx = -INFINITY;

    /* pass 0: max and the top byte's histogram (every element) */
    for (int b = tid; b < 256; b += blockDim.x)
        hist[b] = 0;
    if (tid == 0)
        s_rem = (unsigned)kk;
    __syncthreads();
    for (int j = tid; j < vocab; j += blockDim.x) {
        float v = x[j];
        mx = fmaxf(mx, v);
        atomicAdd(&hist[top_key(v) >> 24], 1u);
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0)
        wmax[warp] = mx;
    __syncthreads();
    mx = wmax[0];
    for (int w = 1; w < nw; w++)
        mx = fmaxf(mx, wmax[w]);
    if (warp == 0)
        top_pick_bin(hist, &s_digit, &s_rem);
    __syncthreads();
    prefix = s_digit << 24;

    /* passes 1..3: the lower bytes among elements matching the prefix;
     * pass 1 also sums the exponentials */
    double sum = 0.0;
    const float it = inv_t[blockIdx.x];
    for (int pass = 1; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        const unsigned hi_mask = 0xFFFFFFFFu << (shift + 8);
        __syncthreads();
        for (int b = tid; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int j = tid; j < vocab; j += blockDim.x) {
            float v = x[j];
            uint32_t key = top_key(v);
            if (pass == 1 && !isnan(v))
                sum += (double)expf((v - mx) * it);
            if ((key & hi_mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (warp == 0)
            top_pick_bin(hist, &s_digit, &s_rem);
        __syncthreads();
        prefix |= s_digit << shift;
    }
    /* the sum */
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0)
        wsum[warp] = sum;

    /* gather: keys > T anywhere, then the first `need` keys == T */
    const uint32_t T = prefix;
    const unsigned need = s_rem;
    if (tid == 0) {
        s_ngt = 0;
        s_neq_base = 0;
    }
    for (int j = tid; j < CUDA_SAMPLE_TOP_MAX; j += blockDim.x)
        cand[j] = 0ull;
    __syncthreads();
    for (int j0 = 0; j0 < vocab; j0 += blockDim.x) {
        int j = j0 + tid;
        uint32_t key = j < vocab ? top_key(x[j]) : 0u;
        bool gt = j < vocab && key > T, eq = j < vocab && key == T;
        unsigned bal = __ballot_sync(0xffffffffu, eq);
        unsigned before = __popc(bal & ((1u << lane) - 1u));
        if (lane == 0)
            wcnt[warp] = __popc(bal);
        if (gt) {
            unsigned at = atomicAdd(&s_ngt, 1u);
            cand[at] = ((unsigned long long)key << 32) |
                       (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
        }
        __syncthreads();
        if (eq) {
            unsigned rank = s_neq_base + before;
            for (int w = 0; w < warp; w++)
                rank += wcnt[w];
            if (rank < need)
                cand[(unsigned)kk - need + rank] =
                    ((unsigned long long)key << 32) |
                    (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned tot = 0;
            for (int w = 0; w < nw; w++)
                tot += wcnt[w];
            s_neq_base += tot;
        }
        __syncthreads();
        bool done = s_neq_base >= need && s_ngt >= (unsigned)kk - need;
        __syncthreads();
        if (done)
            break; /* everything taken (the same answer in every thread) */
    }
    __syncthreads();

    /* bitonic sort, descending, over CUDA_SAMPLE_TOP_MAX slots (empty
     * slots are 0 and sink to the end) */
    for (int size = 2; size <= CUDA_SAMPLE_TOP_MAX; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (tid < CUDA_SAMPLE_TOP_MAX) {
                int p = tid ^ stride;
                if (p > tid) {
                    unsigned long long a = cand[tid], b = cand[p];
                    bool desc = (tid & size) == 0;
                    if (desc ? a < b : a > b) {
                        cand[tid] = b;
                        cand[p] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    if (tid < kk) {
        int id = (int)(0xFFFFFFFFu - (unsigned)(cand[tid] & 0xFFFFFFFFull));
        out_ids[(size_t)blockIdx.x * k + tid] = id;
        out_vals[(size_t)blockIdx.x * k + tid] = x[id];
    }
    if (tid == 0) {
        double s = 0.0;
        for (int w = 0; w < nw; w++)
            s += wsum[w];
        out_sum[blockIdx.x] = s;
    }
}

bt_status_t cuda_sample_top(const float *d_logits, size_t ld,
                            const int *d_rows, int n, int vocab,
                            const float *d_inv_t, int k, int *d_ids,
                            float *d_vals, double *d_sum,
                            cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && vocab > 0 && ld >= (size_t)vocab);
    BT_ASSERT(k >= 1 && k <= CUDA_SAMPLE_TOP_MAX);
    if (n == 0)
        return BT_OK;
    top_kernel<<<n, TOP_THREADS, 0, stream>>>(d_logits, ld, d_rows, vocab,
                                              d_inv_t, k, d_ids, d_vals,
                                              d_sum);
    return BT_CUDA_LAUNCH_STATUS();
}
