/*
 * cpu_round.c - bf16 rounding of float32 arrays: the cpu backend's bf16
 * precision mode keeps its float32 buffers but rounds them wherever the
 * CUDA backend stores bf16, so that it is a same-precision reference for
 * the GPU rather than only a float32 one.
 */
#include "cpu_int.h"
#include "model/model.h"

void cpu__round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = model_bf16_to_f32(model_f32_to_bf16(x[i]));
}

void cpu__round_bf16_rows(float *x, size_t ld, int n_rows, int n_cols)
{
    for (int r = 0; r < n_rows; r++)
        cpu__round_bf16(x + (size_t)r * ld, (size_t)n_cols);
}
