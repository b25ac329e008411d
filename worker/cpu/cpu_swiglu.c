/*
 * cpu_swiglu.c - the SwiGLU gate of the Llama feed-forward block.
 *
 * The backend fuses the gate and up projections into one matrix whose
 * rows alternate gate_i, up_i, so one matmul produces both and any
 * thread's slice of output rows holds matching gate/up pairs.
 */
#include "cpu_int.h"

void cpu__swiglu(float *out, const float *gu, int n, float *tmp)
{
    for (int i = 0; i < n; i++)
        tmp[i] = -gu[2 * i];
    cpu__exp_inplace(tmp, n);
    for (int i = 0; i < n; i++)
        out[i] = gu[2 * i] / (1.0f + tmp[i]) * gu[2 * i + 1];
}
