/*
 * gpu_test_util.h - what the GPU test programs (test_cuda_fp8.c,
 * test_cuda_kv8.c) share: CK, a CUDA call that must succeed (else a FAIL
 * line and exit 1), and bf16 <-> f32 on the host (round to nearest even,
 * as the device's __float2bfloat16_rn).
 */
#ifndef BT_TESTS_GPU_GPU_TEST_UTIL_H
#define BT_TESTS_GPU_GPU_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#define CK(_e)                                                              \
    do {                                                                    \
        cudaError_t _err = (_e);                                            \
        if (_err != cudaSuccess) {                                          \
            printf("FAIL cuda %s: %s\n", #_e, cudaGetErrorString(_err));    \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static inline uint16_t bf16_of(float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float f32_of_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;

    memcpy(&f, &u, 4);
    return f;
}

#endif /* BT_TESTS_GPU_GPU_TEST_UTIL_H */
