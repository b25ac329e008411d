/*
 * kv_copy.h - KV slot copy on the device: copies the K and V rows of n
 * token slots to n other slots in every layer of a paged pool (kv.h
 * layout), with every read before every write (sources and destinations
 * may overlap in any order).  Speculative decoding compacts the accepted
 * draft tokens' KV with it (backend_kv_copy_slots).
 */
#ifndef BT_WORKER_CUDA_KERNELS_KV_COPY_H
#define BT_WORKER_CUDA_KERNELS_KV_COPY_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most slots one call may copy (every block keeps its column range of
 * all n source rows in shared memory). */
#define CUDA_KV_COPY_MAX_SLOTS 8192

/* d_k, d_v: layer-0 bases of the K and V arrays, each n_layers layers of
 * layer_bytes; a slot's row is row_bytes at slot * row_bytes inside a
 * layer.  d_src, d_dst (n) device slot indices (trusted: in range, dst
 * distinct).  Byte copy, so any dtype.  BT_ERR_INVALID_ARG for n above
 * CUDA_KV_COPY_MAX_SLOTS. */
bt_status_t cuda_kv_copy_slots(void *d_k, void *d_v, int n_layers,
                               size_t layer_bytes, size_t row_bytes,
                               const int *d_src, const int *d_dst, int n,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_KV_COPY_H */
