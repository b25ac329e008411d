/*
 * cuda_switches.h - the CUDA backend's BT_* environment switches: one
 * table, read once.
 *
 * Each line of CUDA_SWITCH_TABLE is one switch (NCCL_PARAM style): the
 * field, the variable, and what it selects; the default is what the code
 * does when the variable is unset (the field is then NULL).  The values
 * are read the first time cuda_switches() is called, which
 * cuda_backend_create does before anything else (so at start, never per
 * launch or step); launchers read the fields, never the environment.
 * docs/PERFORMANCE.md "Environment switches" lists the same table.
 * BT_NCCL_LIB alone is read elsewhere, by nccl_dl.c when it loads NCCL
 * (once, at the first tensor-parallel backend; tests/worker/
 * test_backend_tp sets it between loads).
 */
#ifndef BT_WORKER_CUDA_CUDA_SWITCHES_H
#define BT_WORKER_CUDA_CUDA_SWITCHES_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(field, variable, default and what it selects) */
#define CUDA_SWITCH_TABLE(X)                                                \
    X(gemv, "BT_GEMV",                                                      \
      "1; 0: cuBLASLt for every product, no GEMV kernels")                  \
    X(gemm_tune, "BT_GEMM_TUNE",                                            \
      "1; 0: static GEMM defaults, no timing")                              \
    X(gemv_force, "BT_GEMV_FORCE",                                          \
      "unset; a GEMV variant (gemv.h names, or lt) for every product")      \
    X(gemv_disable, "BT_GEMV_DISABLE",                                      \
      "unset; comma list of GEMV variants the tuner does not time")         \
    X(gemm_cache, "BT_GEMM_CACHE",                                          \
      "~/.cache/baton/gemm-HOST.txt; the tuner's picks file, off: none")    \
    X(gemv_norm, "BT_GEMV_NORM",                                            \
      "rows; RMSNorm fused into the 1-token GEMV: 0 off, ring/1 ring")      \
    X(gemv_glu, "BT_GEMV_GLU",                                              \
      "pair at 1 token, warp at 2; SwiGLU fused into gate/up: 0 off")      \
    X(fp8_fast_accum, "BT_FP8_FAST_ACCUM",                                  \
      "1; 0: cuBLASLt's FP8 GEMMs promote their sums to f32 (exact mode)")  \
    X(attn_tc, "BT_ATTN_TC",                                                \
      "1; 0: the general decode attention, not the tensor-core one")        \
    X(cuda_graphs, "BT_CUDA_GRAPHS", "1; 0: decode steps eager")            \
    X(tree_graphs, "BT_TREE_GRAPHS",                                        \
      "1; 0: tree-verification steps eager")                                \
    X(draft_graphs, "BT_DRAFT_GRAPHS",                                      \
      "1; 0: the device draft head's passes eager")                         \
    X(draft_profile, "BT_DRAFT_PROFILE",                                    \
      "unset; 1: per-stage GPU time of the device draft head")              \
    X(host_sample, "BT_HOST_SAMPLE",                                        \
      "unset; set: logits rows to the host, sampled there")                 \
    X(sample_dist, "BT_SAMPLE_DIST",                                        \
      "1; 0: missed rows copied whole, no whole-row device sampler")        \
    X(sample_dist_cluster, "BT_SAMPLE_DIST_CLUSTER",                        \
      "by rows; blocks a row in the whole-row sampler's cluster, at most")  \
    X(profile_skip, "BT_PROFILE_SKIP",                                      \
      "unset; comma list of per-layer ops left out (timing only)")          \
    X(tp_allreduce, "BT_TP_ALLREDUCE",                                      \
      "auto; nccl, custom (peer kernel) or none (timing only)")             \
    X(tp_ar_custom_max, "BT_TP_AR_CUSTOM_MAX",                              \
      "4 MiB at tp 2, 1 MiB above; largest peer-kernel message of auto")

typedef struct {
#define CUDA_SWITCH_FIELD(field, var, doc) const char *field;
    CUDA_SWITCH_TABLE(CUDA_SWITCH_FIELD)
#undef CUDA_SWITCH_FIELD
} cuda_switches_t;

/* The switches, read from the environment at the first call (thread-safe;
 * the values then never change, except through cuda_switches_reload). */
const cuda_switches_t *cuda_switches(void);

/* Reads the environment again.  For tests that set a switch between runs
 * of one process: pointers taken from an earlier cuda_switches() result
 * are invalid after it, and no other thread may use the switches while
 * it runs. */
void cuda_switches_reload(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_SWITCHES_H */
