/*
 * rope_kv.cu - q/k/v bias add, rotary embedding of q and k, and the write
 * of k and v into their paged-cache slots, in one pass over the fused QKV
 * projection.  qkv (tokens, (nh + 2 nkv) hd) -> q (tokens, nh hd) and the
 * cache rows (slot, nkv, hd).  Angles pos * inv_freq[i] in f32 with
 * accurate sincosf (matching the CPU reference within an ulp).  Head
 * sizes with 16-byte chunks (every model): the vector kernel, (cos, sin)
 * once per token, 16-byte loads and stores; the scalar one otherwise.
 * FP8 KV (d_kv_scale set): either kernel writes E4M3 codes (kv8.cuh: the
 * cpu's rounding, bit for bit), the vector one 8 codes a store.
 * Test: build-cuda/tests/kernels/test_rope_kv (make gpu-test runs it);
 * FP8: tests/gpu/test_cuda_kv8.c.
 */
#include "rope_kv.h"

#include <stdint.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "kv8.cuh"

template <typename T, typename KT>
static __global__ void rope_kv_kernel(cuda_rope_kv_args_t a)
{
    constexpr bool KV8 = std::is_same<KT, kv8_t>::value;
    if (!a.pdl_late)
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
            KT *k = (KT *)a.d_k_cache +
                    ((size_t)slot * a.n_kv_heads + kh) * hd;
            float inv = KV8 ? __frcp_rn(a.d_kv_scale[kh]) : 1.0f;
            k[e0] = kv_store<T, KT>(y0, inv);
            k[e1] = kv_store<T, KT>(y1, inv);
        }
    }
    if (slot < 0)
        return;
    int v_off = (a.n_heads + a.n_kv_heads) * hd;
    KT *v = (KT *)a.d_v_cache + (size_t)slot * a.n_kv_heads * hd;
    for (int e = threadIdx.x; e < a.n_kv_heads * hd; e += blockDim.x) {
        float x = kern_to_f(row[v_off + e]);
        if (bias)
            x += kern_to_f(bias[v_off + e]);
        float inv = KV8 ? __frcp_rn(a.d_kv_scale[a.n_kv_heads + e / hd])
                        : 1.0f;
        v[e] = kv_store<T, KT>(x, inv);
    }
}

/* E elements of T as floats from a 16-byte chunk, and back. */
template <typename T, int E>
static __device__ __forceinline__ void rope_unpack(const uint4 &u, float *f)
{
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < E; i++)
        f[i] = kern_to_f(e[i]);
}
template <typename T, int E>
static __device__ __forceinline__ uint4 rope_pack(const float *f)
{
    uint4 u;
    T *e = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int i = 0; i < E; i++)
        e[i] = kern_from_f<T>(f[i]);
    return u;
}

/* E values of a chunk into the cache at dst: T's 16 bytes (KT == T), or
 * E codes in 8 bytes (KT == kv8_t, bf16 T: E == 8), each value rounded
 * as kv_store does (inv: 1 / the KV head's scale). */
template <typename T, typename KT, int E>
static __device__ __forceinline__ void rope_store_kv(KT *dst, const float *x,
                                                     float inv)
{
    if constexpr (std::is_same<KT, kv8_t>::value) {
        static_assert(E == 8, "FP8 KV: bf16 chunks of 8");
        uint2 u;
        uint8_t *b = reinterpret_cast<uint8_t *>(&u);
#pragma unroll
        for (int i = 0; i < E; i++)
            b[i] = kv8_encode<T>(x[i], inv).__x;
        *reinterpret_cast<uint2 *>(dst) = u;
    } else {
        (void)inv;
        *reinterpret_cast<uint4 *>(dst) = rope_pack<T, E>(x);
    }
}

/* Vectorised rope_kv_kernel: one block per token; the token's hd/2
 * (cos, sin) pairs are computed once into shared memory (sincosf of the
 * same angles: identical results), then every q/k head is rotated in
 * 16-byte chunks (E = 16 / sizeof(T) elements): the half layout pairs a
 * chunk of the first half with the same chunk of the second half; the
 * interleaved layout holds E/2 pairs per chunk.  V is copied in 16-byte
 * chunks.  Needs (hd/2) % E == 0 (half) or hd % E == 0 (interleaved) and
 * 16-byte aligned rows (rope_kv_vec_ok). */
#define ROPE_MAX_HALF 256
template <typename T, typename KT>
static __global__ void rope_kv_vec_kernel(cuda_rope_kv_args_t a)
{
    constexpr bool KV8 = std::is_same<KT, kv8_t>::value;
    constexpr int E = 16 / (int)sizeof(T);
    __shared__ float sh_c[ROPE_MAX_HALF], sh_s[ROPE_MAX_HALF];
    if (!a.pdl_late)
        kern_pdl_trigger();
    kern_pdl_wait();
    const int t = blockIdx.x;
    const int hd = a.head_dim;
    const int half = hd / 2;
    const int qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
    const T *row = (const T *)a.d_qkv + (size_t)t * qkv_dim;
    const T *bias = (const T *)a.d_bias;
    const int slot = a.d_slot[t];
    const float pos = (float)a.d_pos[t];
    const int n_rot = a.n_heads + a.n_kv_heads; /* q and k heads */
    const int cph_half = half / E;
    /* The half layout's first chunk pair and the V copy are issued before
     * the (cos, sin) table is built: their DRAM latency overlaps it. */
    uint4 pre0 = make_uint4(0, 0, 0, 0), pre1 = pre0;
    if (a.rope_half && (int)threadIdx.x < n_rot * cph_half) {
        const int head = threadIdx.x / cph_half;
        const int c0 = head * hd + (threadIdx.x - head * cph_half) * E;
        pre0 = *reinterpret_cast<const uint4 *>(row + c0);
        pre1 = *reinterpret_cast<const uint4 *>(row + c0 + half);
    }
    if (slot >= 0) {
        const int v_off = n_rot * hd;
        KT *v = (KT *)a.d_v_cache + (size_t)slot * a.n_kv_heads * hd;
        for (int e = threadIdx.x * E; e < a.n_kv_heads * hd;
             e += blockDim.x * E) {
            uint4 u = *reinterpret_cast<const uint4 *>(row + v_off + e);
            if (KV8 || bias) {
                float x[E];
                rope_unpack<T, E>(u, x);
                if (bias) {
                    float b[E];
                    rope_unpack<T, E>(
                        *reinterpret_cast<const uint4 *>(bias + v_off + e),
                        b);
#pragma unroll
                    for (int i = 0; i < E; i++)
                        x[i] += b[i];
                }
                /* a chunk lies in one head: hd % E == 0 */
                rope_store_kv<T, KT, E>(
                    v + e, x,
                    KV8 ? __frcp_rn(a.d_kv_scale[a.n_kv_heads + e / hd])
                        : 1.0f);
            } else if constexpr (!KV8) {
                *reinterpret_cast<uint4 *>(v + e) = u; /* as it came */
            }
        }
    }

    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cs;
        sincosf(pos * a.d_inv_freq[i], &sn, &cs);
        sh_c[i] = cs;
        sh_s[i] = sn;
    }
    __syncthreads();

    if (a.rope_half) {
        const int cph = cph_half; /* chunks per half head */
        for (int it = threadIdx.x; it < n_rot * cph; it += blockDim.x) {
            const int head = it / cph;
            const int i0 = (it - head * cph) * E;
            const int c0 = head * hd + i0;
            float x0[E], x1[E], y0[E], y1[E];
            if (it == (int)threadIdx.x) {
                rope_unpack<T, E>(pre0, x0);
                rope_unpack<T, E>(pre1, x1);
            } else {
                rope_unpack<T, E>(*reinterpret_cast<const uint4 *>(row + c0),
                                  x0);
                rope_unpack<T, E>(
                    *reinterpret_cast<const uint4 *>(row + c0 + half), x1);
            }
            if (bias) {
                float b0[E], b1[E];
                rope_unpack<T, E>(*reinterpret_cast<const uint4 *>(bias + c0),
                                  b0);
                rope_unpack<T, E>(
                    *reinterpret_cast<const uint4 *>(bias + c0 + half), b1);
#pragma unroll
                for (int e = 0; e < E; e++) {
                    x0[e] += b0[e];
                    x1[e] += b1[e];
                }
            }
#pragma unroll
            for (int e = 0; e < E; e++) {
                const float c = sh_c[i0 + e], s = sh_s[i0 + e];
                y0[e] = x0[e] * c - x1[e] * s;
                y1[e] = x0[e] * s + x1[e] * c;
            }
            if (head < a.n_heads) {
                T *dst = (T *)a.d_q + (size_t)t * a.n_heads * hd + head * hd;
                *reinterpret_cast<uint4 *>(dst + i0) = rope_pack<T, E>(y0);
                *reinterpret_cast<uint4 *>(dst + i0 + half) =
                    rope_pack<T, E>(y1);
            } else if (slot >= 0) {
                const int kh = head - a.n_heads;
                KT *dst = (KT *)a.d_k_cache +
                          ((size_t)slot * a.n_kv_heads + kh) * hd;
                const float inv = KV8 ? __frcp_rn(a.d_kv_scale[kh]) : 1.0f;
                rope_store_kv<T, KT, E>(dst + i0, y0, inv);
                rope_store_kv<T, KT, E>(dst + i0 + half, y1, inv);
            }
        }
    } else {
        const int cph = hd / E; /* chunks per head, E/2 pairs each */
        for (int it = threadIdx.x; it < n_rot * cph; it += blockDim.x) {
            const int head = it / cph;
            const int e0 = (it - head * cph) * E;
            const int c0 = head * hd + e0;
            float x[E], y[E];
            rope_unpack<T, E>(*reinterpret_cast<const uint4 *>(row + c0), x);
            if (bias) {
                float b[E];
                rope_unpack<T, E>(*reinterpret_cast<const uint4 *>(bias + c0),
                                  b);
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] += b[e];
            }
#pragma unroll
            for (int e = 0; e < E; e += 2) {
                const int i = (e0 + e) / 2;
                const float c = sh_c[i], s = sh_s[i];
                y[e] = x[e] * c - x[e + 1] * s;
                y[e + 1] = x[e] * s + x[e + 1] * c;
            }
            if (head < a.n_heads) {
                T *dst = (T *)a.d_q + (size_t)t * a.n_heads * hd + head * hd;
                *reinterpret_cast<uint4 *>(dst + e0) = rope_pack<T, E>(y);
            } else if (slot >= 0) {
                const int kh = head - a.n_heads;
                KT *dst = (KT *)a.d_k_cache +
                          ((size_t)slot * a.n_kv_heads + kh) * hd;
                rope_store_kv<T, KT, E>(
                    dst + e0, y, KV8 ? __frcp_rn(a.d_kv_scale[kh]) : 1.0f);
            }
        }
    }
}

/* True when rope_kv_vec_kernel applies. */
static bool rope_kv_vec_ok(const cuda_rope_kv_args_t *a, size_t es)
{
    const int E = (int)(16 / es);
    const int hd = a->head_dim;

    if (hd / 2 > ROPE_MAX_HALF)
        return false;
    if (a->rope_half ? (hd / 2) % E != 0 : hd % E != 0)
        return false;
    return (uintptr_t)a->d_qkv % 16 == 0 && (uintptr_t)a->d_q % 16 == 0 &&
           (uintptr_t)a->d_bias % 16 == 0 &&
           (uintptr_t)a->d_k_cache % 16 == 0 &&
           (uintptr_t)a->d_v_cache % 16 == 0;
}

bt_status_t cuda_rope_kv(const cuda_rope_kv_args_t *args, cuda_dtype_t dt,
                         cudaStream_t stream)
{
    BT_ASSERT(args->n_tokens >= 0 && args->head_dim % 2 == 0);
    if (args->n_tokens == 0)
        return BT_OK;
    cuda_rope_kv_args_t al = *args;
    al.pdl_late = cuda__pdl_late;
    args = &al;
    /* Threads of the vector kernel: one 16-byte chunk pair each for the
     * q/k heads. */
    const int th = args->n_heads * args->head_dim >= 4096 ? 256 : 128;
    const bool vec = rope_kv_vec_ok(args, cuda_dtype_size(dt));
    if (args->d_kv_scale != NULL) {
        /* FP8 KV: bf16 activations only (cuda_backend.c refuses f32) */
        BT_ASSERT(dt == CUDA_DT_BF16);
        if (vec)
            kern_launch(rope_kv_vec_kernel<bf16_t, kv8_t>, args->n_tokens,
                        th, 0, stream, *args);
        else
            kern_launch(rope_kv_kernel<bf16_t, kv8_t>, args->n_tokens, 256,
                        0, stream, *args);
        return BT_CUDA_LAUNCH_STATUS();
    }
    if (vec) {
        KERN_DISPATCH_DT(dt, T,
                         kern_launch(rope_kv_vec_kernel<T, T>, args->n_tokens,
                                     th, 0, stream, *args));
        return BT_CUDA_LAUNCH_STATUS();
    }
    KERN_DISPATCH_DT(dt, T,
                     kern_launch(rope_kv_kernel<T, T>, args->n_tokens, 256, 0,
                                 stream, *args));
    return BT_CUDA_LAUNCH_STATUS();
}
