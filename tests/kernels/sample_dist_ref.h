/*
 * sample_dist_ref.h - CPU reference of cuda_sample_dist (worker/cuda/
 * kernels/sample_dist.h) and the check of its contract against the host
 * sampler (worker/cuda/cuda_sample.h).  Plain C: the CPU test
 * (tests/worker/test_sample_dist.c) and the GPU test
 * (tests/gpu/test_sample_dist.c) both use it.
 */
#ifndef BT_TESTS_KERNELS_SAMPLE_DIST_REF_H
#define BT_TESTS_KERNELS_SAMPLE_DIST_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../worker/cuda/kernels/sample_dist.h"
#include "../../worker/sampler.h"

/* A uniform double in [0, 1) from the xorshift64 state *rng. */
double sample_dist_ref_uniform(uint64_t *rng);

/* A test row of `vocab` logits: kind 0 flat, 1 peaked, 2 coarse ties,
 * 3 masked (-inf), 4 all equal, 5 one NaN, 6 one +inf. */
void sample_dist_ref_row(float *row, int vocab, int kind, uint64_t *rng);

/* P_i = (float)(e_i / sum) as sampler.c computes them (host expf, sum in
 * id order); false for a non-finite row (NaN, or an infinite max). */
bool sample_dist_ref_probs(const float *row, int vocab, float inv_t,
                           float *p, double *sum_p);

/* cuda_sample_dist's selection and draw on given probabilities (the
 * device's scratch row, or sample_dist_ref_probs) and normalizer: the
 * kernel's result bit for bit (token, n, keep), by a sort instead of
 * the kernel's radix descent. */
void sample_dist_ref_pick(const float *p, int vocab, double sum,
                          const cuda_dist_spec_t *sp, cuda_dist_out_t *out);

/* The whole reference: probabilities, then the pick (out->token
 * CUDA_DIST_NONFINITE for a non-finite row). */
void sample_dist_ref(const float *row, int vocab, const cuda_dist_spec_t *sp,
                     cuda_dist_out_t *out);

/* The spec of a row for sampler parameters and uniform u. */
void sample_dist_ref_spec(const sampler_params_t *prm, float u, int row,
                          cuda_dist_spec_t *sp);

/* The contract: a fresh sampler with `prm` on `row` has candidates
 * (sampler_probs' support) in its draw order with exact cumulative mass
 * C (long double, of the host's P over the host's keep); `token` must
 * have C_before <= u + tol and C_incl >= u - tol, u = the sampler's
 * first uniform, tol = tol0 + |keep - host keep| / host keep (a nucleus
 * edge that rounding moved; keep < 0: unknown, tol = tol0) + the mass of
 * the other candidates whose host P lies within ulp_slack ulps of the
 * token's (divided by the host keep): a device whose P differ from the
 * host's by a few ulps (its expf) may order such near-ties the other way
 * and so draw the token one near-tie neighbour away (0: no allowance,
 * for the reference on the host's own P).  Returns true when it holds;
 * *host_token_p gets sampler_sample's own token and *slack_p (may be
 * NULL) how far the HOST token's window misses u (its float walk's
 * error). */
bool sample_dist_ref_contract(const float *row, int vocab,
                              const sampler_params_t *prm, int token,
                              double keep, double tol0, int ulp_slack,
                              int *host_token_p,
                              double *slack_p, char *why, size_t why_len);

#endif /* BT_TESTS_KERNELS_SAMPLE_DIST_REF_H */
