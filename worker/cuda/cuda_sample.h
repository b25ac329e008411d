/*
 * cuda_sample.h - sampling a forward's logits rows on the device
 * (backend_forward_sample for the cuda backend, one GPU).
 *
 * The rows stay in the backend's device logits buffer.  Per row, by
 * sampler_need(): greedy rows get their argmax on the device (an id
 * crosses), temperature rows the top CUDA_SAMPLE_TOP_MAX candidates and
 * the softmax normalizer (2 KB), sampled on the host by
 * sampler_sample_top(); rows whose nucleus those cannot hold (top-p
 * close to 1, flat rows) and plain-temperature rows are sampled from
 * their whole distribution on the device (cuda_sample_dist: the
 * sampler's uniform goes down, an id comes back), and a request whose
 * row missed its candidates sends its next rows there at once, until
 * its nucleus fits in half of them again (sampler_wide: no miss, no
 * second round trip).  Rows with penalties,
 * top-k > 1 without top-p, non-finite logits, and rows without a sampler
 * whose logits the caller wants, are copied whole.  Everything is
 * enqueued on the forward's stream behind it (cuda_sampling_enqueue);
 * cuda_sampling_finish runs after the stream has completed (a second
 * launch + wait only when some row missed its candidates).
 *
 * Contract of the whole-distribution rows (cuda_sample_dist,
 * kernels/sample_dist.h).  The same uniform (the sampler's next, one per
 * row: seeded streams stay aligned), the same candidate set in the same
 * order ((P desc, id asc) for top-p / top-k 1, id order for plain
 * temperature / min-p), and the token is the exact inverse CDF of the
 * candidates at that uniform: the first whose cumulative mass exceeds
 * u * keep.  Where the host sampler differs: its expf and the device's
 * (up to 2 ulp), the normalizers summed in another order (the device
 * sums masses in 2^-60 fixed point: exact, order-free), and its draw
 * walks a float running sum whose rounding grows with the candidates
 * walked (up to n * 2^-25; ~1e-5 over 100K flat candidates, about one
 * candidate's probability there).  So the token is the host's except
 * when u lies within that rounding of a cumulative boundary: always the
 * same distribution, usually the same token on peaked rows, often a
 * neighbour in draw order on huge flat nuclei (and, since the device's
 * P differ from the host's by up to 4 ulp, one near-tie neighbour away
 * where P values within a few ulp are ordered the other way); its cost
 * is in docs/PERFORMANCE.md.  BT_SAMPLE_DIST=0 copies those rows whole
 * instead (bit-exact host replay, much slower on flat rows).
 */
#ifndef BT_WORKER_CUDA_CUDA_SAMPLE_H
#define BT_WORKER_CUDA_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "bt_status.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_sampling_s cuda_sampling_t;

/* Buffers for up to max_rows rows of `vocab` logits, on the current
 * device. */
bt_status_t cuda_sampling_create(int vocab, int max_rows,
                                 cuda_sampling_t **cs_p);
void cuda_sampling_destroy(cuda_sampling_t **cs_p);

/* Row r of the forward (r < n_rows <= max_rows) lies at d_logits +
 * dev_row[r] * ld.  Enqueues the per-row work on `stream`; samplers,
 * ids and logits are kept (backend_forward_sample's meaning) until
 * cuda_sampling_finish. */
bt_status_t cuda_sampling_enqueue(cuda_sampling_t *cs, const float *d_logits,
                                  size_t ld, int n_rows, const int *dev_row,
                                  sampler_t *const *samplers, int *ids,
                                  float *logits, cudaStream_t stream);

/* Waits for the stream, then samples on the host; rows whose candidates
 * do not suffice are copied then (synchronously). */
bt_status_t cuda_sampling_finish(cuda_sampling_t *cs, cudaStream_t stream);

/* Counters since creation (benchmarks, tests): rows by how they were
 * sampled. */
typedef struct {
    uint64_t argmax;   /* greedy on the device */
    uint64_t top;      /* from the device's candidates */
    uint64_t top_miss; /* candidates did not suffice (then dist, or the
                        * whole row copied) */
    uint64_t row;      /* whole row from the start */
    uint64_t dist;     /* sampled by cuda_sample_dist */
    uint64_t dist_declined; /* non-finite logits: whole row copied */
} cuda_sampling_stats_t;

void cuda_sampling_stats(const cuda_sampling_t *cs,
                         cuda_sampling_stats_t *st);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_SAMPLE_H */
