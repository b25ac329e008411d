/*
 * cuda_backend.h - what the CUDA backend shares with its tests beyond
 * backend.h: the RoPE frequency table (so the kernel tests and the
 * backend scale frequencies the same way).
 */
#ifndef BT_WORKER_CUDA_CUDA_BACKEND_H
#define BT_WORKER_CUDA_CUDA_BACKEND_H

#include <stddef.h>

#include "backend.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = theta^(-2i/head_dim) for i < head_dim/2, with the config's
 * LINEAR (divided by factor) or LLAMA3 (frequency-dependent) scaling. */
void cuda__rope_inv_freq(const model_config_t *cfg, float *out);

/* Benchmark of the tensor-parallel all-reduce of a cuda backend with
 * tp > 1: every rank captures `iters` in-place all-reduces of n_floats of
 * its residual buffer (path "nccl" or "custom", the peer-memory kernel)
 * in a CUDA graph and replays it; *us_p = microseconds per call on rank
 * 0.  Destroys the residual buffer's contents (run between forwards).
 * BT_ERR_UNSUPPORTED when the path is not available. */
bt_status_t cuda_backend_bench_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int iters,
                                         double *us_p);

/* Correctness of the tensor-parallel all-reduce under load: every rank
 * enqueues `calls` all-reduces of varying sizes (up to n_floats, a
 * multiple of 4) back to back with no host wait, each on a known
 * integer pattern, then checks every result exactly; *bad_p = wrong
 * elements over all ranks.  Destroys the residual buffer's contents. */
bt_status_t cuda_backend_check_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int calls,
                                         long *bad_p);

/* The hidden rows (f32, dim wide, before the final norm) of the last
 * forward that asked for them (a hidden destination or
 * backend_batch_t.keep_hidden), on rank 0's GPU: row i of the rows that
 * forward returns (in the order a hidden destination would get them) is
 * at d_hidden + map[i] * dim.  Valid until the next forward.  NULL and
 * *n_p = 0 when the last forward kept none or the backend is not cuda. */
const float *cuda_backend_hidden(backend_t *backend, const int **map_p,
                                 int *n_p);

/* GPU time of the forwards so far (ns, rank 0's stream: CUDA events
 * from a forward's metadata upload to its last copy or sampling kernel);
 * 0 for another backend.  Wall time minus this is what the host adds. */
uint64_t cuda_backend_gpu_ns(backend_t *backend);

/* Rows sampled by backend_forward_sample since the backend was made:
 * greedy on the device, from the device's top candidates, candidates
 * that did not suffice (whole row fetched), whole rows from the start.
 * BT_ERR_UNSUPPORTED for another backend. */
bt_status_t cuda_backend_sample_stats(backend_t *backend, uint64_t *argmax,
                                      uint64_t *top, uint64_t *top_miss,
                                      uint64_t *row);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_BACKEND_H */
