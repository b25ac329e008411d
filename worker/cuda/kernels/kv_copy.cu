/*
 * kv_copy.cu - KV copies on the device (kv_copy.h): slots within the
 * pool, a CUDA IPC window into pool blocks, FP8 pages widened to bf16.
 *
 * Slot copy:
 * Grid (column chunks, 2 * n_layers): one block owns one column range of
 * one layer's K or V for ALL n slot pairs.  It loads the n source pieces
 * into shared memory, syncs, then stores them to the destinations, so
 * inside its range every read precedes every write; ranges of different
 * blocks are disjoint, so the whole copy reads before it writes.  Copies
 * in 16-byte units when rows and bases allow, else 4 or 2 bytes.
 * Test: build-cuda/gpu/test_kv_copy.
 */
#include "kv_copy.h"

#include <string.h>

#include "bt_util.h"
#include "kern_common.cuh"
#include "kv8.cuh"

#define KV_COPY_SMEM (32 * 1024) /* shared bytes per block, at most */
#define KV_COPY_THREADS 256

template <typename U>
static __global__ void kv_copy_kernel(char *k, char *v, size_t layer_bytes,
                                      int row_units, int chunk,
                                      const int *src, const int *dst, int n)
{
    extern __shared__ __align__(16) unsigned char kv_copy_smem[];
    U *buf = reinterpret_cast<U *>(kv_copy_smem);
    int layer = blockIdx.y >> 1;
    char *base = ((blockIdx.y & 1) ? v : k) + (size_t)layer * layer_bytes;
    U *arr = reinterpret_cast<U *>(base);
    int c0 = blockIdx.x * chunk;
    int w = min(chunk, row_units - c0);
    int total = n * w;

    kern_pdl_trigger();
    kern_pdl_wait();
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int i = e / w, c = e % w;
        buf[e] = arr[(size_t)src[i] * row_units + c0 + c];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int i = e / w, c = e % w;
        if (src[i] != dst[i])
            arr[(size_t)dst[i] * row_units + c0 + c] = buf[e];
    }
}

template <typename U>
static bt_status_t kv_copy_launch(void *d_k, void *d_v, int n_layers,
                                  size_t layer_bytes, size_t row_bytes,
                                  const int *d_src, const int *d_dst, int n,
                                  cudaStream_t stream)
{
    int row_units = (int)(row_bytes / sizeof(U));
    int chunk = (int)(KV_COPY_SMEM / ((size_t)n * sizeof(U)));
    dim3 grid;

    chunk = BT_MAX(1, BT_MIN(chunk, row_units));
    grid = dim3((unsigned)BT_DIV_UP(row_units, chunk), 2u * n_layers);
    kern_launch(kv_copy_kernel<U>, grid, dim3(KV_COPY_THREADS),
                (size_t)n * chunk * sizeof(U), stream, (char *)d_k,
                (char *)d_v, layer_bytes, row_units, chunk, d_src, d_dst, n);
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_kv_copy_slots(void *d_k, void *d_v, int n_layers,
                               size_t layer_bytes, size_t row_bytes,
                               const int *d_src, const int *d_dst, int n,
                               cudaStream_t stream)
{
    uintptr_t align = (uintptr_t)d_k | (uintptr_t)d_v | layer_bytes |
                      row_bytes;

    BT_ASSERT(n >= 0 && n_layers > 0 && row_bytes > 0 &&
              row_bytes % 2 == 0);
    if (n > CUDA_KV_COPY_MAX_SLOTS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "KV slot copy of %d slots (at most %d)", n,
                        CUDA_KV_COPY_MAX_SLOTS);
    if (n == 0)
        return BT_OK;
    /* 16-byte units need n * 16 bytes of shared memory per column */
    if (align % 16 == 0 && (size_t)n * 16 <= KV_COPY_SMEM)
        return kv_copy_launch<uint4>(d_k, d_v, n_layers, layer_bytes,
                                     row_bytes, d_src, d_dst, n, stream);
    if (align % 4 == 0)
        return kv_copy_launch<uint32_t>(d_k, d_v, n_layers, layer_bytes,
                                        row_bytes, d_src, d_dst, n, stream);
    return kv_copy_launch<uint16_t>(d_k, d_v, n_layers, layer_bytes,
                                    row_bytes, d_src, d_dst, n, stream);
}

/* cuda_kv_window_to_pool's launch: its blocks ride in the parameters. */
typedef struct {
    char *k, *v;
    const char *win;
    size_t layer_bytes, block_bytes;
    int n_win;  /* the window's blocks (its row stride) */
    int i0;     /* this launch's first window block */
    int blocks[CUDA_KV_WINDOW_LAUNCH_BLOCKS];
} kv_window_args_t;

/* Grid (blocks of this launch, 2 * n_layers): one pool block of one
 * layer's K or V. */
static __global__ void __launch_bounds__(KV_COPY_THREADS)
kv_window_kernel(const kv_window_args_t a)
{
    const int i = blockIdx.x, l = blockIdx.y >> 1, kv = blockIdx.y & 1;
    const uint4 *src = reinterpret_cast<const uint4 *>(
        a.win + ((2 * (size_t)l + kv) * a.n_win + a.i0 + i) * a.block_bytes);
    uint4 *dst = reinterpret_cast<uint4 *>(
        (kv ? a.v : a.k) + (size_t)l * a.layer_bytes +
        (size_t)a.blocks[i] * a.block_bytes);
    const int units = (int)(a.block_bytes / 16);

    for (int e = threadIdx.x; e < units; e += blockDim.x)
        dst[e] = src[e];
}

bt_status_t cuda_kv_window_to_pool(void *d_k, void *d_v, int n_layers,
                                   size_t layer_bytes, size_t block_bytes,
                                   const void *d_window, const int *blocks,
                                   int n, cudaStream_t stream)
{
    static_assert(sizeof(kv_window_args_t) <= 4096,
                  "kernel parameters of at most 4 KB");
    kv_window_args_t a;

    BT_ASSERT(n >= 1 && n_layers > 0);
    if ((((uintptr_t)d_k | (uintptr_t)d_v | (uintptr_t)d_window |
          layer_bytes | block_bytes) & 15) != 0 || block_bytes == 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA", "KV window copy of "
                        "%zu-byte blocks: not 16-byte aligned", block_bytes);
    a.k = (char *)d_k;
    a.v = (char *)d_v;
    a.win = (const char *)d_window;
    a.layer_bytes = layer_bytes;
    a.block_bytes = block_bytes;
    a.n_win = n;
    for (a.i0 = 0; a.i0 < n; a.i0 += CUDA_KV_WINDOW_LAUNCH_BLOCKS) {
        const int m = BT_MIN(n - a.i0, CUDA_KV_WINDOW_LAUNCH_BLOCKS);
        memcpy(a.blocks, blocks + a.i0, (size_t)m * sizeof(int));
        kv_window_kernel<<<dim3((unsigned)m, 2u * (unsigned)n_layers),
                           KV_COPY_THREADS, 0, stream>>>(a);
        bt_status_t status = BT_CUDA_LAUNCH_STATUS();
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

/* Grid (n_pages, 2): page blockIdx.x of K (y 0) or V (y 1). */
static __global__ void __launch_bounds__(KV_COPY_THREADS)
kv8_widen_kernel(const uint8_t *k8, const uint8_t *v8, size_t block_elems,
                 const int *pages, bf16_t *wk, bf16_t *wv)
{
    const uint8_t *src = blockIdx.y ? v8 : k8;
    bf16_t *dst = blockIdx.y ? wv : wk;
    const size_t pg = blockIdx.x;

    kern_pdl_trigger();
    kern_pdl_wait(); /* the codes of the new keys: the RoPE/KV kernel's */
    src += (size_t)pages[pg] * block_elems;
    dst += pg * block_elems;
    for (size_t e = (size_t)threadIdx.x * 8; e < block_elems;
         e += (size_t)KV_COPY_THREADS * 8)
        *reinterpret_cast<uint4 *>(dst + e) =
            kv8_to_bf16x8(*reinterpret_cast<const uint2 *>(src + e));
}

bt_status_t cuda_kv8_widen_pages(const void *d_k8, const void *d_v8,
                                 size_t block_elems, const int *d_pages,
                                 int n_pages, void *d_wk, void *d_wv,
                                 cudaStream_t stream)
{
    if (n_pages <= 0)
        return BT_OK;
    if (block_elems % 8 != 0 ||
        (((uintptr_t)d_k8 | (uintptr_t)d_v8 | (uintptr_t)d_wk |
          (uintptr_t)d_wv) & 15) != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA", "FP8 KV widening of "
                        "%zu-element blocks: not aligned", block_elems);
    kern_launch(kv8_widen_kernel, dim3((unsigned)n_pages, 2u),
                dim3(KV_COPY_THREADS), 0, stream, (const uint8_t *)d_k8,
                (const uint8_t *)d_v8, block_elems, d_pages, (bf16_t *)d_wk,
                (bf16_t *)d_wv);
    return BT_CUDA_LAUNCH_STATUS();
}
