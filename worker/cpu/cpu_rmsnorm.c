/*
 * cpu_rmsnorm.c - RMSNorm with the weight multiplied in (Llama pre-norm).
 */
#include <math.h>

#include "cpu_int.h"

void cpu__rmsnorm(float *out, const float *x, const float *weight, int dim,
                  float eps)
{
    float acc[8] = { 0 };
    float ss = 0.0f;
    float scale;
    int j = 0;

    /* 8 independent partial sums: vectorizable without -ffast-math. */
    for (; j + 8 <= dim; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += x[j + l] * x[j + l];
    for (; j < dim; j++)
        acc[j & 7] += x[j] * x[j];
    for (int l = 0; l < 8; l++)
        ss += acc[l];
    scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (j = 0; j < dim; j++)
        out[j] = weight[j] * (scale * x[j]);
}
