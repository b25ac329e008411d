/*
 * model.h - a Llama-family transformer: its configuration and a read-only
 * view of its weights, loaded from a llama2.c v0 checkpoint or a Hugging
 * Face directory (config.json + safetensors).
 *
 * Weights are mmap'ed and left in the file's dtype (F32/F16/BF16); each
 * backend converts what it needs when it is created (the CPU backend to
 * float32, the CUDA backend to bf16 on the device).  Every tensor's shape
 * and byte range is validated against the file at load time, so backends
 * may trust them.
 *
 * Conventions: a matrix [out, in] maps an input of length `in` to an output
 * of length `out` (row-major, one output per row).  q/k rows follow the
 * RoPE layout named in the config: MODEL_ROPE_ADJACENT rotates pairs
 * (2i, 2i+1) of each head (llama2.c), MODEL_ROPE_HALF rotates (i, i+hd/2)
 * (Hugging Face).
 */
#ifndef BT_WORKER_MODEL_MODEL_H
#define BT_WORKER_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAX_EOS 8

typedef enum {
    MODEL_DTYPE_F32 = 0,
    MODEL_DTYPE_F16,
    MODEL_DTYPE_BF16
} model_dtype_t;

typedef enum {
    MODEL_ROPE_ADJACENT = 0, /* llama2.c: rotate (2i, 2i+1) */
    MODEL_ROPE_HALF          /* Hugging Face: rotate (i, i + head_dim/2) */
} model_rope_layout_t;

typedef enum {
    MODEL_ROPE_SCALING_NONE = 0,
    MODEL_ROPE_SCALING_LINEAR,  /* positions divided by factor */
    MODEL_ROPE_SCALING_LLAMA3   /* Llama 3.1 frequency-dependent scaling */
} model_rope_scaling_t;

typedef enum {
    MODEL_FORMAT_LLAMA2C = 0,
    MODEL_FORMAT_HF,
    MODEL_FORMAT_SYNTH       /* seeded random weights built in memory */
} model_format_t;

typedef struct {
    int dim;          /* hidden size */
    int hidden_dim;   /* feed-forward (intermediate) size */
    int n_layers;
    int n_heads;      /* query heads */
    int n_kv_heads;   /* key/value heads (GQA when < n_heads) */
    int head_dim;     /* usually dim / n_heads */
    int vocab_size;
    int max_seq_len;  /* context length the model was trained for */
    float rope_theta;
    float rms_eps;
    model_rope_layout_t rope_layout;
    model_rope_scaling_t rope_scaling;
    float rope_factor;            /* LINEAR and LLAMA3 */
    float rope_low_freq_factor;   /* LLAMA3 */
    float rope_high_freq_factor;  /* LLAMA3 */
    int rope_orig_max_pos;        /* LLAMA3: original_max_position_embeddings */
    bool tied_embeddings; /* classifier shares the token embedding table */
    bool qkv_bias;        /* Qwen2-style q/k/v projection biases */
    int bos_id;           /* -1 when none */
    int eos_ids[MODEL_MAX_EOS]; /* default stop ids */
    int n_eos;
} model_config_t;

/* A read-only view of one weight tensor inside the mapped file. */
typedef struct {
    const void *data;   /* first element, aligned to its element size;
                           NULL when absent (optional bias) */
    model_dtype_t dtype;
    int64_t rows;       /* 1 for vectors */
    int64_t cols;
} model_tensor_t;

/* The linear layers of a transformer layer, in checkpoint order. */
typedef enum {
    MODEL_LIN_Q = 0,
    MODEL_LIN_K,
    MODEL_LIN_V,
    MODEL_LIN_O,
    MODEL_LIN_GATE,
    MODEL_LIN_UP,
    MODEL_LIN_DOWN,
    MODEL_N_LINEAR
} model_linear_t;

/* The FP8 (OCP E4M3, common/bt_fp8.h) form of one linear weight as an FP8
 * checkpoint stores it: weight = e4m3(codes) * w_scale (per output row or
 * per tensor), and the GEMM input is quantized as x / input_scale (static)
 * or per token (dynamic).  The layer's model_tensor_t holds the same
 * weight dequantized to F32, so every consumer that knows nothing of FP8
 * runs the checkpoint as a plain model; the CPU backend's fp8 precision
 * uses the codes and scales themselves. */
typedef struct {
    const uint8_t *codes;  /* (rows, cols) E4M3 codes; NULL: not FP8 */
    const float *w_scale;  /* (n_w_scale) */
    int64_t n_w_scale;     /* 1 (per tensor) or rows (per output channel) */
    float input_scale;     /* static per-tensor activation scale, 0 =
                              dynamic per-token */
} model_fp8_t;

/* How a model's weights are quantized (model_quant()). */
typedef struct {
    bool fp8;              /* linear weights are FP8 E4M3 */
    bool per_channel;      /* weight scales per output row (else tensor) */
    bool static_act;       /* static input scales (else dynamic) */
    bool kv_scales;        /* k_scale / v_scale present */
    char scheme[48];       /* "compressed-tensors", "modelopt" or "" */
} model_quant_t;

typedef struct {
    model_tensor_t attn_norm; /* (dim) */
    model_tensor_t wq;        /* (n_heads*head_dim, dim) */
    model_tensor_t wk;        /* (n_kv_heads*head_dim, dim) */
    model_tensor_t wv;        /* (n_kv_heads*head_dim, dim) */
    model_tensor_t bq;        /* (n_heads*head_dim) or absent */
    model_tensor_t bk;        /* (n_kv_heads*head_dim) or absent */
    model_tensor_t bv;        /* (n_kv_heads*head_dim) or absent */
    model_tensor_t wo;        /* (dim, n_heads*head_dim) */
    model_tensor_t ffn_norm;  /* (dim) */
    model_tensor_t w_gate;    /* (hidden_dim, dim)   llama2.c w1 */
    model_tensor_t w_down;    /* (dim, hidden_dim)   llama2.c w2 */
    model_tensor_t w_up;      /* (hidden_dim, dim)   llama2.c w3 */
    /* FP8 checkpoints only (see model_fp8_t); absent (codes NULL)
     * otherwise.  Indexed by model_linear_t. */
    model_fp8_t fp8[MODEL_N_LINEAR];
    const float *k_scale;     /* (n_kv_heads) KV-cache scales or NULL */
    const float *v_scale;     /* (n_kv_heads) or NULL */
} model_layer_t;

/* The linear weight `which` of a layer. */
const model_tensor_t *model_layer_linear(const model_layer_t *layer,
                                         model_linear_t which);

/* FP8 checkpoints: the static input scale of a GEMM fed by linears
 * [first, first + n) of a layer (one input, so one scale: the largest,
 * as vLLM fuses q/k/v); 0 (dynamic per token) unless every part has one.
 * The cpu reference and the cuda backend both take it from here. */
float model_fp8_in_scale(const model_layer_t *layer, int first, int n);


typedef struct model_s model_t;

/* Loads a model.  `path` is a llama2.c .bin file or a Hugging Face
 * directory (or its config.json).  The special form "synth:NAME" or
 * "synth:NAME:SEED" builds seeded random weights of a named shape in
 * memory (see model_synth.h) without touching the disk.
 * Returns BT_ERR_IO, BT_ERR_FORMAT (the message names the tensor or field),
 * BT_ERR_UNSUPPORTED (unknown architecture or dtype) or BT_OK. */
bt_status_t model_load(const char *path, model_t **model_p);

/* model_load flags. */
#define MODEL_LOAD_SYNTH_LAZY 1u /* "synth:" models: shapes only, no host
                                    weights (see model_is_lazy) */
#define MODEL_LOAD_SYNTH_LAZY_LARGE 2u /* the same for synth models of at
                                    least 1 GiB of weights; smaller ones
                                    are filled on the host as usual */

/* model_load with flags (0 = model_load).  With MODEL_LOAD_SYNTH_LAZY a
 * synthesized model gets its tensor views (shapes, dtypes) but no host
 * memory: every view's data is NULL and the values are generated where
 * they are needed (model_synth_tensor(), model_slice_to_f32(); the CUDA
 * backend fills them on the device).  For models too large for host RAM
 * (synth:llama3-70b) and fast start-up; code that reads t->data directly
 * must not be given a lazy model.  Other paths ignore the flag. */
bt_status_t model_load_ex(const char *path, unsigned flags,
                          model_t **model_p);

/* True when the model's weights are not in host memory (lazy synth). */
bool model_is_lazy(const model_t *model);

/* Unmaps and frees; NULL-safe; sets *model_p to NULL. */
void model_destroy(model_t **model_p);

const model_config_t *model_config(const model_t *model);
model_format_t model_format(const model_t *model);
const model_tensor_t *model_tok_embedding(const model_t *model); /* (vocab, dim) */
const model_layer_t *model_layer(const model_t *model, int layer);
const model_tensor_t *model_final_norm(const model_t *model);    /* (dim) */
const model_tensor_t *model_classifier(const model_t *model);    /* (vocab, dim) */
/* The model's quantization (all false for unquantized models). */
const model_quant_t *model_quant(const model_t *model);

/* Parameter count and bytes of all weights as stored. */
int64_t model_param_count(const model_t *model);
int64_t model_weight_bytes(const model_t *model);

/* Element size of a dtype and its name ("F32", "BF16"...). */
size_t model_dtype_size(model_dtype_t dtype);
const char *model_dtype_name(model_dtype_t dtype);

/* Converts `n` elements starting at element `offset` of `t` to float32. */
void model_tensor_to_f32(const model_tensor_t *t, int64_t offset, int64_t n,
                         float *out);

/* bf16/f16 <-> f32 helpers shared by loaders, writers and backends. */
float model_bf16_to_f32(uint16_t h);
uint16_t model_f32_to_bf16(float f); /* round to nearest even */
float model_f16_to_f32(uint16_t h);
uint16_t model_f32_to_f16(float f);

/* The architecture name: "llama2c" for v0 checkpoints, the config.json
 * architecture ("LlamaForCausalLM", ...) for Hugging Face directories and
 * synthesized models. */
const char *model_architecture(const model_t *model);

/* Calls fn on every present tensor, in layer order, with its Hugging Face
 * name ("model.layers.3.self_attn.q_proj.weight"); the classifier is
 * skipped when tied.  Stops at and returns the first non-OK status. */
typedef bt_status_t (*model_tensor_fn)(const char *name,
                                       const model_tensor_t *t, void *arg);
bt_status_t model_for_each_tensor(const model_t *model, model_tensor_fn fn,
                                  void *arg);

/* Name of a format ("llama2c", "hf", "synth"). */
const char *model_format_name(model_format_t format);

/* Parses a llama2.c v0 checkpoint held in memory (`size` bytes, the whole
 * file): validates the header and that `size` is exactly what it implies.
 * Fills *cfg_p and *shared_classifier_p (true when the classifier is the
 * embedding table).  Used by the loader and the fuzz target. */
bt_status_t model_llama2c_parse(const void *data, size_t size,
                                model_config_t *cfg_p,
                                bool *shared_classifier_p);

/* Parses a Hugging Face config.json (and optionally generation_config.json,
 * gen_json may be NULL) held in memory into *cfg_p, and copies the
 * architecture name into arch (arch_len bytes, may be NULL).  Returns
 * BT_ERR_FORMAT naming the bad field, BT_ERR_UNSUPPORTED naming an unknown
 * architecture or rope type. */
bt_status_t model_hf_config_parse(const char *json, size_t len,
                                  const char *gen_json, size_t gen_len,
                                  model_config_t *cfg_p, char *arch,
                                  size_t arch_len);

/* Parses the quantization of a Hugging Face checkpoint: config.json's
 * quantization_config (json, len) and, when given, ModelOpt's
 * hf_quant_config.json (hfq, hfq_len; may be NULL).  Accepted:
 * compressed-tensors "float-quantized" FP8 (8-bit float weights, strategy
 * channel or tensor, static per-tensor or dynamic per-token input
 * activations, optional kv_cache_scheme), a compressed-tensors model
 * with no config group and an FP8 kv_cache_scheme (weights as stored,
 * kv_scales only: fp8 false) and ModelOpt quant_algo FP8.
 * No quantization: *q_p zeroed, BT_OK.  Anything else: BT_ERR_UNSUPPORTED
 * naming what was found and what is supported; BT_ERR_FORMAT for
 * malformed JSON. */
bt_status_t model_hf_quant_parse(const char *json, size_t len,
                                 const char *hfq, size_t hfq_len,
                                 model_quant_t *q_p);

/* Checks a config for internal consistency (positive sizes, heads divide,
 * etc).  Loaders call it; exposed for tests and synth. */
bt_status_t model_config_validate(const model_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_MODEL_H */
