/*
 * model_int.h - the model object's body and the helpers shared by the
 * loaders (llama2.c, Hugging Face), the synthesizer and the writers.
 * Private to worker/model/.
 */
#ifndef BT_WORKER_MODEL_MODEL_INT_H
#define BT_WORKER_MODEL_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* Sanity bounds on header values: large enough for any real Llama-family
 * model, small enough that every size product fits comfortably in int64. */
#define MODEL_MAX_DIM      (1 << 17)  /* dim, hidden_dim */
#define MODEL_MAX_HEADS    1024
#define MODEL_MAX_HEAD_DIM 1024
#define MODEL_MAX_LAYERS   1024
#define MODEL_MAX_VOCAB    (1 << 22)
#define MODEL_MAX_SEQ      (1 << 24)

/* One read-only file mapping owned by a model. */
typedef struct {
    void *addr; /* start of the mapping, NULL when the file was empty */
    size_t len; /* bytes mapped */
} model_map_t;

struct model_s {
    model_config_t cfg;          /* validated configuration */
    model_format_t format;       /* where the weights came from */
    char arch[64];               /* "llama2c", "LlamaForCausalLM", ... */
    model_tensor_t tok_embedding; /* (vocab, dim) */
    model_tensor_t final_norm;    /* (dim) */
    model_tensor_t classifier;    /* (vocab, dim); aliases tok_embedding
                                     when tied */
    model_layer_t *layers;        /* (n_layers) */
    model_map_t *maps;            /* (n_maps) file mappings */
    int n_maps;                   /* entries used in maps */
    void *arena;                  /* synthesized weights (bt_malloc_aligned),
                                     NULL for loaded files */
    size_t arena_bytes;           /* size of arena */
    void **copies;                /* (n_copies) aligned copies of tensors
                                     that were unaligned in their file */
    int n_copies;                 /* entries in copies */
    uint64_t synth_seed;          /* MODEL_FORMAT_SYNTH: generator seed */
    bool synth_lazy;              /* synth views without host data */
    model_quant_t quant;          /* FP8 checkpoints: what was loaded */
};

/* A zeroed model-owned buffer of `bytes` (freed with the model). */
bt_status_t model__alloc_owned(model_t *model, size_t bytes, void **buf_p);

/* Makes an aligned, model-owned copy of `bytes` bytes at `src` (for
 * tensors whose file offset is not a multiple of their element size). */
bt_status_t model__copy_aligned(model_t *model, const void *src, size_t bytes,
                                const void **copy_p);

/* Allocates an empty model with `n_layers` zeroed layers. */
bt_status_t model__create(int n_layers, model_t **model_p);

/* mmaps `path` read-only into the model's mapping list; returns the
 * address and size.  BT_ERR_IO names the file. */
bt_status_t model__map_file(model_t *model, const char *path,
                            const void **data_p, size_t *size_p);

/* Number of elements of a tensor view (rows * cols), 0 when absent. */
int64_t model__tensor_numel(const model_tensor_t *t);

/* Loaders and the synthesizer (model.c dispatches to them). */
bt_status_t model__load_llama2c(const char *path, model_t **model_p);
bt_status_t model__load_hf(const char *path, model_t **model_p);
bt_status_t model__load_synth(const char *spec, unsigned flags,
                              model_t **model_p);

/* Row permutation between the llama2.c adjacent-pair RoPE layout and the
 * Hugging Face half-split layout, for a q or k matrix of `n_heads` heads
 * of `head_dim` rows each: HF row h*hd + j*hd/2 + i comes from adjacent
 * row h*hd + 2*i + j (j in {0,1}, i < hd/2).  Returns the source row of
 * destination row `r`. */
int64_t model__rope_row_adj_to_half(int64_t r, int head_dim);
int64_t model__rope_row_half_to_adj(int64_t r, int head_dim);

/* Writes config.json (weights described as `dtype`; `extra`, when not
 * NULL, is one more top-level JSON member such as
 * "\"quantization_config\": {...}") and generation_config.json into
 * dir (model_write.c). */
bt_status_t model__write_hf_config(const model_t *m, const char *dir,
                                   model_dtype_t dtype, const char *extra);

#endif /* BT_WORKER_MODEL_MODEL_INT_H */
