/*
 * bench_quant_glu.cu - workbench: the SwiGLU + E4M3 quantization of the
 * down projection's input (cuda_fp8_glu_quant, quant_fp8.cu) at mixed-step
 * and prefill sizes, against a two-pass form.  ON THE DEVICE MACHINE.
 *
 * Why: in 2048/128's step on the H200 the input quantizations take ~10%
 * of the step at ~2.2 TB/s (2026-12-07), half the board's read; the
 * SwiGLU one moves most of their bytes (a row reads 57 KB of gate|up and
 * writes 14 KB of codes).  The engine's kernel (qf8_vec_kernel, GLU) holds
 * a row's values in the registers of one 512-thread block (59 registers:
 * two blocks an SM), issues all its loads at once, then takes the absmax
 * and writes the codes: between a block's loads the SM's DRAM traffic
 * rests on one other block.  (On the H100 a persistent grid and a
 * three-block build of it both lost: PERFORMANCE.md.)
 *
 * glu2 (here): THREADS threads a row; pass 1 streams the row, U 16-byte
 * loads of gate and of up in flight a thread, makes the bf16 SwiGLU values
 * (qf8_glu_val, the engine's arithmetic) into shared memory (2 k bytes:
 * 28 KB at Llama-3-8B's 14,336) and takes their absmax; pass 2 turns the
 * shared values into codes.  46-71 registers and 28 KB a row: 2-7 rows
 * an SM in flight against the engine's two (the table's "blocks an SM").
 *
 * Check: every variant's codes and scales equal the engine's, byte for
 * byte (the same values, the same max, the same conversion).  Times: the
 * median of --reps runs, L2 flushed before each, A B .. B A; GB/s of the
 * bytes a row must move (2 k bf16 in, ld codes and a scale out).
 *   bench_quant_glu [--rows N[,N...]] [--k K] [--reps N]
 * (defaults 2114,2048,512,64 rows of k 14,336: 2048/128's mixed step, a
 * 2048-token prefill, 2048/2048's 386 + 386 rows is ~772.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "bt_fp8.h"
#include "bench_ab.cuh"
#include "gpu_test_util.h" /* CK */
#include "kernels/fp8.h"
#include "kernels/fp8_cvt.cuh"
#include "kernels/quant_fp8.cuh"

static __device__ __forceinline__ uint4 qg_ld_nc(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Row blockIdx.x of gu (n, 2 k bf16: gate then up) -> codes q (ld, zero
 * past k) and scale xs, as cuda_fp8_glu_quant with a dynamic scale.
 * k % 8 == 0, ld % 16 == 0, ld >= k. */
template <int THREADS, int U>
static __global__ void __launch_bounds__(THREADS)
glu2_kernel(const bf16_t *gu, int k, int ld, uint8_t *q, float *xs)
{
    extern __shared__ __align__(16) unsigned char qg_sm[];
    __shared__ float sh[32];
    uint4 *sv = reinterpret_cast<uint4 *>(qg_sm); /* k / 8 chunks of bf16 */
    const bf16_t *g = gu + (size_t)blockIdx.x * 2 * k, *u = g + k;
    const int n8 = k / 8;
    float amax = 0.0f;

    for (int c0 = threadIdx.x; c0 < n8; c0 += THREADS * U) {
        uint4 gv[U], uv[U];
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int c = c0 + j * THREADS;
            if (c < n8) {
                gv[j] = qg_ld_nc(g + 8 * (size_t)c);
                uv[j] = qg_ld_nc(u + 8 * (size_t)c);
            }
        }
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int c = c0 + j * THREADS;
            if (c < n8) {
                const bf16_t *ge = reinterpret_cast<const bf16_t *>(&gv[j]);
                const bf16_t *ue = reinterpret_cast<const bf16_t *>(&uv[j]);
                uint4 o;
                bf16_t *oe = reinterpret_cast<bf16_t *>(&o);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float v = qf8_glu_val(__bfloat162float(ge[e]),
                                                __bfloat162float(ue[e]));
                    amax = fmaxf(amax, fabsf(v));
                    oe[e] = __float2bfloat16_rn(v); /* exact: v is bf16 */
                }
                sv[c] = o;
            }
        }
    }
    /* (qf8_block_max's barriers also publish sv) */
    const float s = bt_fp8_scale(qf8_block_max(amax, sh));
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < ld / 8; c += THREADS) {
        uint32_t w[2] = {0u, 0u};
        if (c < n8) {
            const uint4 o = sv[c];
            const bf16_t *oe = reinterpret_cast<const bf16_t *>(&o);
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = __bfloat162float(oe[e]);
            w[0] = fp8_e4m3x4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv);
            w[1] = fp8_e4m3x4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv);
        }
        *reinterpret_cast<uint2 *>(q + (size_t)blockIdx.x * ld + 8 * c) =
            make_uint2(w[0], w[1]);
    }
    if (threadIdx.x == 0)
        xs[blockIdx.x] = s;
}

/* Random bf16 in [-8, 8). */
static __global__ void qg_fill(bf16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 0x85EBCA6Bu ^ seed;
        x ^= x >> 13;
        x *= 0xC2B2AE35u;
        x ^= x >> 16;
        p[i] = __float2bfloat16_rn((float)(x & 0xFFFFu) / 4096.0f - 8.0f);
    }
}

typedef void (*qg_kernel_t)(const bf16_t *, int, int, uint8_t *, float *);

struct qg_variant {
    const char *name;
    qg_kernel_t kern; /* NULL: the engine's cuda_fp8_glu_quant */
    int threads;
};

static const qg_variant qg_variants[] = {
    {"engine", NULL, 0},
    {"glu2 256 x U2", glu2_kernel<256, 2>, 256},
    {"glu2 256 x U4", glu2_kernel<256, 4>, 256},
    {"glu2 512 x U2", glu2_kernel<512, 2>, 512},
    {"glu2 128 x U4", glu2_kernel<128, 4>, 128},
};
#define QG_NV ((int)(sizeof(qg_variants) / sizeof(qg_variants[0])))

static void qg_run(const qg_variant &v, const bf16_t *gu, int n, int k,
                   int ld, uint8_t *q, float *xs)
{
    if (v.kern == NULL) {
        if (cuda_fp8_glu_quant(gu, n, k, ld, 0.0f, q, NULL, xs, 0) !=
            BT_OK) {
            fprintf(stderr, "bench_quant_glu: cuda_fp8_glu_quant failed\n");
            exit(1);
        }
        return;
    }
    v.kern<<<n, v.threads, (size_t)k * 2>>>(gu, k, ld, q, xs);
}

int main(int argc, char **argv)
{
    const char *rows = "2114,2048,512,64";
    int k = 14336, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            rows = argv[i + 1];
        else if (!strcmp(argv[i], "--k"))
            k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (k < 8 || k % 8 != 0 || k * 2 > 200 * 1024) {
        fprintf(stderr, "bench_quant_glu: k must be a multiple of 8, "
                        "at most 102,400\n");
        return 2;
    }
    const int ld = (k + 15) / 16 * 16;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    for (int v = 0; v < QG_NV; v++)
        if (qg_variants[v].kern != NULL)
            CK(cudaFuncSetAttribute(
                qg_variants[v].kern,
                cudaFuncAttributeMaxDynamicSharedMemorySize, k * 2));
    printf("bench_quant_glu on %s (%d SMs), k %d\n", prop.name,
           prop.multiProcessorCount, k);
    printf("| rows | variant | blocks an SM | us | GB/s | / engine | "
           "codes, scales |\n");
    printf("| ---: | --- | ---: | ---: | ---: | ---: | --- |\n");
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", rows);
    int bad = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const int n = atoi(tok);
        if (n < 1) {
            fprintf(stderr, "bench_quant_glu: bad rows %s\n", tok);
            return 2;
        }
        bf16_t *gu;
        uint8_t *q, *q_ref;
        float *xs, *xs_ref;
        CK(cudaMalloc((void **)&gu, (size_t)n * 2 * k * 2));
        CK(cudaMalloc((void **)&q, (size_t)n * ld));
        CK(cudaMalloc((void **)&q_ref, (size_t)n * ld));
        CK(cudaMalloc((void **)&xs, (size_t)n * 4));
        CK(cudaMalloc((void **)&xs_ref, (size_t)n * 4));
        qg_fill<<<1024, 256>>>(gu, (size_t)n * 2 * k, 0x2468u);
        qg_run(qg_variants[0], gu, n, k, ld, q_ref, xs_ref);
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> hq_ref((size_t)n * ld), hq((size_t)n * ld);
        std::vector<float> hs_ref(n), hs(n);
        CK(cudaMemcpy(hq_ref.data(), q_ref, hq_ref.size(),
                      cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hs_ref.data(), xs_ref, (size_t)n * 4,
                      cudaMemcpyDeviceToHost));
        bool same[QG_NV];
        same[0] = true;
        for (int v = 1; v < QG_NV; v++) {
            CK(cudaMemset(q, 0xAB, (size_t)n * ld));
            CK(cudaMemset(xs, 0xFF, (size_t)n * 4));
            qg_run(qg_variants[v], gu, n, k, ld, q, xs);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hq.data(), q, hq.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hs.data(), xs, (size_t)n * 4,
                          cudaMemcpyDeviceToHost));
            same[v] = hq == hq_ref &&
                      memcmp(hs.data(), hs_ref.data(), (size_t)n * 4) == 0;
            bad |= !same[v];
        }
        const std::vector<double> t = bench_ab_medians_us(
            QG_NV, reps, [&](int v) {
                qg_run(qg_variants[v], gu, n, k, ld, q, xs);
            });
        const double bytes = (double)n * (4.0 * k + ld + 4);
        for (int v = 0; v < QG_NV; v++) {
            const double us = t[v];
            char occ_s[16] = "-";
            if (qg_variants[v].kern != NULL) {
                int occ = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                    &occ, qg_variants[v].kern, qg_variants[v].threads,
                    (size_t)k * 2));
                snprintf(occ_s, sizeof(occ_s), "%d", occ);
            }
            printf("| %d | %s | %s | %.1f | %.0f | %.3f | %s |\n", n,
                   qg_variants[v].name, occ_s, us,
                   bytes / (us * 1e-6) / 1e9, us / t[0],
                   v == 0 ? "-" : same[v] ? "equal" : "DIFFER");
        }
        fflush(stdout);
        cudaFree(gu);
        cudaFree(q);
        cudaFree(q_ref);
        cudaFree(xs);
        cudaFree(xs_ref);
    }
    printf("%s\n", bad ? "FAIL: a variant's codes or scales differ from the "
                         "engine's"
                       : "check: every variant's codes and scales are the "
                         "engine's");
    return bad;
}
