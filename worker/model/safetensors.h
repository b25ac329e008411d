/*
 * safetensors.h - a validating parser for the safetensors format: an
 * 8-byte little-endian header length, a JSON header naming each tensor's
 * dtype, shape and [begin, end) byte range in the data area that follows.
 *
 * The parser only reads memory (the loader mmaps the file), so the fuzz
 * target can drive it directly.  Every range is checked against the data
 * area, ranges may not overlap, and a tensor's byte size must match its
 * shape for every dtype whose element size is known.  Data may be
 * unaligned (old writers did not pad the header); the loader copies such
 * tensors.
 */
#ifndef BT_WORKER_MODEL_SAFETENSORS_H
#define BT_WORKER_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_ST_MAX_DIMS 8
#define MODEL_ST_MAX_HEADER (100u << 20) /* bytes of JSON header */

typedef struct {
    char *name;                       /* tensor name (bt_malloc'ed) */
    char dtype_name[16];              /* as written: "F32", "I64", ... */
    bool dtype_ok;                    /* dtype is F32, F16 or BF16 */
    model_dtype_t dtype;              /* valid when dtype_ok */
    int ndim;                         /* entries used in shape */
    int64_t shape[MODEL_ST_MAX_DIMS]; /* (ndim) */
    uint64_t begin;                   /* byte offset in the data area */
    uint64_t end;                     /* one past the last byte */
    const void *data;                 /* begin resolved into the buffer */
} model_st_tensor_t;

typedef struct {
    model_st_tensor_t *tensors; /* (n_tensors), sorted by name */
    int n_tensors;              /* entries in tensors */
    size_t header_len;          /* bytes of JSON header */
    const uint8_t *data;        /* start of the data area */
    size_t data_len;            /* bytes of data area */
} model_st_file_t;

/* Parses the safetensors file held in `buf` (`size` bytes, the whole file).
 * `what` names the file in error messages.  On success *st holds views into
 * `buf`, which must outlive it; release with model_st_cleanup().  Returns
 * BT_ERR_FORMAT naming the problem (and the tensor when there is one). */
bt_status_t model_st_parse(const void *buf, size_t size, const char *what,
                           model_st_file_t *st);

/* Frees what model_st_parse allocated; safe on a zeroed struct. */
void model_st_cleanup(model_st_file_t *st);

/* Finds a tensor by name (binary search); NULL when absent. */
const model_st_tensor_t *model_st_find(const model_st_file_t *st,
                                       const char *name);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_SAFETENSORS_H */
