/*
 * cpu_int.h - the float32 CPU backend's internals: a small persistent
 * thread pool and the ops the forward pass is built from.
 *
 * Every op is a plain single-threaded function over an explicit range, so
 * tests can check it against a naive reference and the backend decides how
 * to split it across threads (cpu_backend.c).  All tensors are float32,
 * row-major.
 */
#ifndef BT_WORKER_CPU_CPU_INT_H
#define BT_WORKER_CPU_CPU_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// thread pool (cpu_pool.c)

typedef struct cpu_pool_s cpu_pool_t;

/* A job: thread `ith` of `nth` does its share of the work behind `arg`. */
typedef void (*cpu_task_fn_t)(void *arg, int ith, int nth);

/* Starts n_threads - 1 workers (the caller is thread 0); n_threads 0 means
 * one per online core.  Workers spin briefly after each job, then sleep. */
bt_status_t cpu__pool_create(int n_threads, cpu_pool_t **pool_p);
/* Stops and joins the workers; NULL-safe; sets *pool_p to NULL. */
void cpu__pool_destroy(cpu_pool_t **pool_p);
/* Threads in the pool, the caller included. */
int cpu__pool_size(const cpu_pool_t *pool);
/* Runs fn(arg, i, nth) for i in [0, nth) on nth threads (nth is clamped to
 * the pool size) and returns when all are done.  Each share runs exactly
 * once: on its worker, or on the caller when the worker has not started
 * it by the time the caller finished share 0 (a worker without a core
 * does not hold the caller up), so a share must not assume which thread
 * runs it, only that no other share runs with the same i.  With nth == 1
 * it is a plain call.  One caller at a time. */
void cpu__pool_run(cpu_pool_t *pool, int nth, cpu_task_fn_t fn, void *arg);

// ----------------------------------------------------------------------------
// ops

/* Matrix product against a weight matrix w (rows of k floats, ldw apart):
 *     out[t*ldo + n] = sum_j x[t*ldx + j] * w[n*ldw + j] + bias[n]
 * for t in [0, n_tok) and n in [n_begin, n_end); bias may be NULL; with
 * `accumulate` the result is added to out instead of stored.  Weight
 * stationary: each weight row is read once per call and dotted with every
 * token row (AVX2+FMA when the CPU has it, portable C otherwise). */
void cpu__matmul(float *out, int ldo, const float *x, int ldx,
                 const float *w, int ldw, const float *bias, int n_tok, int k,
                 int n_begin, int n_end, bool accumulate);
/* The same in the obvious scalar order; for tests. */
void cpu__matmul_ref(float *out, int ldo, const float *x, int ldx,
                     const float *w, int ldw, const float *bias, int n_tok,
                     int k, int n_begin, int n_end, bool accumulate);
/* True when cpu__matmul uses the AVX2+FMA kernel on this CPU. */
bool cpu__have_avx2(void);
/* Tests: makes cpu__matmul use the portable kernel even on AVX2 CPUs. */
void cpu__matmul_force_portable(bool on);

/* Packed weights: the (n_out, k) matrix cut into panels of CPU_PACK_NR
 * output rows, each stored k-major (for j in [0, k): the panel's
 * CPU_PACK_NR weights of column j, contiguous), the last panel padded
 * with zero rows.  A micro-kernel then holds a block of tokens x outputs
 * in vector registers, broadcasting one activation and loading one
 * contiguous row of the panel per FMA step: no horizontal sums, and the
 * outputs of a panel are stored as whole vectors. */
#define CPU_PACK_NR 16
/* Floats of the packed form of an (n_out, k) matrix. */
size_t cpu__pack_size(int n_out, int k);
/* Packs w (n_out rows of k floats, ldw apart) into dst
 * (cpu__pack_size(n_out, k) floats). */
void cpu__pack(float *dst, const float *w, int ldw, int n_out, int k);
/* cpu__matmul against packed weights wp of an (n_out, k) matrix: the same
 * result for outputs [n_begin, n_end), n_begin a multiple of CPU_PACK_NR.
 * Each output is one sum in column order (no reassociation), so a token's
 * result does not depend on the batch it is in or on the split. */
void cpu__matmul_packed(float *out, int ldo, const float *x, int ldx,
                        const float *wp, int n_out, const float *bias,
                        int n_tok, int k, int n_begin, int n_end,
                        bool accumulate);

/* Rounds each float to the nearest bf16 (ties to even), in place: the
 * bf16 precision mode's rounding where the CUDA backend stores bf16.
 * _rows: n_rows rows of n_cols, ld floats apart. */
void cpu__round_bf16(float *x, size_t n);
void cpu__round_bf16_rows(float *x, size_t ld, int n_rows, int n_cols);

/* FP8 (E4M3) GEMM pieces of precision fp8 (cpu_fp8.c; the GEMM itself is
 * cpu__matmul_packed over E4M3 values held as floats):
 * quant_rows: n_tok rows of x (k floats, ldx apart) divided by their
 * scale and rounded to E4M3 into xq (k apart), the scale of each row into
 * xs: in_scale (static), or the row's absmax / 448 when in_scale is 0;
 * epilogue: out[t*ldo + n] = (or += with accumulate) acc[t*lda + n] *
 * xs[t] * ws[n] (+ bias[n], may be NULL) for n in [n0, n1). */
void cpu__fp8_quant_rows(float *xq, float *xs, const float *x, int ldx,
                         int n_tok, int k, float in_scale);
void cpu__fp8_epilogue(float *out, int ldo, const float *acc, int lda,
                       const float *xs, const float *ws, const float *bias,
                       int n_tok, int n0, int n1, bool accumulate);
/* The reference FP8 GEMM from codes, summed in double: out (n_tok, n_out)
 * = (xq (n_tok, k) . wq (n_out, k)^T) * xs[t] * ws[n] (ws of n_ws = 1 or
 * n_out values).  For tests, here and for the CUDA FP8 kernels. */
void cpu__fp8_gemm_ref(float *out, const uint8_t *xq, const float *xs,
                       const uint8_t *wq, const float *ws, int n_ws,
                       int n_tok, int k, int n_out);

/* Copies row `token` of the (vocab, dim) table into out (dim). */
void cpu__embed(float *out, const float *table, int dim, int token);

/* out = x / sqrt(mean(x^2) + eps) * weight, one row of `dim`. out may be
 * x. */
void cpu__rmsnorm(float *out, const float *x, const float *weight, int dim,
                  float eps);

/* Fills inv_freq (head_dim / 2) with the rotation frequency of each pair:
 * theta^(-2i/head_dim), rescaled for LINEAR (divided by the factor) or
 * LLAMA3 (Llama 3.1 frequency-dependent) scaling. */
void cpu__rope_inv_freq(const model_config_t *cfg, float *inv_freq);
/* cos/sin of pos * inv_freq[i] for i < head_dim / 2. */
void cpu__rope_cos_sin(int pos, const float *inv_freq, int half,
                       float *cos_out, float *sin_out);
/* Rotates n_heads heads of head_dim in vec by the precomputed cos/sin:
 * ADJACENT pairs (2i, 2i+1) or HALF pairs (i, i + head_dim/2). */
void cpu__rope_apply(float *vec, int n_heads, int head_dim,
                     model_rope_layout_t layout, const float *cos_v,
                     const float *sin_v);

/* x[i] = exp(x[i]) for i < n (vectorized; within 2 ulp of expf; inputs
 * below -87.3 give 0 or tiny values, -INFINITY gives 0). */
void cpu__exp_inplace(float *x, int n);
/* x[i] = exp(x[i] - shift[i % 8]) for i < n (a multiple of 8), as
 * cpu__exp_inplace, and sum[l] = the sum of the results x[i] with
 * i % 8 == l: eight interleaved softmax rows in one pass. */
void cpu__exp_shift8(float *x, int n, const float shift[8], float sum[8]);

/* SwiGLU on interleaved gate/up values: out[i] = silu(gu[2i]) * gu[2i+1]
 * for i in [0, n).  `tmp` is scratch of n floats. */
void cpu__swiglu(float *out, const float *gu, int n, float *tmp);

/* The paged KV of one sequence in one layer.  Keys/values of slot p live
 * at k_layer/v_layer + (block_table[p / bs] * bs + p % bs) * kv_row +
 * kv_head * head_dim. */
typedef struct {
    const float *k_layer;    /* this layer's K base (n_blocks, bs, kv_row) */
    const float *v_layer;    /* this layer's V base, same layout */
    const int *block_table;  /* the sequence's block ids */
    int block_size;          /* tokens per block */
    int kv_row;              /* n_kv_heads * head_dim */
    int head_dim;
    int ctx_len;             /* cached slots before the new tokens */
    int n_new;               /* new tokens of the sequence in this step */
    const uint8_t *mask;     /* (n_new, n_new) or NULL for causal */
} cpu_attn_seq_t;

/* Attention for new tokens [i0, i0 + n_q) of one sequence and the `group`
 * query heads that share KV head kv_head (GQA).  The new tokens' K/V must
 * already be in their slots [ctx_len, ctx_len + n_new).  New token i sees
 * every cached slot and new token j when mask[i*n_new + j] (or j <= i
 * when mask is NULL).
 *   q:   query of token i0, first head of the group; heads head_dim
 *        apart, tokens ldq apart.
 *   out: same layout with row stride ldo, (n_q, group * head_dim).
 *   scratch: n_q * (ctx_len + n_new) floats.
 * Scores come from the weight-stationary matmul (each key row read once
 * for all n_q queries), softmax with scale 1/sqrt(head_dim). */
void cpu__attention(float *out, int ldo, const float *q, int ldq,
                    const cpu_attn_seq_t *s, int kv_head, int group, int i0,
                    int n_q, float *scratch);

/* Floats of scratch cpu__attention_decode needs for n slots. */
#define CPU_ATTN_DECODE_SCRATCH(n) (8 * ((size_t)(n) + 8))

/* Decode attention of one sequence: its last new token, which sees every
 * slot [0, ctx_len + n_new) (s->mask must be NULL for the fused path; with
 * a mask it falls back to cpu__attention), for all n_kv_heads * group
 * query heads at once.
 *   q:   the token's query, heads head_dim apart (head h uses KV head
 *        h / group).
 *   out: same layout.
 *   scratch: CPU_ATTN_DECODE_SCRATCH(ctx_len + n_new) floats.
 * With AVX2 and head_dim 8, 16, 32 or a multiple of 64, tiles of heads
 * (64 output floats each) walk each K and V row once in slot order; the
 * result equals cpu__attention's within rounding.  A sequence's result
 * depends only on the sequence. */
void cpu__attention_decode(float *out, const float *q,
                           const cpu_attn_seq_t *s, int n_kv_heads,
                           int group, float *scratch);
/* Tests: makes cpu__attention_decode use its AVX2 kernels even where the
 * AVX-512VL builds of them (32 vector registers) would run. */
void cpu__attention_force_avx2(bool on);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CPU_CPU_INT_H */
