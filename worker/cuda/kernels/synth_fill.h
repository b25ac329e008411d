/*
 * synth_fill.h - synthesized weights generated on the device: each element
 * from (seed, tensor id, its index in the whole tensor) with the host
 * generator's arithmetic (model_synth.h), so a rank fills exactly its
 * shard and the bytes equal the host fill, whatever the sharding.
 */
#ifndef BT_WORKER_CUDA_KERNELS_SYNTH_FILL_H
#define BT_WORKER_CUDA_KERNELS_SYNTH_FILL_H

#include <stdbool.h>
#include <stdint.h>

#include "../cuda_int.h"
#include "convert.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t seed;          /* the model's seed */
    int id;                 /* tensor index in the synth layout */
    bool ones;              /* norm weight: 1.0 everywhere */
    cuda_src_dtype_t dtype; /* the model's dtype (values are rounded to it) */
    int64_t full_cols;      /* columns of the whole tensor */
    int64_t row0, col0;     /* first element of the slice */
    int64_t rows, cols;     /* slice shape */
} cuda_synth_args_t;

/* d_dst (rows, cols) in dst_dt, row-major, contiguous. */
bt_status_t cuda_synth_fill(const cuda_synth_args_t *args, void *d_dst,
                            cuda_dtype_t dst_dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_SYNTH_FILL_H */
