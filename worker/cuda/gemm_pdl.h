/*
 * gemm_pdl.h - programmatic edges into cuBLASLt's kernels in captured
 * decode steps (BT_GEMM_LT_PDL; gemm.c uses it, nothing else should).
 *
 * Why: every other kernel of a decode step is launched with programmatic
 * dependent launch, so it starts while its predecessor finishes.  A
 * cuBLASLt product cannot be launched that way (cublasLtMatmul takes no
 * launch attributes), so each of the four products a layer waits for
 * its predecessor to drain and then pays a launch (~0.5 us each, ~60 us
 * a batch-64 step on the H200: docs/PERFORMANCE.md rounds 16 and 23).
 * During capture the edge into cuBLASLt's first node can be made
 * programmatic by hand (cudaStreamUpdateCaptureDependencies with
 * cudaGraphDependencyTypeProgrammatic), but that is only correct when
 * the kernel itself waits for its predecessor (griddepcontrol.wait), and
 * which of cuBLASLt's kernels do is not documented.  So each algorithm is
 * probed before it gets the edge: captured behind a lead that triggers
 * its dependents at once and writes the product's inputs only ~20 us
 * later, the inputs poisoned (NaN) until then.  A kernel that waits
 * gives the stream-ordered result bit for bit; one that does not reads
 * the poison.
 */
#ifndef BT_WORKER_CUDA_GEMM_PDL_H
#define BT_WORKER_CUDA_GEMM_PDL_H

#include <stdbool.h>

#include "cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BT_GEMM_LT_PDL=1 (read once per call). */
bool gemm_pdl_enabled(void);

/* While `stream` is being captured and its one pending dependency is a
 * kernel node: makes the edge from that node to the next node captured
 * programmatic (the next node may launch once every block of that kernel
 * has triggered or exited).  Returns whether it did; false changes
 * nothing. */
bool gemm_pdl_edge(cudaStream_t stream);

/* One product of the probed algorithm: y (n_tok, n_out) [+]= x . w^T on
 * `stream` (gemm.c binds the plan, the algorithm and the weights). */
typedef bt_status_t (*gemm_pdl_run_fn)(void *arg, const void *d_x,
                                       void *d_y, bool accumulate,
                                       cudaStream_t stream);

/* Probes one algorithm (gemm_pdl.h's header says how), outside capture:
 * plain products, and for an f32 output also accumulating ones.
 * *waits_p: true when every probe gave the stream-ordered result.  Fails
 * only when the device does (allocation, launch); a capture the edge
 * makes invalid is a "false", not a failure. */
bt_status_t gemm_pdl_probe(gemm_pdl_run_fn run, void *arg, int n_tok,
                           int n_out, int n_in, cuda_dtype_t out_dt,
                           cudaStream_t stream, bool *waits_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_GEMM_PDL_H */
