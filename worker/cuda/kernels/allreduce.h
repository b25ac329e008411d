/*
 * allreduce.h - one-shot in-place all-reduce (sum, f32) between the GPUs
 * of one process with peer access, for the small messages of decode
 * steps (the residual stream of a few tokens).
 *
 * ONE flag barrier per call, per thread block, with double-buffered
 * staging: block b of each rank copies its slice of its own buffer into
 * its own staging area (half e & 1 of block b's two halves, e = the
 * block's epoch), then tells block b of every peer it is there (release
 * store of e into the peer's flag word) and waits for every peer's e
 * (acquire spin); it then sums the slice of every rank in rank order
 * (its own from registers, the peers' from their staging over NVLink:
 * every rank gets the same bits) and writes it into its own buffer,
 * which no peer reads.  No second barrier: the half a block writes at
 * epoch e + 2 was last read by the peers at epoch e, and a peer's block
 * b signalling e + 1 (which this block waited for) started after that
 * peer's whole epoch-e kernel completed (stream order).  A peer may be
 * one call ahead and already have written e + 1 into the flag word, so
 * a block waits for flag - e >= 0 (wrapping), not for equality.
 * Epochs come from a per-block device counter bumped by the kernel, never
 * from a host argument, so a CUDA graph can replay the call.  Every rank
 * must issue the same sequence of calls with the same sizes (they do:
 * every rank runs the same plan), so block b has the same epoch and the
 * same elements on every rank.
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
/* uint32 flags each rank allocates: (blocks, ranks) */
#define CUDA_AR_FLAG_WORDS (CUDA_AR_MAX_BLOCKS * CUDA_AR_MAX_RANKS)

/* Floats of one rank's staging area for a grid of n_blocks: two halves
 * per block, each one call's slice of that block. */
#define CUDA_AR_STAGE_FLOATS(n_blocks)                                     \
    ((size_t)(n_blocks) * 2 * CUDA_AR_THREADS * CUDA_AR_VEC_PER_THREAD * 4)

typedef struct {
    int n_ranks;
    int rank;
    int n_blocks;                          /* grid cap (<= SMs, <= MAX) */
    float *d_buf;                          /* own buffer, in place */
    float *d_stage[CUDA_AR_MAX_RANKS];     /* every rank's staging (peer
                                              pointers),
                                              CUDA_AR_STAGE_FLOATS(
                                              n_blocks) floats or more */
    uint32_t *d_flags[CUDA_AR_MAX_RANKS];  /* every rank's flags, zeroed */
    uint32_t *d_epoch;                     /* own (CUDA_AR_MAX_BLOCKS),
                                              zeroed */
} cuda_ar_t;

/* Floats one call can reduce (larger sums are split into calls). */
size_t cuda_ar_max_floats(const cuda_ar_t *ar);

/* d_buf[0, n) = sum over ranks of their d_buf[0, n), on every rank.
 * n % 4 == 0.  Splits n into calls of at most cuda_ar_max_floats. */
bt_status_t cuda_allreduce_custom(const cuda_ar_t *ar, size_t n,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_ALLREDUCE_H */
