/* gemm_ref.c - CPU reference of worker_gemm(): y (t, o) [+]= x (t, i) .
 * w (o, i)^T, double accumulation.  Eight independent partial sums a dot
 * product: one dependent chain of double adds made the 128-token,
 * 14336-wide test cases take seconds each (test_gemm outran a device
 * step's timeout); the order changes rounding only at ~1e-16. */
#include <stddef.h>

#include "kernels_ref.h"

static double dot8(const float *a, const float *b, int n)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;

    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += (double)a[i + k] * b[i + k];
    for (; i < n; i++)
        s[0] += (double)a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void gemm_ref(int n_tok, int n_out, int n_in, const float *x, const float *w,
              float *y, int accumulate)
{
    for (int o = 0; o < n_out; o++) {
        const float *wr = w + (size_t)o * n_in; /* stays in cache */
        for (int t = 0; t < n_tok; t++) {
            double acc = accumulate ? y[(size_t)t * n_out + o] : 0.0;
            acc += dot8(x + (size_t)t * n_in, wr, n_in);
            y[(size_t)t * n_out + o] = (float)acc;
        }
    }
}
