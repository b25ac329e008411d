/* swiglu_ref.c - CPU reference of cuda_swiglu() (llama2.c). */
#include <math.h>

#include "kernels_ref.h"

void swiglu_ref(const float *gu, int n, int hidden, float *out)
{
    for (int t = 0; t < n; t++) {
        const float *row = gu + (size_t)t * 2 * hidden;
        for (int j = 0; j < hidden; j++) {
            float g = row[j];
            out[(size_t)t * hidden + j] =
                g * (1.0f / (1.0f + expf(-g))) * row[hidden + j];
        }
    }
}
