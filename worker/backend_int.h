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

/* ---- KV pool sizing (backend_config_t.n_kv_blocks == 0) ---- */

/* KV blocks for a budget of `budget` bytes at `token_bytes` per token:
 * at most cfg->kv_auto_contexts (or `default_contexts` when that is 0;
 * 0 too: no cap) full contexts of mc->max_seq_len tokens, and at most
 * BACKEND_KV_MAX_TOKENS tokens.  `what` says where the budget came from
 * (for the error).  BT_ERR_NO_MEMORY with a message when the budget
 * holds less than one block. */
#define BACKEND_KV_MAX_TOKENS (1 << 28)
bt_status_t backend__kv_blocks_auto(const backend_config_t *cfg,
                                    const model_config_t *mc,
                                    size_t token_bytes, size_t budget,
                                    int default_contexts, const char *what,
                                    int *n_blocks_p);

/* Auto max_seqs: min(cap, cfg->max_batch_tokens, n_kv_blocks) and at
 * least 1 (n_kv_blocks 0: not known yet, not a limit). */
int backend__max_seqs_auto(const backend_config_t *cfg, int n_kv_blocks,
                           int cap);

/* MemAvailable of /proc/meminfo in bytes, 0 when unknown. */
size_t backend__host_mem_available(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_BACKEND_INT_H */
