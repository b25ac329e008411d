/*
 * draft.cu - kernels of the device draft head (see draft.h).
 *
 * cuda_topk_logprob: one block of 256 threads per row.  Pass 1: the row's
 * max and sum of exp (block reductions) give logsumexp.  Pass 2: every
 * thread keeps a sorted top-k of its strided elements (a later equal
 * value has a higher id, so strict > keeps the lower id); the lists go
 * to shared memory and k rounds of a block arg-max over the list heads
 * (value desc, id asc) emit the winners in order.
 *
 * cuda_tree_*: the device draft loop's tree steps (spec_tree_impl.h run
 * by thread 0 of one block per sequence: a few hundred nodes at most, so
 * a serial insertion sort costs microseconds and keeps the host's order
 * exactly), and the level rows (one thread per frontier node).
 * Tested through the whole head: build-cuda/gpu/test_spec_cuda.
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

static __global__ void topk_kernel(const float *logits, int vocab, int k,
                                   int *ids, float *logp)
{
    __shared__ float sh_red[32];
    __shared__ float sh_v[TOPK_THREADS * CUDA_TOPK_MAX];
    __shared__ int sh_i[TOPK_THREADS * CUDA_TOPK_MAX];
    __shared__ float sh_wv[32];
    __shared__ int sh_wi[32];
    __shared__ int sh_wt[32];
    __shared__ float sh_lse;
    const float *row = logits + (size_t)blockIdx.x * vocab;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int n_warps = blockDim.x >> 5;
    float lv[CUDA_TOPK_MAX];
    int li[CUDA_TOPK_MAX];
    float mx = -INFINITY, sum = 0.0f;
    int head = 0;

    /* Rows of a multiple of 4 floats are read as float4 (4x fewer
     * dependent rounds of L2 latency per thread: with 4 rows on 132 SMs
     * the scalar loops were latency-bound), other rows element by
     * element (the tail from 4 * n4 is then the whole row); every thread
     * still visits its elements in increasing index order, so the top-k
     * tie rule and the lists are unchanged, and the max is exact; only
     * the order of the sum's additions differs. */
    const float4 *row4 = reinterpret_cast<const float4 *>(row);
    const int n4 = (vocab & 3) == 0 ? vocab >> 2 : 0;

    /* logsumexp */
#pragma unroll 4
    for (int q = t; q < n4; q += blockDim.x) {
        const float4 f = row4[q];
        mx = fmaxf(mx, fmaxf(fmaxf(f.x, f.y), fmaxf(f.z, f.w)));
    }
    for (int j = 4 * n4 + t; j < vocab; j += blockDim.x)
        mx = fmaxf(mx, row[j]);
    mx = kern_warp_max(mx);
    if (lane == 0)
        sh_red[warp] = mx;
    __syncthreads();
    mx = lane < n_warps ? sh_red[lane] : -INFINITY;
    mx = kern_warp_max(mx);
    __syncthreads();
#pragma unroll 4
    for (int q = t; q < n4; q += blockDim.x) {
        const float4 f = row4[q];
        const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (e[u] == e[u]) /* not NaN */
                sum += __expf(e[u] - mx);
    }
    for (int j = 4 * n4 + t; j < vocab; j += blockDim.x)
        if (row[j] == row[j]) /* not NaN */
            sum += __expf(row[j] - mx);
    sum = kern_block_sum(sum, sh_red);
    if (t == 0)
        sh_lse = mx + logf(sum);

    /* per-thread sorted top-k of the strided elements */
#pragma unroll
    for (int c = 0; c < CUDA_TOPK_MAX; c++) {
        lv[c] = -INFINITY;
        li[c] = vocab;
    }
    auto visit = [&](int j, float v) {
        int c;

        if (v != v) /* NaN */
            return;
        if (li[k - 1] != vocab && !(v > lv[k - 1]))
            return; /* list full and v not better than its last */
        /* insert at its place (an equal earlier value keeps priority) */
        c = k - 1;
        while (c > 0 && topk_better(v, j, lv[c - 1], li[c - 1])) {
            lv[c] = lv[c - 1];
            li[c] = li[c - 1];
            c--;
        }
        lv[c] = v;
        li[c] = j;
    };
    for (int q = t; q < n4; q += blockDim.x) {
        const float4 f = row4[q];
        visit(4 * q, f.x);
        visit(4 * q + 1, f.y);
        visit(4 * q + 2, f.z);
        visit(4 * q + 3, f.w);
    }
    for (int j = 4 * n4 + t; j < vocab; j += blockDim.x)
        visit(j, row[j]);
    for (int c = 0; c < k; c++) {
        sh_v[t * CUDA_TOPK_MAX + c] = lv[c];
        sh_i[t * CUDA_TOPK_MAX + c] = li[c];
    }
    __syncthreads();

    /* k rounds of a block arg-max over the list heads */
    for (int r = 0; r < k; r++) {
        float bv = head < k ? sh_v[t * CUDA_TOPK_MAX + head] : -INFINITY;
        int bi = head < k ? sh_i[t * CUDA_TOPK_MAX + head] : vocab;
        int bt = t;

        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            int ot = __shfl_xor_sync(0xffffffffu, bt, o);
            if (topk_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
                bt = ot;
            }
        }
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
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                int ot = __shfl_xor_sync(0xffffffffu, bt, o);
                if (topk_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                    bt = ot;
                }
            }
            if (lane == 0) {
                ids[(size_t)blockIdx.x * k + r] = bi < vocab ? bi : 0;
                logp[(size_t)blockIdx.x * k + r] = bi < vocab
                                                       ? bv - sh_lse
                                                       : -INFINITY;
                sh_wt[0] = bt;
            }
        }
        __syncthreads();
        if (t == sh_wt[0])
            head++;
        __syncthreads();
    }
}

bt_status_t cuda_topk_logprob(const float *d_logits, int n, int vocab, int k,
                              int *d_ids, float *d_logp,
                              cudaStream_t stream)
{
    BT_ASSERT(n >= 0 && vocab > 0 && k >= 1 && k <= CUDA_TOPK_MAX);
    if (n == 0)
        return BT_OK;
    topk_kernel<<<n, TOPK_THREADS, 0, stream>>>(d_logits, vocab, k, d_ids,
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
