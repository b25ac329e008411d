/*
 * rope_kv.cu - q/k/v bias add, rotary embedding of q and k, and the write
 * of k and v into their paged-cache slots, in one pass over the fused QKV
 * projection.  qkv (tokens, (nh + 2 nkv) hd) -> q (tokens, nh hd) and the
 * cache rows (slot, nkv, hd).  Angles pos * inv_freq[i] in f32 with
 * accurate sincosf (matching the CPU reference within an ulp).
 * Test: build-cuda/tests/kernels/test_rope_kv (make gpu-test runs it).
 */
#include "rope_kv.h"

#include "bt_util.h"
#include "kern_common.cuh"

template <typename T>
static __global__ void rope_kv_kernel(cuda_rope_kv_args_t a)
{
    kern_pdl_trigger();
    kern_pdl_wait();
    int t = blockIdx.x;
    int hd = a.head_dim;
    int half = hd / 2;
    int qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
    const T *row = (const T *)a.d_qkv + (size_t)t * qkv_dim;
    const T *bias = (const T *)a.d_bias;
    int slot = a.d_slot[t];
    float pos = (float)a.d_pos[t];
    int n_pairs = (a.n_heads + a.n_kv_heads) * half;

    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        int head = p / half;
        int i = p - head * half;
        int e0 = a.rope_half ? i : 2 * i;
        int e1 = a.rope_half ? i + half : 2 * i + 1;
        int c0 = head * hd + e0; /* column in the qkv row */
        int c1 = head * hd + e1;
        float x0 = kern_to_f(row[c0]);
        float x1 = kern_to_f(row[c1]);
        float s, c;

        if (bias) {
            x0 += kern_to_f(bias[c0]);
            x1 += kern_to_f(bias[c1]);
        }
        sincosf(pos * a.d_inv_freq[i], &s, &c);
        float y0 = x0 * c - x1 * s;
        float y1 = x0 * s + x1 * c;
        if (head < a.n_heads) {
            T *q = (T *)a.d_q + (size_t)t * a.n_heads * hd + head * hd;
            q[e0] = kern_from_f<T>(y0);
            q[e1] = kern_from_f<T>(y1);
        } else if (slot >= 0) {
            int kh = head - a.n_heads;
            T *k = (T *)a.d_k_cache +
                   ((size_t)slot * a.n_kv_heads + kh) * hd;
            k[e0] = kern_from_f<T>(y0);
            k[e1] = kern_from_f<T>(y1);
        }
    }
    if (slot < 0)
        return;
    int v_off = (a.n_heads + a.n_kv_heads) * hd;
    T *v = (T *)a.d_v_cache + (size_t)slot * a.n_kv_heads * hd;
    for (int e = threadIdx.x; e < a.n_kv_heads * hd; e += blockDim.x) {
        float x = kern_to_f(row[v_off + e]);
        if (bias)
            x += kern_to_f(bias[v_off + e]);
        v[e] = kern_from_f<T>(x);
    }
}

bt_status_t cuda_rope_kv(const cuda_rope_kv_args_t *args, cuda_dtype_t dt,
                         cudaStream_t stream)
{
    BT_ASSERT(args->n_tokens >= 0 && args->head_dim % 2 == 0);
    if (args->n_tokens == 0)
        return BT_OK;
    KERN_DISPATCH_DT(dt, T,
                     kern_launch(rope_kv_kernel<T>, args->n_tokens, 256, 0,
                                 stream, *args));
    return BT_CUDA_LAUNCH_STATUS();
}
