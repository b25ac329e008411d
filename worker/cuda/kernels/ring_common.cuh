/*
 * ring_common.cuh - what the shared-memory ring kernels (gemv.cu's ring
 * and mma variants, gemv_fp8.cu) share: one persistent block per SM that
 * streams its weights through cp.async stages in dynamic shared memory,
 * so the device's multiprocessor count, the opt-in shared memory limit
 * and a run-time cp.async wait.
 */
#ifndef BT_WORKER_CUDA_KERNELS_RING_COMMON_CUH
#define BT_WORKER_CUDA_KERNELS_RING_COMMON_CUH

#include "bt_util.h"
#include "tc_common.cuh"

#define RING_SMEM_MAX (226 * 1024) /* under sm_90's 227 KB opt-in */

/* cp.async.wait_group with a run-time count (0..7). */
static __device__ __forceinline__ void ring_cp_wait(int n)
{
    switch (n) {
    case 0: tc_cp_wait<0>(); break;
    case 1: tc_cp_wait<1>(); break;
    case 2: tc_cp_wait<2>(); break;
    case 3: tc_cp_wait<3>(); break;
    case 4: tc_cp_wait<4>(); break;
    case 5: tc_cp_wait<5>(); break;
    case 6: tc_cp_wait<6>(); break;
    default: tc_cp_wait<7>(); break;
    }
}

/* Multiprocessors of the current device (cached per device). */
static int ring_n_sm(void)
{
    static int cache[64];
    int dev = 0, n = 0;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 132;
    if (cache[dev] == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount,
                                   dev) != cudaSuccess || n <= 0)
            n = 132;
        cache[dev] = n;
    }
    return cache[dev];
}

/* Dynamic shared memory the ring kernels may use on the current device:
 * RING_SMEM_MAX, less where the opt-in limit is lower (1 KB left for
 * static shared memory).  Cached per device. */
static size_t ring_smem_budget(void)
{
    static size_t cache[64];
    int dev = 0, optin = 0;

    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 48 * 1024;
    if (cache[dev] == 0) {
        if (cudaDeviceGetAttribute(&optin,
                                   cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                   dev) != cudaSuccess || optin <= 0)
            optin = 48 * 1024;
        cache[dev] = BT_MIN((size_t)RING_SMEM_MAX, (size_t)optin - 1024);
    }
    return cache[dev];
}

/* Raises kernel k's dynamic shared memory limit to ring_smem_budget()
 * once per device (bit `slot` of a per-device mask). */
template <typename K>
static cudaError_t ring_smem_attr(K k, int slot)
{
    static uint64_t done[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);

    if (err != cudaSuccess)
        return err;
    if (dev >= 0 && dev < 64 && (done[dev] >> slot & 1))
        return cudaSuccess;
    err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)ring_smem_budget());
    if (err == cudaSuccess && dev >= 0 && dev < 64)
        done[dev] |= 1ull << slot;
    return err;
}

#endif /* BT_WORKER_CUDA_KERNELS_RING_COMMON_CUH */
