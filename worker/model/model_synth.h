/*
 * model_synth.h - models with seeded random weights, built in memory.
 *
 * Lets every layer of the system (backends, engine, cluster, benchmarks)
 * run real shapes such as llama3-8b without downloading a checkpoint.
 * Weights are roughly normal with std 0.02 (norm weights are 1.0), filled
 * by several threads from a counter-based PRNG so the result depends only
 * on (shape, seed, dtype), never on the thread count.
 */
#ifndef BT_WORKER_MODEL_MODEL_SYNTH_H
#define BT_WORKER_MODEL_MODEL_SYNTH_H

#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pass as `dtype` to pick the shape's default (f32 for tiny shapes, bf16
 * for real-size ones). */
#define MODEL_SYNTH_DTYPE_DEFAULT (-1)

/* Number of named shapes and the i-th name / one-line description, for
 * help texts ("tiny", "llama3-8b", ...). */
int model_synth_shape_count(void);
const char *model_synth_shape_name(int i);
const char *model_synth_shape_desc(int i);

/* The config and architecture name of a named shape; BT_ERR_NOT_FOUND
 * (listing the known names) when unknown. */
bt_status_t model_synth_shape_config(const char *shape, model_config_t *cfg_p,
                                     const char **arch_p);

/* Builds a model of a named shape.  dtype is a model_dtype_t or
 * MODEL_SYNTH_DTYPE_DEFAULT.  Returns BT_ERR_NOT_FOUND for an unknown
 * shape, BT_ERR_NO_MEMORY when the weights do not fit in RAM. */
bt_status_t model_synth_create(const char *shape, uint64_t seed, int dtype,
                               model_t **model_p);

/* Builds a model with the shape of a Hugging Face config.json (a file or
 * its directory; generation_config.json next to it is honoured). */
bt_status_t model_synth_from_config(const char *config_path, uint64_t seed,
                                    int dtype, model_t **model_p);

/* Builds a model from an explicit config (validated first); `arch` is the
 * architecture name recorded in the model. */
bt_status_t model_synth_from_cfg(const model_config_t *cfg, const char *arch,
                                 uint64_t seed, model_dtype_t dtype,
                                 model_t **model_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_MODEL_SYNTH_H */
