/*
 * cpu_swiglu.c - the SwiGLU gate of the Llama feed-forward block.
 *
 * The backend fuses the gate and up projections into one matrix whose
 * rows alternate gate_i, up_i, so one matmul produces both and any
 * thread's slice of output rows holds matching gate/up pairs.
 */
#include <math.h>

#include "cpu_int.h"

void cpu__swiglu(float *out, const float *gu, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gu[2 * i];

        out[i] = g * (1.0f / (1.0f + expf(-g))) * gu[2 * i + 1];
    }
}
