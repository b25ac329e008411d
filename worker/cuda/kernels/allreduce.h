/*
 * allreduce.h - one-shot in-place all-reduce (sum, f32) between the GPUs
 * of one process with peer access, for the small messages of decode
 * steps (the residual stream of a few tokens).
 *
 * Every rank's kernel reads the same slice of every rank's buffer over
 * NVLink and sums it in rank order (so every rank gets the same bits),
 * then writes it into its own buffer.  Two flag barriers per call, per
 * thread block: block b of each rank tells block b of every peer it has
 * started (its input, written by earlier kernels on its stream, is
 * complete) and, after reading, that it is done reading; the flags carry
 * an epoch taken from a device counter (per block), never from a host
 * argument, so a CUDA graph can replay the call.  Every rank must issue
 * the same sequence of calls with the same sizes (they do: every rank
 * runs the same plan).
 */
#ifndef BT_WORKER_CUDA_KERNELS_ALLREDUCE_H
#define BT_WORKER_CUDA_KERNELS_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_AR_MAX_RANKS 8
#define CUDA_AR_MAX_BLOCKS 256
#define CUDA_AR_THREADS 512
#define CUDA_AR_VEC_PER_THREAD 4  /* float4s a thread holds per call */
/* uint32 flags each rank allocates: (2 barriers, blocks, ranks) */
#define CUDA_AR_FLAG_WORDS (2 * CUDA_AR_MAX_BLOCKS * CUDA_AR_MAX_RANKS)

typedef struct {
    int n_ranks;
    int rank;
    int n_blocks;                          /* grid cap (<= SMs, <= MAX) */
    float *d_buf[CUDA_AR_MAX_RANKS];       /* every rank's buffer (peer
                                              pointers), the same size */
    uint32_t *d_flags[CUDA_AR_MAX_RANKS];  /* every rank's flags, zeroed */
    uint32_t *d_epoch;                     /* own (CUDA_AR_MAX_BLOCKS),
                                              zeroed */
} cuda_ar_t;

/* Floats one call can reduce (larger sums are split into calls). */
size_t cuda_ar_max_floats(const cuda_ar_t *ar);

/* d_buf[rank][0, n) = sum over ranks of d_buf[r][0, n) on every rank.
 * n % 4 == 0.  Splits n into calls of at most cuda_ar_max_floats. */
bt_status_t cuda_allreduce_custom(const cuda_ar_t *ar, size_t n,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_ALLREDUCE_H */
