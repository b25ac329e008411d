/*
 * model_write.h - writes any loaded or synthesized model to disk, as a
 * Hugging Face directory or a llama2.c v0 checkpoint.
 *
 * q/k rows are permuted between the RoPE layouts as needed: a Hugging Face
 * directory always holds the half-split layout, a llama2.c file the
 * adjacent-pair layout (the permutation llama2.c's export.py and the
 * shared -hf directories use).
 */
#ifndef BT_WORKER_MODEL_MODEL_WRITE_H
#define BT_WORKER_MODEL_MODEL_WRITE_H

#include <stdbool.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes config.json, generation_config.json and model.safetensors (all
 * tensors converted to `dtype`, sorted by name, header padded to 8 bytes,
 * as the Python safetensors library writes them) into `dir`, creating it
 * if needed.  Returns BT_ERR_IO naming the file on failure. */
bt_status_t model_write_hf(const model_t *model, const char *dir,
                           model_dtype_t dtype);

/* Writes `n` tensors (names[i] with the view tensors[i]; rows 1 = a
 * vector) to the safetensors file `path`, converted to `dtype`, sorted by
 * name, header padded to 8 bytes; written to path.tmp and renamed.  For
 * files that are not whole models (EAGLE draft heads).  BT_ERR_IO names
 * the file on failure. */
bt_status_t model_st_write(const char *path, int n, const char *const *names,
                           const model_tensor_t *tensors,
                           model_dtype_t dtype);

/* What model_write_hf_fp8 writes besides the weights. */
typedef struct {
    bool per_tensor;          /* one weight scale per tensor (default:
                                 one per output channel) */
    const float *input_scale; /* (n_layers, MODEL_N_LINEAR) static GEMM
                                 input scales; NULL = dynamic per token */
    const float *kv_scale;    /* (n_layers, 2, n_kv_heads) K then V
                                 scales; NULL = no KV scales */
    bool kv_per_head;         /* write them per KV head (strategy
                                 attn_head, shape [n_kv_heads, 1, 1]);
                                 false: per layer, the largest of the
                                 heads (strategy tensor, shape [1]) */
    bool keep_f32;            /* embeddings, norms, biases and the
                                 classifier in F32 (default BF16) */
    bool kv_only;             /* the linear weights stay plain too (BF16,
                                 F32 with keep_f32): only kv_scale is
                                 written (needed), a dense checkpoint */
} model_fp8_write_t;

/* Writes `model` as a compressed-tensors "float-quantized" FP8 Hugging
 * Face checkpoint into dir: each q/k/v/o/gate/up/down weight as F8_E4M3
 * with an F32 weight_scale ([out, 1] per channel, [1] per tensor,
 * absmax / 448, round to nearest even), input_scale [1] when static, the
 * attention's k_scale / v_scale when given; embeddings, norms and the
 * classifier in BF16 (F32 with keep_f32).  config.json carries the quantization_config
 * (quant_method compressed-tensors, format float-quantized, config_groups
 * targets Linear, ignore lm_head, kv_cache_scheme).  kv_only: the
 * weights plain and a quantization_config of format dense, no config
 * group, the kv_cache_scheme alone (what llm-compressor's KV-cache-only
 * recipe writes).  BT_ERR_INVALID_ARG for kv_only without kv_scale;
 * BT_ERR_IO names the file on failure. */
bt_status_t model_write_hf_fp8(const model_t *model, const char *dir,
                               const model_fp8_write_t *q);

/* Whether the llama2.c v0 format can express the model; when it cannot,
 * returns BT_ERR_UNSUPPORTED naming the reason (q/k/v biases, rope
 * scaling, theta != 10000, eps != 1e-5, head_dim * n_heads != dim). */
bt_status_t model_llama2c_check(const model_t *model);

/* Writes a float32 llama2.c v0 checkpoint (shared classifier when the
 * model's embeddings are tied), including the legacy RoPE tables. */
bt_status_t model_write_llama2c(const model_t *model, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_MODEL_WRITE_H */
