/*
 * cpu_fp8.c - the FP8 (E4M3, common/bt_fp8.h) ops of the cpu backend's
 * precision fp8, and a plain reference of the whole FP8 GEMM from codes
 * that the cpu path and the CUDA FP8 kernels are both tested against
 * (tests/cpu/test_cpu_ops.c).
 *
 * The GEMM they define: y[t, n] = (sum_j xq[t, j] * wq[n, j]) * xs[t] *
 * ws[n] (+ bias[n]), xq and wq E4M3 values, the sum in float32 (every
 * product of two E4M3 values is exact in float32), xs the input scale
 * (static per tensor, or absmax / 448 of the row), ws the weight scale
 * of the output row.
 */
#include <math.h>

#include "bt_fp8.h"
#include "cpu_int.h"

void cpu__fp8_quant_rows(float *xq, float *xs, const float *x, int ldx,
                         int n_tok, int k, float in_scale)
{
    for (int t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * ldx;
        float *q = xq + (size_t)t * k;
        float s = in_scale, inv;

        if (s == 0.0f) {
            float amax = 0.0f;

            for (int i = 0; i < k; i++)
                amax = fmaxf(amax, fabsf(xr[i]));
            s = bt_fp8_scale(amax);
        }
        inv = 1.0f / s;
        for (int i = 0; i < k; i++)
            q[i] = bt_fp8_round(xr[i] * inv);
        xs[t] = s;
    }
}

void cpu__fp8_epilogue(float *out, int ldo, const float *acc, int lda,
                       const float *xs, const float *ws, const float *bias,
                       int n_tok, int n0, int n1, bool accumulate)
{
    for (int t = 0; t < n_tok; t++) {
        const float *a = acc + (size_t)t * lda;
        float *o = out + (size_t)t * ldo;

        for (int n = n0; n < n1; n++) {
            float v = a[n] * xs[t] * ws[n];

            if (bias != NULL)
                v += bias[n];
            if (accumulate)
                o[n] += v;
            else
                o[n] = v;
        }
    }
}

void cpu__fp8_gemm_ref(float *out, const uint8_t *xq, const float *xs,
                       const uint8_t *wq, const float *ws, int n_ws,
                       int n_tok, int k, int n_out)
{
    for (int t = 0; t < n_tok; t++) {
        for (int n = 0; n < n_out; n++) {
            double sum = 0.0;

            for (int j = 0; j < k; j++)
                sum += (double)bt_e4m3_to_f32(xq[(size_t)t * k + j]) *
                       (double)bt_e4m3_to_f32(wq[(size_t)n * k + j]);
            out[(size_t)t * n_out + n] =
                (float)(sum * xs[t] * ws[n_ws == 1 ? 0 : n]);
        }
    }
}
