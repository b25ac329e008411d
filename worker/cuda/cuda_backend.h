/*
 * cuda_backend.h - what the CUDA backend shares with its tests beyond
 * backend.h: the RoPE frequency table (so the kernel tests and the
 * backend scale frequencies the same way).
 */
#ifndef BT_WORKER_CUDA_CUDA_BACKEND_H
#define BT_WORKER_CUDA_CUDA_BACKEND_H

#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = theta^(-2i/head_dim) for i < head_dim/2, with the config's
 * LINEAR (divided by factor) or LLAMA3 (frequency-dependent) scaling. */
void cuda__rope_inv_freq(const model_config_t *cfg, float *out);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_BACKEND_H */
