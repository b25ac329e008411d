/*
 * gemv.h - skinny bf16 GEMMs for decode steps (1 to 64 tokens): kernels
 * that read each weight byte once at the memory-bandwidth limit, where
 * cuBLASLt's small-N kernels leave bandwidth unused on the per-layer
 * shapes.  worker_gemm() times them against cuBLASLt per shape and keeps
 * the winner (gemm.c); not called directly by the backend except
 * cuda_gemv_norm.
 *
 * Variants (cuda_gemv_kernel_t):
 * - rows:   one warp per output row, 4 + 4 16-byte chunks in flight per
 *           lane (the default for 1-2 tokens); it triggers its
 *           dependents at entry in late-trigger steps (<= 2 tokens),
 *           after the PDL wait otherwise.
 * - rows8:  the same with 8 + 8 chunks in flight, 16 warps per SM.
 * - stream: fixed grid, rows strided over warps, registers (round 2).
 * - ring:   one block per SM (persistent); each warp streams a contiguous
 *           share of the block's rows through a private shared-memory
 *           ring (cp.async 16-byte copies, up to ~200 KB in flight per
 *           SM, issued before the PDL wait); x staged in shared memory;
 *           partial rows combined with shared atomics.  <= 4 tokens.
 * - bulk:   ring with TMA bulk copies (cp.async.bulk + mbarrier), one
 *           instruction per 4 KB piece.
 * - mma1/mma2: tensor-core (mma.m16n8k16) skinny GEMM for 1 to 64 tokens:
 *           one block per SM over groups of 16 (mma1) or 32 (mma2) rows,
 *           the 8 warps split K, weights streamed through a cp.async ring
 *           straight into fragment order (the K order is permuted
 *           identically in the weights and x, so every fragment is one
 *           16-byte load), tokens padded to multiples of 8.
 * - tc:     tensor-core skinny GEMM for 1 to 64 tokens (gemv_tc.cu): 128
 *           weight rows per block with x's K slice beside them in a
 *           swizzled cp.async ring, ldmatrix + mma.m16n8k16, split K with
 *           a deterministic last-block reduction through the caller's
 *           workspace (cuda_gemv_ws_t) when the rows cannot fill the GPU.
 * - wg:     tc with the products on wgmma (sm_90a only; up to 128 tokens,
 *           so speculative verification of 128-token steps has it too):
 *           one warpgroup per 64 weight rows reads both operands straight
 *           from the swizzled stages, no ldmatrix traffic.
 */
#ifndef BT_WORKER_CUDA_KERNELS_GEMV_H
#define BT_WORKER_CUDA_KERNELS_GEMV_H

#include <stdbool.h>
#include <stdint.h>

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_GEMV_MAX_TOK 2  /* the rows kernel's default range */
#define CUDA_GEMV_MMA_MAX_TOK 64
#define CUDA_GEMV_WG_MAX_TOK 128

typedef enum {
    CUDA_GEMV_ROWS = 0,
    CUDA_GEMV_ROWS8,
    CUDA_GEMV_STREAM,
    CUDA_GEMV_RING,
    CUDA_GEMV_BULK,
    CUDA_GEMV_MMA1,
    CUDA_GEMV_MMA2,
    CUDA_GEMV_TC,
    CUDA_GEMV_WG,
    CUDA_GEMV_N_KERNELS
} cuda_gemv_kernel_t;

/* Scratch of the split-K variants (tc), owned by the caller and used by
 * one stream at a time: d_part (part_bytes) for f32 partial tiles, d_cnt
 * n_cnt ints that must be zero before the first launch (every launch
 * leaves them zero).  NULL (or NULL members): no split. */
typedef struct {
    float *d_part;
    size_t part_bytes;
    int *d_cnt;
    int n_cnt;
} cuda_gemv_ws_t;

/* "rows", "rows8", ... (NULL when out of range). */
const char *cuda_gemv_kernel_name(cuda_gemv_kernel_t k);
/* The variant called `name`, or -1. */
int cuda_gemv_kernel_by_name(const char *name);

/* True when variant k handles the shape (bf16 x and w; per-variant limits
 * on n_tok and n_in, see gemv.cu). */
bool cuda_gemv_kernel_ok(cuda_gemv_kernel_t k, int n_tok, int n_out,
                         int n_in, cuda_dtype_t in_dt);

/* y (n_tok, n_out) [+]= x (n_tok, n_in) . w (n_out, n_in)^T with variant
 * k: bf16 inputs, f32 accumulation, y in out_dt.  ws: split-K scratch
 * (may be NULL; only tc uses it). */
bt_status_t cuda_gemv_run(cuda_gemv_kernel_t k, int n_tok, int n_out,
                          int n_in, const void *d_x, const void *d_w,
                          void *d_y, cuda_dtype_t out_dt, bool accumulate,
                          const cuda_gemv_ws_t *ws, cudaStream_t stream);

/* The tc and wg variants (gemv_tc.cu): tc is true for
 * 1..CUDA_GEMV_MMA_MAX_TOK tokens and n_in % 64 == 0, wg the same for
 * 1..CUDA_GEMV_WG_MAX_TOK tokens only where cuda_wgmma_available()
 * (kernels/wgmma.cuh); the launch (wgmma: the wg variant; errors of the
 * launch itself are left for cudaGetLastError); their shared-memory
 * limits, outside capture. */
bool cuda_gemv_tc_ok(int n_tok, int n_out, int n_in);
bool cuda_gemv_wg_ok(int n_tok, int n_out, int n_in);
cudaError_t cuda_gemv_tc(int n_tok, int n_out, int n_in, const void *d_x,
                         const void *d_w, void *d_y, cuda_dtype_t out_dt,
                         bool accumulate, bool wgmma,
                         const cuda_gemv_ws_t *ws, cudaStream_t stream);
cudaError_t cuda_gemv_tc_prepare(void);

/* Raises the shared-memory limit of the ring/bulk/mma kernels on the
 * current device (also done lazily at their first launch); call outside
 * stream capture. */
bt_status_t cuda_gemv_prepare(void);

/* Fills n bf16 values at d with a deterministic pseudo-random pattern in
 * [-1, 1) (autotuning inputs: never zeros). */
bt_status_t cuda_gemv_fill(void *d, size_t n, uint32_t seed,
                           cudaStream_t stream);

/* The autotuner's lead (gemm.c, gemm_lead_t): a small kernel of the
 * shape that precedes a skinny product in a decode step (one block per
 * row reading n f32, writing n bf16: an RMSNorm's traffic), timed in a
 * graph ahead of each candidate.  It never triggers its dependents early,
 * so a GEMV variant launched with PDL behind it gains nothing from the
 * early start it may or may not get in the step (round 22: a lead that
 * triggered at once credited the tc GEMV with time it did not win behind
 * the attention, and batch 8 lost). */
bt_status_t cuda_gemv_tune_lead(const float *d_x, int n_rows, int n,
                                void *d_y, cudaStream_t stream);

/* Difference of two device outputs of n elements in dt, for the
 * autotuner's check: writes {sum (y - ref)^2, sum ref^2, non-finite count
 * of y} to d_acc[3] (device doubles) on `stream`. */
bt_status_t cuda_gemv_rel_err(const void *d_y, const void *d_ref, size_t n,
                              cuda_dtype_t dt, double *d_acc,
                              cudaStream_t stream);

/* True when cuda_gemv handles the shape: bf16 inputs, n_in % 8 == 0,
 * 1 <= n_tok <= CUDA_GEMV_MAX_TOK. */
bool cuda_gemv_ok(int n_tok, int n_in, cuda_dtype_t in_dt);

/* The rows kernel: y (n_tok, n_out) [+]= x .
 * w^T, bf16 inputs, f32 accumulation, y in out_dt. */
bt_status_t cuda_gemv(int n_tok, int n_out, int n_in, const void *d_x,
                      const void *d_w, void *d_y, cuda_dtype_t out_dt,
                      bool accumulate, cudaStream_t stream);

/* True when cuda_gemv_norm handles the shape and the fusion is selected:
 * 1 <= n_tok <= CUDA_GEMV_MAX_TOK, n_tok * n_in bf16 <= 48 KB, and
 * BT_GEMV_NORM unset (the rows kernel, n_in % 8 == 0: the default) or
 * "1"/"ring" (ring kernel, n_in % 256 == 0); BT_GEMV_NORM=0: false. */
bool cuda_gemv_norm_ok(int n_tok, int n_in);

/* RMSNorm fused into the GEMV input (decode steps): y (n_tok, n_out) =
 * xn . w^T with xn = bf16(g * (x * 1 / sqrtf(mean(x^2) + eps))) computed
 * per block from the f32 residual rows x (n_tok, n_in) exactly as
 * cuda_rmsnorm() (no add) would; g and w bf16, y in out_dt.  At one
 * token each thread keeps its x chunks in registers from the sum of
 * squares to the scaling. */
bt_status_t cuda_gemv_norm(int n_tok, int n_out, int n_in, const float *d_x,
                           const void *d_g, float eps, const void *d_w,
                           void *d_y, cuda_dtype_t out_dt,
                           cudaStream_t stream);

/* cuda_gemv_norm with SwiGLU fused into its output (decode steps of 1-2
 * tokens): d_w is the fused gate|up matrix (2 n_hid, n_in) and d_h (n_tok,
 * n_hid) bf16 gets silu(g) * u of the bf16-rounded products g, u -- bit
 * for bit what cuda_gemv_norm into (n_tok, 2 n_hid) then cuda_swiglu
 * give.  At 1 token two warps of a block take a pair's gate and up rows,
 * at 2 one warp both (BT_GEMV_GLU=pair / warp force one).  _ok: the rows
 * kernel runs cuda_gemv_norm (BT_GEMV_NORM unset), n_in / 8 is a multiple
 * of 128, BT_GEMV_GLU is not "0". */
bool cuda_gemv_norm_glu_ok(int n_tok, int n_in);
bt_status_t cuda_gemv_norm_glu(int n_tok, int n_hid, int n_in,
                               const float *d_x, const void *d_g, float eps,
                               const void *d_w, void *d_h,
                               cudaStream_t stream);

/* Evicts L2 before a timed run by streaming through d_buf (bytes, larger
 * than L2) with a read-only kernel, so the lines left behind are clean as
 * inside a decode step, where the kernel before a GEMM read its weights
 * (a memset would leave dirty lines whose write-back the timed kernel
 * pays). */
bt_status_t cuda_l2_flush(void *d_buf, size_t bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_GEMV_H */
