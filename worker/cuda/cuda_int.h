/*
 * cuda_int.h - private helpers of the CUDA backend (worker/cuda/): the
 * error-conversion macros (CUDA runtime, cuBLASLt), the activation dtype
 * enum shared by every kernel launcher, and tracked device allocation.
 *
 * Every launcher in kernels/ takes a cuda_dtype_t for its activation and
 * weight tensors (bf16 in the default precision, f32 in the exactness
 * mode) and runs on the stream it is given.
 */
#ifndef BT_WORKER_CUDA_CUDA_INT_H
#define BT_WORKER_CUDA_CUDA_INT_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "bt_error.h"
#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of activations, weights and the KV cache. */
typedef enum {
    CUDA_DT_F32 = 0,
    CUDA_DT_BF16 = 1
} cuda_dtype_t;

static inline size_t cuda_dtype_size(cuda_dtype_t dt)
{
    return dt == CUDA_DT_F32 ? 4 : 2;
}

/* Converts a CUDA runtime result to a status, logging it once. Evaluates
 * to BT_OK or BT_ERR_CUDA; contains no control flow. */
#define BT_CUDA_STATUS(_expr)                                               \
    cuda__check((_expr), #_expr, __FILE__, __LINE__, __func__)

/* Evaluates `_expr`; on failure stores the status in `_status` and jumps
 * to `_label` (NCCL CUDACHECKGOTO). */
#define BT_CUDA_CHECK_GOTO(_expr, _status, _label)                          \
    do {                                                                    \
        (_status) = BT_CUDA_STATUS(_expr);                                  \
        if ((_status) != BT_OK)                                             \
            goto _label;                                                    \
    } while (0)

/* Same for functions that already return a bt_status_t. */
#define BT_CHECK_GOTO(_expr, _status, _label)                               \
    do {                                                                    \
        (_status) = (_expr);                                                \
        if ((_status) != BT_OK)                                             \
            goto _label;                                                    \
    } while (0)

/* Checks the last launch on this thread (call right after a launch). */
#define BT_CUDA_LAUNCH_STATUS() BT_CUDA_STATUS(cudaGetLastError())

bt_status_t cuda__check(cudaError_t err, const char *expr, const char *file,
                        int line, const char *func);

/* Tracked device allocation: *d_p must be NULL; counts bytes per process
 * so the backend can print its budget and tests can check for leaks. */
bt_status_t cuda__dev_malloc(void **d_p, size_t size, const char *name);
/* Frees *d_p (NULL-safe) and resets it to NULL. */
void cuda__dev_free(void **d_p);
/* Device bytes currently held through cuda__dev_malloc. */
size_t cuda__dev_live_bytes(void);

/* Non-zero (with PDL on): the kernels this thread launches trigger their
 * dependents late instead of after their PDL wait — the small kernels
 * (RoPE, decode attention, SwiGLU) not at all, i.e. when they end.  When
 * small unfused kernels sat between the GEMVs, early triggers chained
 * launches ahead and let the next GEMV's blocks take slots for the whole
 * of a batch-1 GEMV; late ones kept the overlap of each GEMV's tail with
 * the next GEMV's first weight loads (faster at batch 1 than no PDL or
 * early triggers, while batch 8 and 64 keep the early triggers, which
 * win there: rounds 6, 14 and 15 of docs/PERFORMANCE.md).  Two kernels
 * trigger at their top: the split combine of the decode attention (its
 * 32 blocks leave room for the o projection's, which then load during
 * it; attn_decode.cu), and, since the norm, RoPE and SwiGLU are fused at
 * 1 token, the rows GEMV (its trigger completes when its last block is
 * resident, so the next kernel takes each slot the moment it frees;
 * gemv.cu).  Set by the backend for forwards of <= 2 tokens. */
extern __thread int cuda__pdl_late;

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_INT_H */
