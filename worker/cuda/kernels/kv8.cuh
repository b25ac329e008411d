/*
 * kv8.cuh - the FP8 (E4M3) KV cache's element type for the kernels that
 * read or write it (rope_kv.cu, attn_decode.cu): a cache element type KT
 * is either the activation type T (bf16/f32 KV) or kv8_t (one E4M3 code;
 * value = code * the layer's per-KV-head scale, rope_kv.h).  Templates
 * on KT keep the bf16 paths as they were: no runtime branch in a loop.
 */
#ifndef BT_WORKER_CUDA_KERNELS_KV8_CUH
#define BT_WORKER_CUDA_KERNELS_KV8_CUH

#include <type_traits>

#include <cuda_fp8.h>

#include "bt_fp8.h"
#include "fp8_cvt.cuh"
#include "kern_common.cuh"

typedef __nv_fp8_e4m3 kv8_t;

/* A code as a float: exact (every E4M3 value is an f16 and an f32). */
static __device__ __forceinline__ float kern_to_f(kv8_t x)
{
    return static_cast<float>(x);
}

/* The code stored for value x of a T-precision activation at inverse
 * scale inv (= 1 / scale, rounded once as the cpu does): x is first
 * rounded to T as the bf16 cache would keep it, then x * inv rounds to
 * E4M3 as bt_f32_to_e4m3, the cpu's own function, does (round to nearest
 * even, saturating at 448, NaN kept), so both backends store the same
 * bytes: on the hardware conversion (fp8_cvt.cuh, bit for bit bt's; the
 * software routine is ~25 branchy instructions an element). */
template <typename T>
static __device__ __forceinline__ kv8_t kv8_encode(float x, float inv)
{
    kv8_t c;

    c.__x = fp8_e4m3(__fmul_rn(kern_to_f(kern_from_f<T>(x)), inv));
    return c;
}

/* Element store into a cache of KT from an f32 value: the activation
 * rounding (KT == T), or the E4M3 code (KT == kv8_t, inv: 1 / scale). */
template <typename T, typename KT>
static __device__ __forceinline__ KT kv_store(float x, float inv)
{
    if constexpr (std::is_same<KT, kv8_t>::value) {
        return kv8_encode<T>(x, inv);
    } else {
        (void)inv;
        return kern_from_f<T>(x);
    }
}

/* Eight codes (a uint2, first code in the low byte) as eight bf16 (a
 * uint4, same order): fp8_e4m3x2_to_bf16x2 four times. */
static __device__ __forceinline__ uint4 kv8_to_bf16x8(uint2 c)
{
    uint4 r;
    uint32_t *o = reinterpret_cast<uint32_t *>(&r);
    const uint32_t w[2] = {c.x, c.y};

#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = fp8_e4m3x2_to_bf16x2(w[i / 2] >> (16 * (i % 2)));
    return r;
}

/* A register word of B bytes (B = 1, 2, 4, 8 or 16), for rows of cache
 * elements loaded raw and converted later. */
template <int B> struct kv_word;
template <> struct kv_word<1> { typedef unsigned char type; };
template <> struct kv_word<2> { typedef unsigned short type; };
template <> struct kv_word<4> { typedef unsigned int type; };
template <> struct kv_word<8> { typedef uint2 type; };
template <> struct kv_word<16> { typedef uint4 type; };

#endif /* BT_WORKER_CUDA_KERNELS_KV8_CUH */
