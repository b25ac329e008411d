/*
 * embed.h - embedding gather: out row i = float(table[ids[i]]).
 * Also gathers f32 hidden rows (table = the residual stream).
 */
#ifndef BT_WORKER_CUDA_KERNELS_EMBED_H
#define BT_WORKER_CUDA_KERNELS_EMBED_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* d_table (rows, dim) of table_dt, d_ids (n) row indices (trusted),
 * d_out (n, dim) float32. */
bt_status_t cuda_embed(const void *d_table, cuda_dtype_t table_dt,
                       const int *d_ids, int n, int dim, float *d_out,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_EMBED_H */
