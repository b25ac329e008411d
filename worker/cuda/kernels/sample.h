/*
 * sample.h - token selection on the GPU, so that only ids cross to the
 * host.
 */
#ifndef BT_WORKER_CUDA_KERNELS_SAMPLE_H
#define BT_WORKER_CUDA_KERNELS_SAMPLE_H

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* d_ids[r] = the lowest index of the largest value of logits row r
 * (the CPU argmax's tie rule).  d_logits (n_rows, vocab) f32. */
bt_status_t cuda_argmax(const float *d_logits, int n_rows, int vocab,
                        int *d_ids, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_SAMPLE_H */
