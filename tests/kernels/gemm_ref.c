/* gemm_ref.c - CPU reference of worker_gemm(): y (t, o) [+]= x (t, i) .
 * w (o, i)^T, double accumulation. */
#include <stddef.h>

#include "kernels_ref.h"

void gemm_ref(int n_tok, int n_out, int n_in, const float *x, const float *w,
              float *y, int accumulate)
{
    for (int t = 0; t < n_tok; t++)
        for (int o = 0; o < n_out; o++) {
            double acc = accumulate ? y[(size_t)t * n_out + o] : 0.0;
            for (int i = 0; i < n_in; i++)
                acc += (double)x[(size_t)t * n_in + i] *
                       w[(size_t)o * n_in + i];
            y[(size_t)t * n_out + o] = (float)acc;
        }
}
