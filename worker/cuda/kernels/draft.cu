/*
 * draft.cu - kernels of the device draft head (see draft.h).
 *
 * cuda_topk_logprob: each row is cut into up to 32 slices, one block of
 * 256 threads per (slice, row) reading the slice once into registers:
 * the slice's max, sum of exp and k best (every thread keeps its best
 * k, rounded up to a power of two, in registers; the lists go to shared
 * memory and k rounds of a block arg-max emit the slice's winners in
 * order).  Then one warp per
 * row merges the slices: logsumexp, and k rounds of a warp arg-max over
 * the slices' sorted lists.
 *
 * cuda_tree_*: the device draft loop's tree steps (spec_tree_impl.h run
 * by thread 0 of one block per sequence: a few hundred nodes at most, so
 * a serial insertion sort costs microseconds and keeps the host's order
 * exactly), and the level rows (one thread per frontier node).
 * Tests: build-cuda/gpu/test_topk (top-k against topk_ref) and, through
 * the whole head, build-cuda/gpu/test_spec_cuda.
 */
#include "draft.h"

#include <math.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "../../spec/spec_tree.h"

/* The tree steps of the host path, compiled for the device (one text:
 * the device draft loop builds the host path's tree bit for bit). */
#define SPEC_TREE_FN static __device__ inline
#include "../../spec/spec_tree_impl.h"

#define TOPK_THREADS 256

template <typename T>
static __global__ void draft_rows_kernel(const T *a, const T *b,
                                         const int *src_idx,
                                         const int *dst_idx, int dim, T *dst)
{
    int i = blockIdx.x;
    int s = src_idx ? src_idx[i] : i;
    int r = dst_idx ? dst_idx[i] : i;
    const T *src;

    if (r < 0)
        return;
    src = s >= 0 ? a + (size_t)s * dim : b + (size_t)(-s - 1) * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        dst[(size_t)r * dim + j] = src[j];
}

bt_status_t cuda_draft_rows(const void *d_src_a, const void *d_src_b,
                            const int *d_src_idx, const int *d_dst_idx,
                            int n, int dim, void *d_dst, cuda_dtype_t dt,
                            cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && dim > 0);
    if (n == 0)
        return BT_OK;
    KERN_DISPATCH_DT(dt, T,
                     draft_rows_kernel<T><<<n, 256, 0, stream>>>(
                         (const T *)d_src_a, (const T *)d_src_b, d_src_idx,
                         d_dst_idx, dim, (T *)d_dst));
    return BT_CUDA_LAUNCH_STATUS();
}

static __global__ void draft_bias_kernel(float *h, const float *bias, int dim)
{
    float *row = h + (size_t)blockIdx.x * dim;

    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        row[j] = bias[j];
}

bt_status_t cuda_draft_bias(float *d_h, const float *d_bias, int n, int dim,
                            cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && dim > 0);
    if (n == 0)
        return BT_OK;
    draft_bias_kernel<<<n, 256, 0, stream>>>(d_h, d_bias, dim);
    return BT_CUDA_LAUNCH_STATUS();
}

/* (v, i) before (ov, oi): larger value, then lower id. */
static __device__ __forceinline__ bool topk_better(float v, int i, float ov,
                                                   int oi)
{
    return v > ov || (v == ov && i < oi);
}

/* The warp's best (value, id) by topk_better, and the lane-held tag t
 * that came with it (its thread or lane), in every lane. */
static __device__ __forceinline__ void topk_warp_best(float *v, int *i,
                                                      int *t)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        int ot = __shfl_xor_sync(0xffffffffu, *t, o);
        if (topk_better(ov, oi, *v, *i)) {
            *v = ov;
            *i = oi;
            *t = ot;
        }
    }
}

/* Elements a thread of the split kernel holds: slices of up to
 * TOPK_THREADS * TOPK_PER_MAX elements, at most TOPK_SPLITS_MAX of them
 * (cuda_topk_logprob picks the slice), so rows up to 512K ids. */
#define TOPK_PER_MAX 64
#define TOPK_SPLITS_MAX 32
#define TOPK_SLICE_MIN 4096

/* One row's slice per block: its max, its sum of exp relative to that
 * max (NaN left out) and its k best (value, id), into part (row, split)
 * records of 2 + 2k floats: max, sum, then k values and k ids (as int
 * bits).  Every thread loads all its PER elements first (independent
 * loads in flight: the old one-block-per-row loop was latency-bound)
 * and keeps the KL >= k best of them in registers (KL a
 * compile-time power of two, so the insertion unrolls into predicated
 * swaps instead of a local-memory array); each thread visits its
 * elements in increasing id order, and the swaps compare (value, id), so
 * ties keep the lower id. */
template <int PER, int KL>
static __global__ void topk_split_kernel(const float *logits, int vocab,
                                         int k, int slice, float *part)
{
    __shared__ float sh_red[32];
    __shared__ float sh_v[TOPK_THREADS * KL];
    __shared__ int sh_i[TOPK_THREADS * KL];
    __shared__ float sh_wv[32];
    __shared__ int sh_wi[32];
    __shared__ int sh_wt[32];
    const int row_i = blockIdx.y, split = blockIdx.x;
    const int n_splits = gridDim.x;
    const float *row = logits + (size_t)row_i * vocab;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int n_warps = blockDim.x >> 5;
    const int j0 = split * slice, j1 = min(vocab, j0 + slice);
    float *rec = part + ((size_t)row_i * n_splits + split) * (2 + 2 * k);
    float v[PER], lv[KL], mx = -INFINITY, sum = 0.0f;
    int li[KL], head = 0;

#pragma unroll
    for (int e = 0; e < PER; e++) {
        int j = j0 + t + e * TOPK_THREADS;
        v[e] = j < j1 ? row[j] : NAN;
    }
#pragma unroll
    for (int e = 0; e < PER; e++)
        if (v[e] == v[e])
            mx = fmaxf(mx, v[e]);
    mx = kern_warp_max(mx);
    if (lane == 0)
        sh_red[warp] = mx;
    __syncthreads();
    mx = kern_warp_max(lane < n_warps ? sh_red[lane] : -INFINITY);
    if (mx > -INFINITY) {
#pragma unroll
        for (int e = 0; e < PER; e++)
            if (v[e] == v[e])
                sum += __expf(v[e] - mx);
    }
    sum = kern_block_sum(sum, sh_red);

#pragma unroll
    for (int c = 0; c < KL; c++) {
        lv[c] = -INFINITY;
        li[c] = vocab; /* empty: any element is better */
    }
#pragma unroll
    for (int e = 0; e < PER; e++) {
        float cv = v[e];
        int ci = j0 + t + e * TOPK_THREADS;

        if (cv != cv || !topk_better(cv, ci, lv[KL - 1], li[KL - 1]))
            continue; /* NaN / past the slice, or not among the KL best */
#pragma unroll
        for (int c = 0; c < KL; c++)
            if (topk_better(cv, ci, lv[c], li[c])) {
                float tv = lv[c];
                int ti = li[c];

                lv[c] = cv;
                li[c] = ci;
                cv = tv;
                ci = ti;
            }
    }
#pragma unroll
    for (int c = 0; c < KL; c++) {
        sh_v[t * KL + c] = lv[c];
        sh_i[t * KL + c] = li[c];
    }
    if (t == 0) {
        rec[0] = mx;
        rec[1] = sum;
    }
    __syncthreads();

    /* k rounds of a block arg-max over the list heads */
    for (int r = 0; r < k; r++) {
        float bv = head < KL ? sh_v[t * KL + head] : -INFINITY;
        int bi = head < KL ? sh_i[t * KL + head] : vocab;
        int bt = t;

        topk_warp_best(&bv, &bi, &bt);
        if (lane == 0) {
            sh_wv[warp] = bv;
            sh_wi[warp] = bi;
            sh_wt[warp] = bt;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < n_warps ? sh_wv[lane] : -INFINITY;
            bi = lane < n_warps ? sh_wi[lane] : vocab;
            bt = lane < n_warps ? sh_wt[lane] : -1;
            topk_warp_best(&bv, &bi, &bt);
            if (lane == 0) {
                rec[2 + r] = bv;
                rec[2 + k + r] = __int_as_float(bi);
                sh_wt[0] = bt;
            }
        }
        __syncthreads();
        if (t == sh_wt[0])
            head++;
        __syncthreads();
    }
}

/* One warp per row: logsumexp from the slices' (max, sum), then k rounds
 * of a warp arg-max over the slices' sorted candidate lists (lane s
 * holds slice s's). */
static __global__ void topk_merge_kernel(const float *part, int n_splits,
                                         int vocab, int k, int *ids,
                                         float *logp)
{
    const int row_i = blockIdx.x, lane = threadIdx.x;
    const float *rec = part + ((size_t)row_i * n_splits + lane) * (2 + 2 * k);
    float m = lane < n_splits ? rec[0] : -INFINITY;
    float mx = kern_warp_max(m), sum, lse;
    int head = 0;

    sum = lane < n_splits && m > -INFINITY ? rec[1] * __expf(m - mx) : 0.0f;
    sum = kern_warp_sum(sum);
    lse = mx + logf(sum);
    for (int r = 0; r < k; r++) {
        bool has = lane < n_splits && head < k;
        float bv = has ? rec[2 + head] : -INFINITY;
        int bi = has ? __float_as_int(rec[2 + k + head]) : vocab;
        int bl = lane;

        topk_warp_best(&bv, &bi, &bl);
        if (lane == 0) {
            ids[(size_t)row_i * k + r] = bi < vocab ? bi : 0;
            logp[(size_t)row_i * k + r] = bi < vocab ? bv - lse : -INFINITY;
        }
        if (lane == bl)
            head++;
    }
}

/* The slice a row is cut into: at least TOPK_SLICE_MIN ids, at most
 * TOPK_SPLITS_MAX slices, a multiple of TOPK_THREADS. */
static int topk_slice(int vocab)
{
    int slice = BT_MAX(TOPK_SLICE_MIN,
                       (int)BT_DIV_UP(vocab, TOPK_SPLITS_MAX));

    return (int)BT_DIV_UP(slice, TOPK_THREADS) * TOPK_THREADS;
}

size_t cuda_topk_logprob_ws_floats(int n, int vocab, int k)
{
    int splits = (int)BT_DIV_UP(vocab, topk_slice(vocab));

    return (size_t)n * splits * (2 + 2 * (size_t)k);
}

bt_status_t cuda_topk_logprob(const float *d_logits, int n, int vocab, int k,
                              int *d_ids, float *d_logp, float *d_ws,
                              cudaStream_t stream)
{
    int slice = topk_slice(vocab), per = slice / TOPK_THREADS;
    int splits = (int)BT_DIV_UP(vocab, slice);
    dim3 grid(splits, n);

    BT_ASSERT(n >= 0 && vocab > 0 && k >= 1 && k <= CUDA_TOPK_MAX);
    if (n == 0)
        return BT_OK;
    if (per > TOPK_PER_MAX || n > 65535)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "top-k of %d rows of %d ids (at most %d ids)", n,
                        vocab, TOPK_SPLITS_MAX * TOPK_THREADS * TOPK_PER_MAX);
    /* the list length: k rounded up to a power of two */
#define TOPK_LAUNCH(P)                                                      \
    do {                                                                    \
        if (k == 1)                                                         \
            topk_split_kernel<P, 1><<<grid, TOPK_THREADS, 0, stream>>>(     \
                d_logits, vocab, k, slice, d_ws);                           \
        else if (k <= 2)                                                    \
            topk_split_kernel<P, 2><<<grid, TOPK_THREADS, 0, stream>>>(     \
                d_logits, vocab, k, slice, d_ws);                           \
        else if (k <= 4)                                                    \
            topk_split_kernel<P, 4><<<grid, TOPK_THREADS, 0, stream>>>(     \
                d_logits, vocab, k, slice, d_ws);                           \
        else if (k <= 8)                                                    \
            topk_split_kernel<P, 8><<<grid, TOPK_THREADS, 0, stream>>>(     \
                d_logits, vocab, k, slice, d_ws);                           \
        else                                                                \
            topk_split_kernel<P, 16><<<grid, TOPK_THREADS, 0, stream>>>(    \
                d_logits, vocab, k, slice, d_ws);                           \
    } while (0)
    if (per <= 16)
        TOPK_LAUNCH(16);
    else if (per <= 32)
        TOPK_LAUNCH(32);
    else
        TOPK_LAUNCH(64);
#undef TOPK_LAUNCH
    topk_merge_kernel<<<n, 32, 0, stream>>>(d_ws, splits, vocab, k, d_ids,
                                            d_logp);
    return BT_CUDA_LAUNCH_STATUS();
}

// ---------------------------------------------------------------------
// the device draft loop's tree steps

static __global__ void tree_level1_kernel(int k, const int *ids,
                                          const float *logp,
                                          spec_node_t *nodes_all,
                                          int node_cap, cuda_tree_seq_t *seqs)
{
    int i = blockIdx.x;
    cuda_tree_seq_t *s = &seqs[i];
    int n_nodes = 0;

    if (threadIdx.x != 0)
        return;
    s->n_front = spec_tree_level1(nodes_all + (size_t)i * node_cap,
                                  &n_nodes, ids + (size_t)i * k,
                                  logp + (size_t)i * k, k, s->front);
    s->n_nodes = n_nodes;
    s->n_exp = 0;
    s->n_sel = 0;
}

bt_status_t cuda_tree_level1(int n, int k, const int *d_ids,
                             const float *d_logp, void *d_nodes,
                             int node_cap, cuda_tree_seq_t *d_seqs,
                             cudaStream_t stream)
{
    BT_ASSERT(n > 0 && k > 0 && k <= CUDA_TOPK_MAX);
    tree_level1_kernel<<<n, 32, 0, stream>>>(k, d_ids, d_logp,
                                             (spec_node_t *)d_nodes,
                                             node_cap, d_seqs);
    return BT_CUDA_LAUNCH_STATUS();
}

/* Row i * k + r: frontier node r of sequence i (spec_level_rows). */
static __global__ void tree_rows_kernel(int n, int k, int d,
                                        const spec_node_t *nodes_all,
                                        int node_cap,
                                        const cuda_tree_seq_t *seqs,
                                        int state_slots, int nb_per,
                                        int store_rows, int *meta,
                                        uint8_t *mask)
{
    int i = blockIdx.x, r = threadIdx.x;
    const cuda_tree_seq_t *s = &seqs[i];
    const spec_node_t *nodes = nodes_all + (size_t)i * node_cap;
    int nr = n * k, j = i * k + r, width = d * k, n_exp = s->n_exp;
    int *tok = meta, *pos = tok + nr, *slot = pos + nr, *kvl = slot + nr;
    int *bto = kvl + nr, *ctx = bto + nr, *mo = ctx + nr, *fsrc = mo + nr;
    int *odst = fsrc + nr;
    const spec_node_t *nd;
    uint8_t *m;

    if (r >= k)
        return;
    nd = &nodes[s->front[r]];
    m = mask + (size_t)j * width;
    tok[j] = nd->token;
    pos[j] = s->cached + d - 1;
    slot[j] = s->state * state_slots + s->draft_len + n_exp + r;
    kvl[j] = s->draft_len + width;
    bto[j] = s->state * nb_per;
    ctx[j] = s->draft_len;
    mo[j] = j * width;
    fsrc[j] = s->state * store_rows +
              (nd->parent < 0 ? 0 : 1 + nodes[nd->parent].feat);
    odst[j] = s->state * store_rows + 1 + n_exp + r;
    for (int c = 0; c < width; c++)
        m[c] = 0;
    for (int a = nd->parent; a >= 0; a = nodes[a].parent)
        m[nodes[a].feat] = 1;
    m[n_exp + r] = 1;
}

bt_status_t cuda_tree_rows(int n, int k, int d, const void *d_nodes,
                           int node_cap, const cuda_tree_seq_t *d_seqs,
                           int state_slots, int nb_per, int store_rows,
                           int *d_meta, uint8_t *d_mask,
                           cudaStream_t stream)
{
    BT_ASSERT(n > 0 && k > 0 && k <= CUDA_TOPK_MAX && d >= 1);
    tree_rows_kernel<<<n, 32, 0, stream>>>(
        n, k, d, (const spec_node_t *)d_nodes, node_cap, d_seqs,
        state_slots, nb_per, store_rows, d_meta, d_mask);
    return BT_CUDA_LAUNCH_STATUS();
}

static __global__ void tree_expand_kernel(int k, int d, const int *ids,
                                          const float *logp,
                                          spec_node_t *nodes_all,
                                          int node_cap, cuda_tree_seq_t *seqs)
{
    int i = blockIdx.x;
    cuda_tree_seq_t *s = &seqs[i];
    int cand[CUDA_TOPK_MAX * CUDA_TOPK_MAX];
    int n_front = s->n_front, n_nodes = s->n_nodes;

    if (threadIdx.x != 0)
        return;
    s->n_front = spec_tree_expand(nodes_all + (size_t)i * node_cap, &n_nodes,
                                  s->front, n_front, s->n_exp,
                                  ids + (size_t)i * k * k,
                                  logp + (size_t)i * k * k, NULL, k, d, k,
                                  cand);
    s->n_nodes = n_nodes;
    s->n_exp += n_front;
}

bt_status_t cuda_tree_expand(int n, int k, int d, const int *d_ids,
                             const float *d_logp, void *d_nodes,
                             int node_cap, cuda_tree_seq_t *d_seqs,
                             cudaStream_t stream)
{
    BT_ASSERT(n > 0 && k > 0 && k <= CUDA_TOPK_MAX && d >= 1);
    tree_expand_kernel<<<n, 32, 0, stream>>>(k, d, d_ids, d_logp,
                                             (spec_node_t *)d_nodes,
                                             node_cap, d_seqs);
    return BT_CUDA_LAUNCH_STATUS();
}

static __global__ void tree_select_kernel(spec_node_t *nodes_all,
                                          int node_cap, cuda_tree_seq_t *seqs,
                                          int *order)
{
    int i = blockIdx.x;
    cuda_tree_seq_t *s = &seqs[i];

    if (threadIdx.x != 0)
        return;
    s->n_sel = spec_tree_select(nodes_all + (size_t)i * node_cap,
                                s->n_nodes, s->tokens,
                                order + (size_t)i * node_cap);
}

bt_status_t cuda_tree_select(int n, void *d_nodes, int node_cap,
                             cuda_tree_seq_t *d_seqs, int *d_order,
                             cudaStream_t stream)
{
    BT_ASSERT(n > 0);
    tree_select_kernel<<<n, 32, 0, stream>>>((spec_node_t *)d_nodes,
                                             node_cap, d_seqs, d_order);
    return BT_CUDA_LAUNCH_STATUS();
}
