/*
 * fp8_cvt.cuh - f32 -> E4M3 and E4M3 -> bf16 on Hopper's conversion
 * instructions, bit for bit common/bt_fp8.h's software routines (the cpu
 * reference; they stay the definition, and the fallback below sm_89).
 *
 * Why: an H100 trace (precision fp8, inputs quantized per token) had the
 * input quantization on the critical path: at batch 1 the SwiGLU +
 * quantize of one 14,336-wide row took ~16 us after its dependency (one
 * block of 512 threads), the norm + quantize of a 4096-wide row ~4-5 us,
 * 4 a layer x 32 layers; at a 2048-token prefill these kernels were 6.0
 * of 36.5 ms (the SwiGLU one at 1.3 TB/s).  bt_f32_to_e4m3 is ~25
 * integer instructions with branches an element, and the 1-token path
 * converted every code back with bt_e4m3_to_f32 for its bf16 values.
 * Here: one cvt.rn.satfinite.e4m3x2.f32 per two elements, one
 * cvt.rn.f16x2.e4m3x2 (+ f16 -> f32 -> bf16) per two codes back.
 *
 * Why they are bit-exact (PTX ISA, cvt; cuda_fp8.hpp's host emulation
 * of the same instruction, __nv_cvt_float_to_fp8 / __nv_cvt_double_to_fp8
 * with __NV_SATFINITE, __NV_E4M3):
 *   - .rn: round to nearest, ties to even, one rounding from f32 (as bt);
 *   - .satfinite: |x| > 448 after rounding, and +-inf, give +-448 (0x7E
 *     with the sign) -- values in (448, 464] round to 448 anyway (464 is
 *     the tie 448 / 480, and 448's mantissa is even); bt saturates
 *     everything >= 448 to 0x7E: the same codes;
 *   - |x| <= 2^-10 (half the smallest subnormal 2^-9; exactly 2^-10 is a
 *     tie to the even 0) gives a zero with x's sign, as bt; subnormal
 *     results round on the 2^-9 grid (ties to even), as bt;
 *   - NaN: the emulation canonicalizes a NaN input to +NaN (0x7FFFFFFF)
 *     and returns 0x7F whatever the sign, where bt returns sign | 0x7F.
 *     The NaN codes are the only codes with all 7 low bits set (0x7F is
 *     never a finite result under .satfinite), so they are found in the
 *     packed word and given the input's sign back: exact whatever the
 *     hardware does with the NaN's sign.  (A NaN reaches these only from
 *     a NaN activation: an f32 multiply by the inverse scale already
 *     canonicalizes it on the GPU.)
 * Back: every E4M3 value is exact in f16 (largest 448, smallest
 * subnormal 2^-9 = a normal f16, 4 significant bits), then exact in f32
 * and in bf16 (8 exponent bits, 8 significant bits), so cvt.rn.f16x2
 * .e4m3x2 -> f32 -> bf16 is bt_e4m3_to_f32's value; a NaN code (rare:
 * found as above) takes the software route so its bf16 bits stay the
 * old kernels' ones.
 * Test: build-DIR/gpu/test_cuda_fp8 ("fp8 cvt" line: every code, the
 * midpoints and their neighbours, the saturation range, NaNs, zeros,
 * random floats, against bt_f32_to_e4m3 on the host).
 */
#ifndef BT_WORKER_CUDA_KERNELS_FP8_CVT_CUH
#define BT_WORKER_CUDA_KERNELS_FP8_CVT_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "bt_fp8.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FP8_CVT_HW 1
#else
#define FP8_CVT_HW 0
#endif

/* 0xFF in each byte of w that is a NaN code (0x7F / 0xFF), else 0. */
static __device__ __forceinline__ uint32_t fp8_nan_bytes(uint32_t w)
{
    return __vcmpeq4(w | 0x80808080u, 0xFFFFFFFFu);
}

/* Two floats -> two codes, a in the low byte (no NaN fix-up). */
static __device__ __forceinline__ uint32_t fp8_cvt2_raw(float a, float b)
{
#if FP8_CVT_HW
    unsigned short h;

    /* d = {hi: first operand, lo: second operand} */
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(b), "f"(a));
    return (uint32_t)h;
#else
    return (uint32_t)bt_f32_to_e4m3(a) | (uint32_t)bt_f32_to_e4m3(b) << 8;
#endif
}

/* Four floats -> four codes, bt_f32_to_e4m3 bit for bit, a in the low
 * byte (the order of memory). */
static __device__ __forceinline__ uint32_t fp8_e4m3x4(float a, float b,
                                                      float c, float d)
{
    uint32_t w = fp8_cvt2_raw(a, b) | fp8_cvt2_raw(c, d) << 16;
#if FP8_CVT_HW
    const uint32_t nan = fp8_nan_bytes(w);

    if (nan != 0u) { /* bt: sign | 0x7F */
        const uint32_t sg = (__float_as_uint(a) >> 31) << 7 |
                            (__float_as_uint(b) >> 31) << 15 |
                            (__float_as_uint(c) >> 31) << 23 |
                            (__float_as_uint(d) >> 31) << 31;
        w = (w & ~nan) | (nan & (0x7F7F7F7Fu | sg));
    }
#endif
    return w;
}

/* One float -> its code, bt_f32_to_e4m3 bit for bit. */
static __device__ __forceinline__ uint8_t fp8_e4m3(float x)
{
    uint32_t w = fp8_cvt2_raw(x, 0.0f) & 0xFFu;
#if FP8_CVT_HW
    if ((w & 0x7Fu) == 0x7Fu) /* NaN: bt keeps the sign */
        w = ((__float_as_uint(x) >> 31) << 7) | 0x7Fu;
#endif
    return (uint8_t)w;
}

/* Two codes (the low 16 bits of p, first code low) -> their values as
 * two bf16 (first in the low half), through the hardware's e4m3x2 ->
 * f16x2 (exact: every E4M3 value is an f16 and a bf16).  A NaN code
 * gives a NaN of the hardware's choosing: fp8_e4m3x4_to_bf16x4 checks
 * first where bt's bits matter. */
static __device__ __forceinline__ uint32_t fp8_e4m3x2_to_bf16x2(uint32_t p)
{
    const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(p & 0xFFFFu), __NV_E4M3));
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));

    return *reinterpret_cast<const uint32_t *>(&b);
}

/* Four codes (low byte first) -> their four values as bf16 (two words,
 * the first code in the low half of .x): __float2bfloat16_rn(
 * bt_e4m3_to_f32(code)) bit for bit. */
static __device__ __forceinline__ uint2 fp8_e4m3x4_to_bf16x4(uint32_t w)
{
    uint32_t o[2];

#if FP8_CVT_HW
    if (fp8_nan_bytes(w) == 0u) {
        return make_uint2(fp8_e4m3x2_to_bf16x2(w),
                          fp8_e4m3x2_to_bf16x2(w >> 16));
    }
#endif
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const __nv_bfloat16 lo = __float2bfloat16_rn(
            bt_e4m3_to_f32((uint8_t)(w >> (16 * i))));
        const __nv_bfloat16 hi = __float2bfloat16_rn(
            bt_e4m3_to_f32((uint8_t)(w >> (16 * i + 8))));
        o[i] = (uint32_t)*reinterpret_cast<const unsigned short *>(&lo) |
               (uint32_t)*reinterpret_cast<const unsigned short *>(&hi)
                   << 16;
    }
    return make_uint2(o[0], o[1]);
}

#endif /* BT_WORKER_CUDA_KERNELS_FP8_CVT_CUH */
