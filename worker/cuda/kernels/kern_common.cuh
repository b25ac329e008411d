/*
 * kern_common.cuh - device helpers shared by the kernels of worker/cuda:
 * float conversion of the two activation types (float, bf16), 16-byte
 * vector loads, warp reductions, the dtype dispatch macro, programmatic
 * dependent launch, and the launch helpers of the skinny GEMMs (shared-
 * memory limit once per device, multiprocessor count, token tiles).
 */
#ifndef BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH
#define BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH

#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../cuda_int.h"

typedef __nv_bfloat16 bf16_t;

static __device__ __forceinline__ float kern_to_f(float x) { return x; }
static __device__ __forceinline__ float kern_to_f(bf16_t x)
{
    return __bfloat162float(x);
}

template <typename T> static __device__ __forceinline__ T kern_from_f(float x);
template <> __device__ __forceinline__ float kern_from_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ bf16_t kern_from_f<bf16_t>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Loads N consecutive elements (N * sizeof(T) a multiple of 16 bytes or
 * smaller power of two; the address must be aligned to that) as floats. */
template <typename T, int N>
static __device__ __forceinline__ void kern_load_vec(const T *p, float *out)
{
    constexpr int BYTES = N * (int)sizeof(T);
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int c = 0; c < BYTES / 16; c++) {
            uint4 u = *reinterpret_cast<const uint4 *>(
                reinterpret_cast<const char *>(p) + 16 * c);
            const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
            for (int i = 0; i < 16 / (int)sizeof(T); i++)
                out[c * (16 / (int)sizeof(T)) + i] = kern_to_f(e[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            out[i] = kern_to_f(p[i]);
    }
}

/* SwiGLU of one element, the CPU reference's arithmetic (llama2.c):
 * swiglu.cu and the GEMV with the fused SwiGLU output (gemv.cu). */
static __device__ __forceinline__ float kern_swiglu_f(float g, float u)
{
    return g * (1.0f / (1.0f + expf(-g))) * u;
}

static __device__ __forceinline__ float kern_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float kern_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the total.  `sh` holds 32 floats. */
static __device__ __forceinline__ float kern_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int n_warps = blockDim.x >> 5;

    v = kern_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : 0.0f;
    return kern_warp_sum(v);
}

/* Programmatic dependent launch (Hopper).  A kernel started through
 * kern_launch() may begin while the kernel before it on the stream is
 * still finishing (its blocks fill the multiprocessors the previous
 * kernel's tail leaves idle; a GEMV can already stream its weights).  Such
 * a kernel MUST call kern_pdl_wait() before it reads anything an earlier
 * kernel wrote or writes anything an earlier kernel reads; the wait
 * returns once the previous grid has completed and its memory is visible
 * (and that grid waited for its own predecessor, so the order is
 * transitive).  kern_pdl_trigger() lets the next kernel launch early.
 * Both are no-ops when the kernel was launched without the attribute. */
static __device__ __forceinline__ void kern_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void kern_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Per-block phase profile (a build with -DBT_KPROF=1 only; the default
 * build compiles KPROF to nothing).  Thread 0 of each block stores the
 * global timer (ns, one clock for every SM) at mark m of slot s; the
 * last launch of a slot wins, so after a decode step the buffer holds
 * the step's last layer.  One buffer per translation unit (no
 * relocatable device code): each profiled .cu exports a dump function
 * built on kprof_dump().  tests/gpu/bench_cuda prints them. */
#ifdef BT_KPROF
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define KPROF_SLOTS 6
#define KPROF_BLOCKS 4096
#define KPROF_MARKS 5
static __device__ unsigned long long
    kprof_buf[KPROF_SLOTS][KPROF_BLOCKS][KPROF_MARKS];
static __device__ __forceinline__ void kprof_mark(int slot, int m)
{
    const unsigned b =
        blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0 && b < KPROF_BLOCKS) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        kprof_buf[slot][b][m] = t;
    }
}
#define KPROF(slot, m) kprof_mark((slot), (m))
static inline int kprof_cmp(const void *a, const void *b)
{
    const unsigned long long x = *(const unsigned long long *)a;
    const unsigned long long y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
/* Prints "KPROF name slot mark n min p10 p50 p90 max" (ns) for every
 * slot and mark stamped since the last dump, then clears the buffer. */
static inline void kprof_dump(const char *name, FILE *f)
{
    static unsigned long long h[KPROF_SLOTS][KPROF_BLOCKS][KPROF_MARKS];
    static unsigned long long v[KPROF_BLOCKS];
    if (cudaMemcpyFromSymbol(h, kprof_buf, sizeof(h)) != cudaSuccess)
        return;
    for (int s = 0; s < KPROF_SLOTS; s++)
        for (int m = 0; m < KPROF_MARKS; m++) {
            int n = 0;
            for (int b = 0; b < KPROF_BLOCKS; b++)
                if (h[s][b][m] != 0)
                    v[n++] = h[s][b][m];
            if (n == 0)
                continue;
            qsort(v, (size_t)n, sizeof(v[0]), kprof_cmp);
            fprintf(f, "KPROF %s %d %d %d %llu %llu %llu %llu %llu\n", name,
                    s, m, n, v[0], v[n / 10], v[n / 2], v[n * 9 / 10],
                    v[n - 1]);
        }
    memset(h, 0, sizeof(h));
    (void)cudaMemcpyToSymbol(kprof_buf, h, sizeof(h));
}
#else
#define KPROF(slot, m) ((void)0)
#endif

/* True when launches should carry the programmatic-serialization
 * attribute: compute capability >= 9. */
static inline bool kern_pdl_enabled(void)
{
    static int on = -1;

    if (on < 0) {
        int dev = 0, major = 0;

        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                   dev) != cudaSuccess)
            major = 0;
        on = major >= 9;
    }
    return on != 0;
}

/* Launches kernel `k` like k<<<grid, block, smem, st>>>(args...), with the
 * programmatic-dependent-launch attribute when kern_pdl_enabled().  Errors
 * are left for cudaGetLastError() (BT_CUDA_LAUNCH_STATUS) as with <<<>>>. */
template <typename... KArgs, typename... Args>
static void kern_launch(void (*k)(KArgs...), dim3 grid, dim3 block,
                        size_t smem, cudaStream_t st, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];

    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    if (kern_pdl_enabled()) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    (void)cudaLaunchKernelEx(&cfg, k, static_cast<KArgs>(args)...);
}

/* Runs `...` with `T` bound to the C++ type of cuda_dtype_t `dt`. */
#define KERN_DISPATCH_DT(dt, T, ...)                                        \
    do {                                                                    \
        if ((dt) == CUDA_DT_F32) {                                          \
            typedef float T;                                                \
            __VA_ARGS__;                                                    \
        } else {                                                            \
            typedef bf16_t T;                                               \
            __VA_ARGS__;                                                    \
        }                                                                   \
    } while (0)

/* y[tok][row0 + e] = v[e] (+ the old value when accumulate) for the rows
 * row0 + e < n_out, e < 4: the split-K epilogues of the skinny GEMMs. */
template <typename OUT>
static __device__ __forceinline__ void kern_put_rows4(OUT *y, int n_out,
                                                      int tok, int row0,
                                                      const float (&v)[4],
                                                      bool accumulate)
{
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (row0 + e >= n_out)
            break;
        OUT *d = y + (size_t)tok * n_out + row0 + e;
        float o = v[e];
        if (accumulate)
            o += kern_to_f(*d);
        *d = kern_from_f<OUT>(o);
    }
}

/* Raises kernel k's dynamic shared-memory limit to `bytes` the first time
 * it is launched on each device (bit d of *done; devices >= 64 every
 * time).  Host code, outside stream capture the first time. */
template <typename K>
static cudaError_t kern_smem_limit_once(K k, size_t bytes, uint64_t *done)
{
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);

    if (err != cudaSuccess || (dev < 64 && (*done >> dev & 1)))
        return err;
    err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)bytes);
    if (err == cudaSuccess && dev < 64)
        *done |= 1ull << dev;
    return err;
}

/* The current device's multiprocessor count (cached per device), 0 on
 * error. */
static inline int kern_sm_count(void)
{
    static int sm_of[64];
    int dev = 0, n = 0;

    if (cudaGetDevice(&dev) != cudaSuccess)
        return 0;
    if (dev < 64 && sm_of[dev] > 0)
        return sm_of[dev];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) !=
        cudaSuccess)
        return 0;
    if (dev < 64)
        sm_of[dev] = n;
    return n;
}

/* Token columns of the skinny tensor-core GEMMs: n_tok rounded up to
 * 8 NT with NT in {1, 2, 4, 8, 16} (tokens past n_tok are zeros). */
static inline int kern_tok_tiles(int n_tok)
{
    return n_tok <= 8 ? 1 : n_tok <= 16 ? 2 : n_tok <= 32 ? 4
         : n_tok <= 64 ? 8 : 16;
}

#endif /* BT_WORKER_CUDA_KERNELS_KERN_COMMON_CUH */
