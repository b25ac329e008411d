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

#include <stdbool.h>
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

/* Lazy variant of model_synth_from_cfg: tensor views without host data
 * (see MODEL_LOAD_SYNTH_LAZY in model.h); costs no memory and no time. */
bt_status_t model_synth_from_cfg_lazy(const model_config_t *cfg,
                                      const char *arch, uint64_t seed,
                                      model_dtype_t dtype, model_t **model_p);

/* ---- the generator, element by element ----
 * Element e of synthesized tensor `id` (its index in the layout order:
 * embedding, then per layer attn_norm, wq, wk, wv, [bq, bk, bv], wo,
 * ffn_norm, w_gate, w_down, w_up, then final_norm, classifier) is
 *   chunk c = e / 65536, offset o = e % 65536,
 *   s = mix(seed ^ mix((id << 32) ^ c)) + (o + 1) * 0x9e3779b97f4a7c15,
 *   r = mix'(s) (splitmix64 finaliser),
 *   value = (sum of r's four 16-bit fields - 2 * 65535) * 0.02 * sqrt(3)
 *           / 65536   (float32 arithmetic)
 * then rounded to the model's dtype; norm weights are 1.0.  This is what
 * the host fill writes, so a device (kernels/synth_fill.cu) or a shard
 * can generate exactly the bytes the host would have. */
#define MODEL_SYNTH_CHUNK 65536
#define MODEL_SYNTH_GOLDEN 0x9e3779b97f4a7c15ull

typedef struct {
    uint64_t seed;  /* the model's seed */
    int id;         /* tensor index in the layout order above */
    bool ones;      /* norm weight: every element 1.0 */
} model_synth_src_t;

/* The float32 value of element `index` (before rounding to the dtype). */
float model_synth_value(uint64_t seed, int id, int64_t index);

/* Where tensor view `t` (a pointer returned by the model's accessors:
 * model_tok_embedding, model_layer(...)->wq, model_classifier, ...) of a
 * synthesized model comes from.  False for other models or pointers. */
bool model_synth_tensor(const model_t *model, const model_tensor_t *t,
                        model_synth_src_t *src_p);

/* Elements [offset, offset + n) of a synthesized tensor of `dtype` as
 * float32, equal to model_tensor_to_f32 of the host-filled tensor. */
void model_synth_to_f32(const model_synth_src_t *src, model_dtype_t dtype,
                        int64_t offset, int64_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_MODEL_SYNTH_H */
