/*
 * backend_int.h - the backend implementations known to backend.c.
 */
#ifndef BT_WORKER_BACKEND_INT_H
#define BT_WORKER_BACKEND_INT_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const backend_ops_t cpu_backend_ops;  /* cpu/cpu_backend.c */
#ifdef BATON_HAVE_CUDA
extern const backend_ops_t cuda_backend_ops; /* cuda/cuda_backend.c */
#endif

/* The implementation's state behind a backend (for an implementation's
 * own test and benchmark hooks). */
void *backend__impl(const backend_t *backend);

/* Host-memory implementation of backend_kv_copy_slots (cpu backend, and
 * any backend whose pool is host memory): k and v are the layer-0 bases
 * of the K and V arrays laid out as `lay` says. */
bt_status_t backend__kv_copy_slots_host(const kv_layout_t *lay, void *k,
                                        void *v, int n, const int *src_slots,
                                        const int *dst_slots);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_BACKEND_INT_H */
