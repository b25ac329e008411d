/*
 * bench_ab.cuh - what the kernel workbenches that time an engine kernel
 * beside its variants share (bench_attn_kv8t.cu, bench_quant_glu.cu):
 * every variant's median time, runs in the order A B .. B A (machines
 * drift, and the second of two back-to-back runs reads faster), L2
 * flushed before each run (cuda_l2_flush: links bt_cuda_kernels).
 */
#ifndef BT_TESTS_GPU_BENCH_AB_CUH
#define BT_TESTS_GPU_BENCH_AB_CUH

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "gpu_test_util.h" /* CK */
#include "kernels/gemv.h"  /* cuda_l2_flush */

/* Median microseconds of run(v) for v = 0 .. nv - 1, reps runs a variant
 * in each of the two rounds. */
template <typename F>
static std::vector<double> bench_ab_medians_us(int nv, int reps, F run)
{
    static void *flush = NULL;
    const size_t flush_bytes = 256u << 20;
    cudaEvent_t e0, e1;
    std::vector<std::vector<float>> t(nv);
    std::vector<double> us(nv);

    if (flush == NULL)
        CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < nv; i++) {
            const int v = round ? nv - 1 - i : i;
            for (int r = 0; r < reps; r++) {
                if (cuda_l2_flush(flush, flush_bytes, 0) != BT_OK) {
                    printf("FAIL L2 flush\n");
                    exit(1);
                }
                CK(cudaEventRecord(e0, 0));
                run(v);
                CK(cudaEventRecord(e1, 0));
                CK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t[v].push_back(ms);
            }
        }
    CK(cudaGetLastError());
    for (int v = 0; v < nv; v++) {
        std::sort(t[v].begin(), t[v].end());
        us[v] = t[v][t[v].size() / 2] * 1e3;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return us;
}

#endif /* BT_TESTS_GPU_BENCH_AB_CUH */
