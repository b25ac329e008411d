/*
 * nccl_dl.h - NCCL loaded at run time (dlopen), for tensor parallelism.
 *
 * baton does not link NCCL and needs none of its headers: the few entry
 * points it uses are declared here with NCCL's stable C ABI and resolved
 * from libnccl.so.2 (or $BT_NCCL_LIB) when a backend with tp > 1 is
 * created.  A CUDA build therefore links and runs where NCCL is absent;
 * only --tp > 1 (with the NCCL all-reduce) reports that it is missing.
 * cuda_nccl_open() forces NCCL_NVLS_ENABLE=0 (NVLink multicast off, as
 * the device machines require) before any communicator exists.
 */
#ifndef BT_WORKER_CUDA_NCCL_DL_H
#define BT_WORKER_CUDA_NCCL_DL_H

#include <stddef.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* ncclUniqueId: what rank 0 creates and every rank needs to join (in one
 * process it is passed in memory; across processes it is 128 opaque
 * bytes to ship, e.g. in a control message). */
typedef struct {
    char internal[CUDA_NCCL_ID_BYTES];
} cuda_nccl_id_t;

typedef struct cuda_nccl_s cuda_nccl_t;

/* Loads the library (once per handle).  BT_ERR_UNSUPPORTED with a message
 * naming the library and how to provide it when it cannot be loaded or
 * lacks a symbol. */
bt_status_t cuda_nccl_open(cuda_nccl_t **nccl_p);
void cuda_nccl_close(cuda_nccl_t **nccl_p);

/* NCCL's version code (e.g. 22703 for 2.27.3). */
int cuda_nccl_version(const cuda_nccl_t *nccl);

bt_status_t cuda_nccl_unique_id(cuda_nccl_t *nccl, cuda_nccl_id_t *id);

/* Joins communicator `id` as `rank` of `n_ranks` on the calling thread's
 * current CUDA device; blocks until every rank has joined. */
bt_status_t cuda_nccl_comm_init(cuda_nccl_t *nccl, void **comm_p,
                                int n_ranks, const cuda_nccl_id_t *id,
                                int rank);
void cuda_nccl_comm_destroy(cuda_nccl_t *nccl, void **comm_p);

/* In-place sum of `count` floats over every rank, enqueued on `stream`
 * (a cudaStream_t; capturable in a CUDA graph). */
bt_status_t cuda_nccl_allreduce_f32(cuda_nccl_t *nccl, void *comm,
                                    float *d_buf, size_t count,
                                    void *stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_NCCL_DL_H */
