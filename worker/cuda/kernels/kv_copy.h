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

/* Blocks one cuda_kv_window_to_pool launch carries in its parameters
 * (4 KB of them); longer windows take several launches. */
#define CUDA_KV_WINDOW_LAUNCH_BLOCKS 960

/* A KV window (backend_kv_copy_in's layout: n_layers x K|V x n blocks of
 * block_bytes) into pool blocks blocks[0..n) of the K and V arrays
 * d_k / d_v (n_layers layers of layer_bytes each; block b of a layer at
 * b * block_bytes): one kernel launch per CUDA_KV_WINDOW_LAUNCH_BLOCKS,
 * a thread block per (block, layer, K|V), 16-byte copies, with the block
 * ids in the launch's parameters (nothing on the host to keep alive
 * while it runs).  Replaces a cudaMemcpyAsync per run of consecutive
 * blocks per layer and K|V: a fragmented pool made that thousands of
 * calls on the decode loop per hand-off.  Plain launches (no
 * programmatic dependent launch: the copy stream orders them).
 * blocks trusted (in range, distinct).  BT_ERR_INVALID_ARG when
 * block_bytes, layer_bytes or a base is not a multiple of 16. */
bt_status_t cuda_kv_window_to_pool(void *d_k, void *d_v, int n_layers,
                                   size_t layer_bytes, size_t block_bytes,
                                   const void *d_window, const int *blocks,
                                   int n, cudaStream_t stream);

/* FP8 KV widened for the bf16 prefill kernels: page p (0..n_pages) of
 * d_wk / d_wv (bf16, block_elems elements a page) gets the E4M3 codes of
 * pool block d_pages[p] of one layer's d_k8 / d_v8 (block_elems codes a
 * block) as bf16 values -- exact (every E4M3 value is a bf16), so the
 * scales stay outside, as with the codes (attn_decode.h kv_widened).  A
 * thread block per (page, K|V), 8 codes a step; programmatic dependent
 * launch (the pages are written by the RoPE/KV kernel just before).
 * BT_ERR_INVALID_ARG when block_elems is not a multiple of 8 or a base
 * is not 16-byte aligned. */
bt_status_t cuda_kv8_widen_pages(const void *d_k8, const void *d_v8,
                                 size_t block_elems, const int *d_pages,
                                 int n_pages, void *d_wk, void *d_wv,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_KV_COPY_H */
