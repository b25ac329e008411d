/*
 * bench_kvread.cu - how fast can the decode attention's KV bytes be read
 * at all?  ON THE DEVICE MACHINE.  Read-only kernels, no arithmetic but
 * an XOR that keeps the loads alive, over the same bytes as a batch-64
 * decode step's attention (64 sequences x 2048 keys x 8 KV heads x 128
 * dims, bf16 K and V: 537 MB):
 *
 *   flat        one contiguous array of those bytes (the read ceiling)
 *   tok-major   baton's paged cache, (block, 16 tokens, head, dim): one
 *               block per (head, sequence) reads 256-byte rows 2 KB apart
 *   head-major  the same pages as (block, head, 16 tokens, dim): each
 *               (head, page) 4 KB contiguous
 *   whole-token baton's pages, but one block per (sequence, eighth of its
 *               keys) reading every head of a key: whole 2 KB (1 KB)
 *               token rows, the same bytes and number of blocks
 *
 * --kv8: E4M3 K and V (rows of 128 bytes, 8 lanes a row; the FP8-KV
 * attention's 4 blocks of 128 threads an SM), the H200's question
 * (2026-12-07: its FP8-KV decode attention reads 0.84 of the board).
 *
 * each with the pages of a sequence in order or shuffled, each at two
 * occupancies: many threads a SM (the pattern's ceiling) and the
 * attention's own (2 blocks of 4 warps a SM, UNROLL 16-byte loads a
 * lane in flight).  Prints GB/s and the fraction of the flat ceiling.
 * A pattern far below flat says the cache layout costs bandwidth; a
 * pattern at flat says the attention's gap is its own latency.
 *   bench_kvread [--seqs N] [--ctx N] [--reps N] [--kv8]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#define CK(_e)                                                              \
    do {                                                                    \
        cudaError_t _r = (_e);                                              \
        if (_r != cudaSuccess) {                                            \
            fprintf(stderr, "FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #_e, \
                    cudaGetErrorString(_r));                                \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

#define NKV 8
#define HD 128
#define BS 16

static __device__ __forceinline__ uint4 ld_nc(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ void sink_xor(uint32_t acc,
                                                unsigned int *sink)
{
    if (acc == 0x9e3779b9u) /* never (the data is zeros): keeps the loads */
        atomicAdd(sink, 1u);
}

/* Grid-stride over n16 uint4, U loads a thread in flight. */
template <int U>
__global__ void read_flat(const uint4 *p, size_t n16, unsigned int *sink)
{
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = ld_nc(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        uint4 v = ld_nc(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    sink_xor(acc, sink);
}

/* One block per (head, sequence): every key's K and V row of its head
 * (RC 16-byte chunks a row: 16 bf16, 8 E4M3).  Each group of RC lanes
 * reads one row (16 B a lane); U rows a group in flight, K and V.
 * HEAD_MAJOR picks the page layout.  WHOLE: one block per (sequence,
 * eighth of its keys), a group reading row (key, head) for every head of
 * each of its keys in turn (token-major pages: whole token rows). */
template <int U, bool HEAD_MAJOR, int RC, bool WHOLE = false>
__global__ void read_paged(const uint4 *k, const uint4 *v, const int *bt,
                           int ctx, int max_blocks, unsigned int *sink)
{
    const int seq = blockIdx.y;
    const int groups = blockDim.x / RC;
    const int g = threadIdx.x / RC, c = threadIdx.x % RC;
    const int *tab = bt + (size_t)seq * max_blocks;
    /* WHOLE: item i = (key - k0) * NKV + head over the block's keys */
    const int k0 = WHOLE ? (int)((long long)ctx * blockIdx.x / NKV) : 0;
    const int k1 = WHOLE ? (int)((long long)ctx * (blockIdx.x + 1) / NKV)
                         : ctx;
    const int n_items = WHOLE ? (k1 - k0) * NKV : ctx;
    uint32_t acc = 0;

    for (int i0 = g; i0 < n_items; i0 += U * groups) {
        uint4 kv[U], vv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * groups;
            if (i < n_items) {
                const int key = WHOLE ? k0 + i / NKV : i;
                const int kvh = WHOLE ? i % NKV : blockIdx.x;
                const int bid = tab[key / BS], t = key % BS;
                const size_t row =
                    HEAD_MAJOR ? ((size_t)bid * NKV + kvh) * BS + t
                               : ((size_t)bid * BS + t) * NKV + kvh;
                kv[u] = ld_nc(k + row * RC + c);
                vv[u] = ld_nc(v + row * RC + c);
            } else {
                kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            acc ^= kv[u].x ^ kv[u].w ^ vv[u].y ^ vv[u].z;
    }
    sink_xor(acc, sink);
}

static float time_ms(cudaEvent_t e0, cudaEvent_t e1)
{
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

template <typename F>
static double median_ms(int reps, F launch)
{
    cudaEvent_t e0, e1;
    std::vector<float> t;

    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    launch(); /* warm-up */
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        t.push_back(time_ms(e0, e1));
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return t[t.size() / 2];
}

int main(int argc, char **argv)
{
    int seqs = 64, ctx = 2048, reps = 20, kv8 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kv8")) kv8 = 1;
        else if (i + 1 >= argc) break;
        else if (!strcmp(argv[i], "--seqs")) seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    }
    const int eb = kv8 ? 1 : 2; /* bytes an element */
    const int max_blocks = (ctx + BS - 1) / BS;
    const size_t n_blocks = (size_t)seqs * max_blocks;
    const size_t half = n_blocks * BS * NKV * HD * eb; /* K (or V) bytes */
    const double bytes = (double)seqs * ctx * NKV * HD * 2 * eb;
    uint4 *d_k, *d_v, *d_flat;
    int *d_bt;
    unsigned int *d_sink;
    int sms = 0;

    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&d_k, half));
    CK(cudaMalloc(&d_v, half));
    CK(cudaMalloc(&d_flat, 2 * half));
    CK(cudaMalloc(&d_bt, n_blocks * sizeof(int)));
    CK(cudaMalloc(&d_sink, sizeof(unsigned int)));
    CK(cudaMemset(d_k, 0, half));
    CK(cudaMemset(d_v, 0, half));
    CK(cudaMemset(d_flat, 0, 2 * half));
    CK(cudaMemset(d_sink, 0, sizeof(unsigned int)));

    std::vector<int> order(n_blocks);
    for (size_t i = 0; i < n_blocks; i++)
        order[i] = (int)i;

    printf("kvread %d seqs x %d keys x %d heads x %d dims, %s: %.0f MB of "
           "K+V, %d SMs\n", seqs, ctx, NKV, HD, kv8 ? "E4M3" : "bf16",
           bytes / 1e6, sms);
    printf("| pattern | pages | occupancy | ms | GB/s | of flat |\n");
    printf("| --- | --- | --- | ---: | ---: | ---: |\n");
    double flat_gbs = 0.0;
    {
        const size_t n16 = (size_t)(bytes / 16);
        double ms = median_ms(reps, [&] {
            read_flat<8><<<sms * 4, 512>>>(d_flat, n16, d_sink);
        });
        flat_gbs = bytes / ms / 1e6;
        printf("| flat | - | 4 x 512 thr/SM, U8 | %.3f | %.0f | 1.00 |\n",
               ms, flat_gbs);
    }
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        if (shuffled) {
            srand(12345);
            for (size_t i = n_blocks - 1; i > 0; i--)
                std::swap(order[i], order[(size_t)rand() % (i + 1)]);
        }
        CK(cudaMemcpy(d_bt, order.data(), n_blocks * sizeof(int),
                      cudaMemcpyHostToDevice));
        /* hm 0 tok-major, 1 head-major, 2 whole-token */
        for (int hm = 0; hm < 3; hm++) {
            for (int occ = 0; occ < 3; occ++) {
                /* occ 0: 512 threads, U4, as many blocks a SM as fit;
                 * occ 1: the attention's 128 threads, its blocks a SM
                 * (dynamic shared memory holds the rest: bf16 2, E4M3
                 * 4), U4; occ 2: same, U8 */
                const int thr = occ == 0 ? 512 : 128;
                const size_t smem = occ == 0 ? 0 : kv8 ? 54 * 1024
                                                       : 100 * 1024;
                const dim3 grid(NKV, seqs);
                double ms;
                auto go = [&](auto kern) {
                    if (smem)
                        CK(cudaFuncSetAttribute(
                            kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)smem));
                    return median_ms(reps, [&] {
                        kern<<<grid, thr, smem>>>(d_k, d_v, d_bt, ctx,
                                                  max_blocks, d_sink);
                    });
                };
                auto pick = [&](auto u8, auto hm_t, auto whole_t) {
                    constexpr bool HM = decltype(hm_t)::value;
                    constexpr bool WH = decltype(whole_t)::value;
                    if (kv8)
                        return decltype(u8)::value
                                   ? go(read_paged<8, HM, 8, WH>)
                                   : go(read_paged<4, HM, 8, WH>);
                    return decltype(u8)::value ? go(read_paged<8, HM, 16, WH>)
                                               : go(read_paged<4, HM, 16, WH>);
                };
                const std::true_type T;
                const std::false_type F;
                if (hm == 2)
                    ms = occ == 2 ? pick(T, F, T) : pick(F, F, T);
                else if (hm == 1)
                    ms = occ == 2 ? pick(T, T, F) : pick(F, T, F);
                else
                    ms = occ == 2 ? pick(T, F, F) : pick(F, F, F);
                const double gbs = bytes / ms / 1e6;
                printf("| %s | %s | %s | %.3f | %.0f | %.2f |\n",
                       hm == 2 ? "whole-token" : hm ? "head-major"
                                                    : "tok-major",
                       shuffled ? "shuffled" : "in order",
                       occ == 0 ? "512 thr, U4"
                       : occ == 1 ? (kv8 ? "4 x 128 thr/SM, U4"
                                         : "2 x 128 thr/SM, U4")
                                  : (kv8 ? "4 x 128 thr/SM, U8"
                                         : "2 x 128 thr/SM, U8"),
                       ms, gbs, gbs / flat_gbs);
            }
        }
    }
    CK(cudaFree(d_k));
    CK(cudaFree(d_v));
    CK(cudaFree(d_flat));
    CK(cudaFree(d_bt));
    CK(cudaFree(d_sink));
    return 0;
}
