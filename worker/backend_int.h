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

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_BACKEND_INT_H */
