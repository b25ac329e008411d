/*
 * cuda_util.c - CUDA error conversion and tracked device allocation for
 * the CUDA backend.
 */
#include "cuda_int.h"

#include <pthread.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"

/* Live device allocations and their sizes (a few hundred at most: the
 * weights, the KV pool and the activation buffers). */
typedef struct {
    void *ptr;
    size_t size;
} cuda_dev_block_t;

static pthread_mutex_t cuda_dev_lock = PTHREAD_MUTEX_INITIALIZER;
static cuda_dev_block_t *cuda_dev_blocks; /* (cuda_dev_cap) */
static size_t cuda_dev_n;
static size_t cuda_dev_cap;
static size_t cuda_dev_live; /* bytes held */

__thread int cuda__pdl_late;

bt_status_t cuda__check(cudaError_t err, const char *expr, const char *file,
                        int line, const char *func)
{
    if (err == cudaSuccess)
        return BT_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return bt_error_record(BT_ERR_CUDA, "CUDA", file, line, func,
                           "%s failed: %s (%s)", expr,
                           cudaGetErrorString(err), cudaGetErrorName(err));
}

bt_status_t cuda__dev_malloc(void **d_p, size_t size, const char *name)
{
    void *d = NULL;
    cudaError_t err;
    bt_status_t status = BT_OK;

    BT_ASSERT(*d_p == NULL);
    err = cudaMalloc(&d, size ? size : 1);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return BT_ERROR(BT_ERR_CUDA, "CUDA",
                        "cudaMalloc of %zu MiB for %s failed: %s",
                        size >> 20, name, cudaGetErrorString(err));
    }
    pthread_mutex_lock(&cuda_dev_lock);
    if (cuda_dev_n == cuda_dev_cap) {
        size_t cap = cuda_dev_cap ? 2 * cuda_dev_cap : 256;
        cuda_dev_block_t *nb = bt_realloc(cuda_dev_blocks, cap * sizeof(*nb),
                                          "cuda_dev_blocks");
        if (nb == NULL) {
            status = BT_ERR_NO_MEMORY;
        } else {
            cuda_dev_blocks = nb;
            cuda_dev_cap = cap;
        }
    }
    if (status == BT_OK) {
        cuda_dev_blocks[cuda_dev_n].ptr = d;
        cuda_dev_blocks[cuda_dev_n].size = size;
        cuda_dev_n++;
        cuda_dev_live += size;
    }
    pthread_mutex_unlock(&cuda_dev_lock);
    if (status != BT_OK) {
        cudaFree(d);
        return status;
    }
    *d_p = d;
    return BT_OK;
}

void cuda__dev_free(void **d_p)
{
    if (*d_p == NULL)
        return;
    pthread_mutex_lock(&cuda_dev_lock);
    for (size_t i = 0; i < cuda_dev_n; i++) {
        if (cuda_dev_blocks[i].ptr == *d_p) {
            cuda_dev_live -= cuda_dev_blocks[i].size;
            cuda_dev_blocks[i] = cuda_dev_blocks[--cuda_dev_n];
            break;
        }
    }
    if (cuda_dev_n == 0) {
        bt_free(cuda_dev_blocks);
        cuda_dev_blocks = NULL;
        cuda_dev_cap = 0;
    }
    pthread_mutex_unlock(&cuda_dev_lock);
    (void)cudaFree(*d_p);
    *d_p = NULL;
}

size_t cuda__dev_live_bytes(void)
{
    size_t n;

    pthread_mutex_lock(&cuda_dev_lock);
    n = cuda_dev_live;
    pthread_mutex_unlock(&cuda_dev_lock);
    return n;
}
