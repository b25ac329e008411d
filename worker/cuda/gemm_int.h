/*
 * gemm_int.h - what gemm.c (plans, the bf16 tuner, the tuner's file) and
 * gemm_fp8.c (the FP8 products and their tuner) share: the context's
 * layout, plans, tuned picks, the tuners' scratch and the helpers both
 * call.  Not for other modules: they see gemm.h.
 */
#ifndef BT_WORKER_CUDA_GEMM_INT_H
#define BT_WORKER_CUDA_GEMM_INT_H

#include <cublasLt.h>
#include <stdbool.h>

#include "gemm.h"
#include "gemm_cache.h"
#include "kernels/gemv.h"

#define GEMM_MAX_PLANS 256
#define GEMM_MAX_TUNED 1024
#define GEMM_TUNE_MAX_TOK 128   /* largest tuned token bucket */
#define GEMM_TUNE_BUCKETS 8     /* 1, 2, 4, ..., GEMM_TUNE_MAX_TOK */
_Static_assert(1 << (GEMM_TUNE_BUCKETS - 1) == GEMM_TUNE_MAX_TOK,
               "one bucket a power of two up to GEMM_TUNE_MAX_TOK");
#define GEMM_TC_COUNTERS 4096   /* split-K tile counters of the tc GEMV */
/* its partials: at most 2 blocks per SM x 128 tokens x 128 rows of f32
 * (kernels/gemv_tc.cu splits only up to 2 blocks per SM), 132 SMs */
#define GEMM_TC_PART_BYTES ((size_t)2 * 132 * 128 * 128 * 4)
#define GEMM_LT_CANDS 4         /* cuBLASLt heuristic algorithms timed */
#define GEMM_LT_CANDS_BIG 8     /* ... for prefill shapes */
#define GEMM_LT_SPLIT_BASES 2   /* heuristic picks given split-K variants */
#define GEMM_LT_ALGOS_MAX 80    /* heuristic picks + their split-K variants */
#define GEMM_TUNE_CANDS_MAX (CUDA_GEMV_N_KERNELS + GEMM_LT_ALGOS_MAX)
#define GEMM_BIG_STEP 256       /* prefill n_tok tuned: multiples of this */
#define GEMM_BIG_MAX 8192       /* ... up to this */
#define GEMM_TUNE_REPS 5
#define GEMM_FINAL_MAX 6        /* skinny candidates timed again at most */
#define GEMM_FINAL_REPS 12      /* ... interleaved runs each */
#define GEMM_FINAL_MARGIN 0.04f /* ... when within 4% (+0.2 us) of the best */
#define GEMM_FLUSH_BYTES (128u << 20) /* > L2 (50 MB on H100/H200) */
#define GEMM_CHOICE_LT 100      /* choice >= this: cuBLASLt algo (c - 100) */
#define GEMM_LEAD_DEFAULT 1     /* skinny candidates timed behind a lead */
/* The input dtype of an FP8 plan (worker_gemm_fp8): E4M3 A and B, f32 D
 * with rows padded to 16 floats; never a cuda_dtype_t of the kernels. */
#define GEMM_DT_E4M3 ((cuda_dtype_t)0x38)
#define GEMM_FP8_BAD_MAX 64
#define GEMM_FP8_TOK_ALIGN 16   /* FP8 plans' token counts: multiples */
#define GEMM_FP8_CANDS 16       /* cuBLASLt FP8 algorithms timed */
/* FP8 token counts the skinny GEMM takes from cuBLASLt (above the GEMV's
 * 8; decode graphs pad to powers of two): H100, 2026-12-06, bench_cuda
 * fp8 + FP8 KV @2k, every shape to it against cuBLASLt from 9 tokens,
 * A B A B: batch 16 4.94 / 4.92 against 5.69 / 5.72 ms, batch 32 6.01 /
 * 6.01 against 6.48 / 6.49, batch 64 8.58 / 8.57 against 8.14 / 8.14
 * (its split-K partials weigh half the o projection's weights there;
 * reducing them through a thread-block cluster lost at 16 and 32 and
 * stayed behind cuBLASLt at 64: 8.31 ms). */
#define GEMM_FP8_SKINNY_ROUTE_MAX 32
/* FP8 token counts whose tuning also times the plain plan (f32 sums and
 * the scaling pass) and the skinny GEMM: decode's, where cuBLASLt's one
 * vec algorithm reads o / down at 0.9-1.3 TB/s (H100, 2026-12-06,
 * tests/gpu/bench_fp8_lt.cu).  Above it the vec plan alone (prefill;
 * a serving step's first use of a count stays cheap to tune). */
#define GEMM_FP8_DECODE_TOK_MAX 512

/* How a tuned FP8 product runs (workbench of gemm_fp8_tune). */
typedef enum {
    GEMM_FP8_VEC = 0,  /* cuBLASLt, the scale vectors inside */
    GEMM_FP8_PLAIN,    /* cuBLASLt f32 sums, then the scaling pass */
    GEMM_FP8_SKINNY    /* the skinny GEMM in pieces of 64 tokens */
} gemm_fp8_path_t;

/* One planned shape. */
typedef struct {
    int n_tok;
    int n_out;
    int n_in;
    cuda_dtype_t in_dt;
    cuda_dtype_t out_dt;
    bool accumulate;
    bool fp8_vec;                  /* E4M3, the scale vectors applied in
                                    * the GEMM, D = y itself (rows n_out) */
    cublasLtMatmulDesc_t op;       /* compute type, transposes */
    cublasLtMatrixLayout_t a;      /* w */
    cublasLtMatrixLayout_t b;      /* x */
    cublasLtMatrixLayout_t d;      /* y */
    cublasLtMatmulAlgo_t algo;     /* the heuristic's first choice */
} gemm_plan_t;

/* One tuned (bucket, weight shape): the winner and its time. */
typedef struct {
    int bucket;                    /* token count tuned (power of two) */
    int n_out;
    int n_in;
    cuda_dtype_t out_dt;
    int kind;                      /* gemm_cache_kind_t: bf16 or FP8 */
    bool accumulate;               /* FP8 only: y += */
    int choice;                    /* cuda_gemv_kernel_t, or GEMM_CHOICE_LT + i */
    cublasLtMatmulAlgo_t algo;     /* the cuBLASLt winner's algorithm */
    float us;                      /* its median time */
    int fp8_path;                  /* FP8: gemm_fp8_path_t */
} gemm_tuned_t;

struct worker_gemm_ctx_s {
    cublasLtHandle_t handle;
    void *d_ws;                    /* workspace, ws_bytes */
    size_t ws_bytes;
    /* split-K scratch of the tc GEMV (kernels/gemv_tc.cu): its own
     * partials buffer (not d_ws: a cuBLASLt kernel that launched early
     * behind a programmatic trigger must never share memory with a tc
     * reduction still running) and tile counters (zeroed once) */
    float *d_part;
    int *d_cnt;
    cuda_gemv_ws_t gemv_ws;
    gemm_plan_t *plans;            /* (GEMM_MAX_PLANS) */
    int n_plans;
    bool use_gemv;                 /* skinny shapes to cuda_gemv (BT_GEMV) */
    bool tune;                     /* autotune skinny shapes (BT_GEMM_TUNE) */
    gemm_tuned_t *tuned;           /* (GEMM_MAX_TUNED) */
    int n_tuned;
    uint64_t setups;               /* plans built + families tuned */
    /* The tuner's file (BT_GEMM_CACHE; cache_path NULL: none) and the
     * entries it held for this key when the context was created. */
    char *cache_path;
    char cache_key[GEMM_CACHE_KEY_MAX];
    gemm_cache_entry_t *cached;    /* (GEMM_MAX_TUNED) */
    int n_cached;
    int cache_hits;                /* families installed from the file */
    /* FP8 shapes cuBLASLt has no algorithm for (asked once each) */
    int fp8_bad[GEMM_FP8_BAD_MAX][3];
    int n_fp8_bad;
    /* FP8 with the scale vectors in the GEMM: -1 not probed yet, 0 the
     * library does not run it (f32 sums + cuda_fp8_scale_out), 1 it does */
    int fp8_vec;
    bool fp8_force_epilogue;       /* worker_gemm_fp8_force_epilogue */
    bool fp8_skinny;               /* the skinny FP8 GEMM is usable (its
                                      shared-memory limits are set) */
    bool fp8_force_cublaslt;       /* worker_gemm_fp8_force_cublaslt */
    bool fp8_fast_accum;           /* every E4M3 plan in fast
                                      accumulation (BT_FP8_FAST_ACCUM=0:
                                      none) */
    /* (n_tok, n_out, ld, out_dt, accumulate) without such an algorithm */
    int fp8_vec_bad[GEMM_FP8_BAD_MAX][5];
    int n_fp8_vec_bad;
    /* FP8 shapes (n_out, ld, out_dt, acc) whose decode counts were tuned
     * (gemm_fp8_tune_decode: once each, whatever came of it) */
    int fp8_dec_done[GEMM_FP8_BAD_MAX][4];
    int n_fp8_dec_done;
};

/* How a skinny candidate is timed.  In a decode step
 * every skinny product runs inside a CUDA graph behind a small kernel (an
 * RMSNorm, SwiGLU, the attention).  Timed alone on the stream after the
 * L2 flush, a candidate also pays the stream's launch latency, and a
 * split-K pick its second launch, neither of which the graph has, and a
 * pick that wins on the stream can start late behind its RMSNorm in the
 * graph (round 21 of docs/PERFORMANCE.md).  So
 * by default each candidate of a bucket <= GEMM_TUNE_MAX_TOK is captured
 * as a graph behind a lead (cuda_gemv_tune_lead: an RMSNorm's traffic for
 * the candidate's input shape) and timed as the
 * graph's time minus the lead's alone.  The lead never triggers early
 * (gemv.h says why).  Where capture fails (the legacy default stream) the
 * two are launched on the stream. */
typedef enum {
    GEMM_LEAD_NONE = 0,
    GEMM_LEAD_STREAM,    /* lead + candidate launched on the stream */
    GEMM_LEAD_GRAPH      /* lead + candidate captured as one graph */
} gemm_lead_t;

/* Scratch of one family's tuning. */
typedef struct {
    void *d_x;           /* (GEMM_TUNE_MAX_TOK, n_in) bf16, pseudo-random */
    void *d_y;           /* (GEMM_TUNE_MAX_TOK, n_out) out_dt */
    void *d_ref;         /* same: cuBLASLt's result */
    void *d_flush;       /* GEMM_FLUSH_BYTES; its head also holds the
                          * lead's zeroed f32 input and its output */
    double *d_err;       /* 3 doubles */
    cudaEvent_t ev[2];
    gemm_lead_t lead_mode; /* of the family */
    gemm_lead_t lead;    /* of the bucket being tuned */
    float lead_us;       /* the lead's own median time in that bucket */
} gemm_scratch_t;

/* A cuBLASLt status as a bt_status_t (logged with `what`). */
bt_status_t gemm__check(cublasStatus_t st, const char *what);

/* "bf16", "f32", ... for logs. */
const char *gemm__dt_name(cuda_dtype_t dt);

/* True while `stream` is capturing a graph (nothing may be timed). */
bool gemm__capturing(cudaStream_t stream);

/* The plan of a shape, built on first use; _kind with fp8_vec: an E4M3
 * plan with the scale vectors in the GEMM.  The pointer stays valid
 * until the next plan is built (plans recycle past GEMM_MAX_PLANS). */
bt_status_t gemm__plan_find(worker_gemm_ctx_t *ctx, int n_tok,
                            int n_out, int n_in, cuda_dtype_t in_dt,
                            cuda_dtype_t out_dt, bool accumulate,
                            gemm_plan_t **plan_p);
bt_status_t gemm__plan_find_kind(worker_gemm_ctx_t *ctx, int n_tok,
                                 int n_out, int n_in,
                                 cuda_dtype_t in_dt,
                                 cuda_dtype_t out_dt, bool accumulate,
                                 bool fp8_vec, gemm_plan_t **plan_p);

/* Up to n_req of cuBLASLt's algorithms for plan p, best first (*n_p). */
bt_status_t gemm__lt_heuristic(worker_gemm_ctx_t *ctx,
                               const gemm_plan_t *p, int n_req,
                               cublasLtMatmulHeuristicResult_t *res,
                               int *n_p);

/* Appends the split-K variants of the first picks algos[] accepts. */
void gemm__lt_add_splits(worker_gemm_ctx_t *ctx, const gemm_plan_t *p,
                         cublasLtMatmulAlgo_t *algos, int *n_algos);

/* "ltI" or "ltI/kS..." for the tuner's log line. */
void gemm__lt_name(const cublasLtMatmulAlgo_t *algos, int i, int n_heur,
                   char *buf, size_t size);

/* The tuned winner of (bucket, shape, kind, accumulate), or NULL. */
gemm_tuned_t *gemm__tuned_find_kind(worker_gemm_ctx_t *ctx,
                                    int bucket, int n_out, int n_in,
                                    cuda_dtype_t out_dt, int kind,
                                    bool accumulate);

/* The tuners' scratch (zeroed by the caller) and its release, also
 * after a failure part way. */
bt_status_t gemm__scratch_alloc(gemm_scratch_t *sc, size_t y_bytes);
void gemm__scratch_free(gemm_scratch_t *sc);

/* Relative L2 difference of d_y from sc->d_ref (n values of dt); > 1
 * when anything is not finite. */
bt_status_t gemm__rel_err(const void *d_y, gemm_scratch_t *sc, size_t n,
                          cuda_dtype_t dt, cudaStream_t stream,
                          double *rel_p);

/* The median of t[0 .. n) in microseconds (sorts t), less the lead's
 * time when less_lead. */
float gemm__median_us(float *t, int n, const gemm_scratch_t *sc,
                      bool less_lead);

/* The tuner's file: an entry read at start, or NULL; and the merge of
 * this context's families back into the file. */
const gemm_cache_entry_t *gemm__cache_find(
    const gemm_cache_entry_t *e, int n, int bucket, int n_out, int n_in,
    cuda_dtype_t out_dt, int kind, bool accumulate);
void gemm__cache_save(worker_gemm_ctx_t *ctx);

#endif /* BT_WORKER_CUDA_GEMM_INT_H */
