/*
 * bt_fp8.h - the OCP FP8 E4M3 ("E4M3FN") number format: 1 sign bit, 4
 * exponent bits (bias 7), 3 mantissa bits, no infinities, NaN only at
 * S.1111.111 (0x7F / 0xFF), largest finite value 448, smallest subnormal
 * 2^-9.
 *
 * One definition for every backend: header-only, plain C11 and usable
 * from CUDA device code (the functions are __host__ __device__ there), so
 * the CPU reference and the GPU kernels round exactly alike.
 *
 * f32 -> E4M3 rounds to nearest, ties to even, and saturates: a finite
 * value or an infinity beyond +-448 becomes +-448 (what quantizers want:
 * a scaled outlier clips instead of turning into NaN; CUDA's
 * __NV_SATFINITE does the same).  NaN stays NaN (0x7F with the sign).
 * Inputs below the smallest subnormal round to a signed zero.
 */
#ifndef BT_COMMON_BT_FP8_H
#define BT_COMMON_BT_FP8_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define BT_FP8_FN static inline __host__ __device__
#else
#define BT_FP8_FN static inline
#endif

#define BT_FP8_E4M3_MAX 448.0f    /* largest finite E4M3 value */
#define BT_FP8_E4M3_NAN 0x7Fu     /* the canonical (positive) NaN code */

BT_FP8_FN uint32_t bt_fp8__f32_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

BT_FP8_FN float bt_fp8__bits_f32(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

/* f32 -> E4M3 code, round to nearest even, saturating (see above). */
BT_FP8_FN uint8_t bt_f32_to_e4m3(float f)
{
    uint32_t u = bt_fp8__f32_bits(f);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t mag = u & 0x7FFFFFFFu;
    int e = (int)(mag >> 23) - 127;   /* unbiased f32 exponent */
    uint32_t code, rem, half;

    if (mag > 0x7F800000u)                /* NaN */
        return (uint8_t)(sign | BT_FP8_E4M3_NAN);
    if (mag >= 0x43E00000u)               /* >= 448 (and inf): saturate */
        return (uint8_t)(sign | 0x7Eu);
    if (e < -10)                          /* < 2^-10: rounds to zero */
        return (uint8_t)sign;
    if (e < -6) {
        /* subnormal result: units of 2^-9 from the 24-bit significand */
        uint32_t m24 = (mag & 0x7FFFFFu) | 0x800000u;
        int sh = 14 - e;                  /* 21..24 */

        code = m24 >> sh;
        rem = m24 & ((1u << sh) - 1u);
        half = 1u << (sh - 1);
    } else {
        code = ((uint32_t)(e + 7) << 3) | ((mag >> 20) & 7u);
        rem = mag & 0xFFFFFu;
        half = 0x80000u;
    }
    /* ties to even; a carry moves into the exponent as it should */
    if (rem > half || (rem == half && (code & 1u)))
        code++;
    if (code > 0x7Eu)                     /* rounded up past 448 */
        code = 0x7Eu;
    return (uint8_t)(sign | code);
}

/* E4M3 code -> f32 (exact: every E4M3 value is an f32). */
BT_FP8_FN float bt_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = (c >> 3) & 0xFu;
    uint32_t mant = c & 7u;

    if (exp == 0xFu && mant == 7u)
        return bt_fp8__bits_f32(sign | 0x7FC00000u);
    if (exp == 0)  /* subnormal: mant * 2^-9, exact in f32 */
        return bt_fp8__bits_f32(sign | bt_fp8__f32_bits((float)mant *
                                                        0.001953125f));
    return bt_fp8__bits_f32(sign | ((exp - 7u + 127u) << 23) | (mant << 20));
}

/* x rounded through E4M3: the value an FP8 store keeps. */
BT_FP8_FN float bt_fp8_round(float x)
{
    return bt_e4m3_to_f32(bt_f32_to_e4m3(x));
}

/* The per-tensor / per-channel scale that maps absmax onto the largest
 * E4M3 value (scale = absmax / 448); 1 when absmax is 0 or not finite, so
 * an all-zero row stays zero and never divides by zero. */
BT_FP8_FN float bt_fp8_scale(float absmax)
{
    if (!(absmax > 0.0f) || absmax > 3.0e38f)
        return 1.0f;
    return absmax / BT_FP8_E4M3_MAX;
}

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_BT_FP8_H */
