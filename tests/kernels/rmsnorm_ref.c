/* rmsnorm_ref.c - CPU reference of cuda_rmsnorm() (llama2.c rmsnorm). */
#include <math.h>

#include "kernels_ref.h"

void rmsnorm_ref(float *x, const float *add, const float *w, const int *rows,
                 int n_rows, int dim, float eps, float *out)
{
    for (int r = 0; r < n_rows; r++) {
        int src = rows ? rows[r] : r;
        float *xr = x + (size_t)src * dim;
        float ss = 0.0f;

        if (add)
            for (int i = 0; i < dim; i++)
                xr[i] += add[(size_t)src * dim + i];
        for (int i = 0; i < dim; i++)
            ss += xr[i] * xr[i];
        ss = 1.0f / sqrtf(ss / dim + eps);
        for (int i = 0; i < dim; i++)
            out[(size_t)r * dim + i] = w[i] * (ss * xr[i]);
    }
}
