/*
 * gemv_mlp.h - the SwiGLU MLP of a decode step of 1-2 tokens as one
 * kernel (gemv_mlp.cu):
 *   x += down(silu(gate(n)) * up(n)),  n = rmsnorm(x) . g
 * where today's path runs two rows GEMVs (gate|up with the norm and the
 * SwiGLU fused in, then down).  One persistent grid streams both weight
 * matrices with a grid-wide barrier between them instead of a kernel
 * boundary: every block is resident from the start, so a warp's first
 * down rows load while the slowest warps finish gate|up (at a kernel
 * boundary the down GEMV's blocks could only start as gate|up's blocks
 * exited).  The arithmetic is the rows kernel's, so x and h come out bit
 * for bit as cuda_gemv_norm_glu then the rows GEMV give.
 */
#ifndef BT_WORKER_CUDA_KERNELS_GEMV_MLP_H
#define BT_WORKER_CUDA_KERNELS_GEMV_MLP_H

#include <stdbool.h>
#include <stdio.h>

#include "../cuda_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when cuda_gemv_mlp handles the shape and is selected: 1-2 tokens,
 * n_in (the model width) and n_hid multiples of 1024 (every 128-chunk
 * step of a warp stays inside one row), n_tok * n_in bf16 <= 40 KB of
 * shared memory, BT_GEMV_MLP not "0" (read at each call). */
bool cuda_gemv_mlp_ok(int n_tok, int n_hid, int n_in);

/* The MLP of n_tok tokens: x (n_tok, n_in) f32 residual rows, g the bf16
 * norm weights, w_gu the fused (2 n_hid, n_in) gate|up matrix, w_down
 * (n_in, n_hid); h (n_tok, n_hid) bf16 scratch (left holding the SwiGLU
 * output).  accumulate: x += the down product, else x = it (tensor-
 * parallel ranks past the first).  d_bar: CUDA_GEMV_MLP_BAR_WORDS
 * unsigned ints, zero before the first launch; every launch leaves them
 * so (the grid barrier's arrival count and generation); one launch at a
 * time may use them. */
#define CUDA_GEMV_MLP_BAR_WORDS 64
bt_status_t cuda_gemv_mlp(int n_tok, int n_hid, int n_in, float *d_x,
                          const void *d_g, float eps, const void *d_w_gu,
                          const void *d_w_down, void *d_h, bool accumulate,
                          unsigned *d_bar, cudaStream_t stream);

/* The grid cuda_gemv_mlp launches for the shape (blocks, all resident on
 * the current device), 0 when none fits; for tests and logs. */
int cuda_gemv_mlp_blocks(int n_tok, int n_hid, int n_in);

/* With BT_GEMV_MLP_PROF=1 each launch records per-block phase times;
 * this prints the last launch's spread (host; synchronizes). */
void cuda_gemv_mlp_prof_print(FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_GEMV_MLP_H */
