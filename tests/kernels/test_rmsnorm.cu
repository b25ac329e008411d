/*
 * test_rmsnorm.cu - cuda_rmsnorm() (with and without the fused residual
 * add, and the row gather) against rmsnorm_ref(), both dtypes, odd sizes,
 * outputs poisoned first; cuda_rmsnorm_parts() (split-K partials summed
 * into x, then the norm, or the sum alone) against the same reference.
 * Run: build-cuda/gpu/test_rmsnorm   (make gpu-test)
 */
#include "kernels/rmsnorm.h"
#include "kernels_ref.h"
#include "kt_common.h"

/* cuda_rmsnorm_parts: x += the n_part partials (slices stride floats
 * apart), then out = rmsnorm(x) (or no output). */
static void test_parts(void)
{
    /* n, dim, n_part; dim 129 / 12 % 8: the scalar kernel, 4096: vector */
    const int shapes[][3] = {{64, 4096, 4}, {7, 4096, 2}, {33, 129, 3},
                             {3, 12, 1}, {5, 8192, 8}, {128, 4096, 6},
                             {2, 64, 0}};
    for (int dti = 0; dti < 2; dti++) {
        cuda_dtype_t dt = dti ? CUDA_DT_BF16 : CUDA_DT_F32;
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
            for (int with_out = 0; with_out < 2; with_out++) {
                const int n = shapes[k][0], dim = shapes[k][1];
                const int np = shapes[k][2];
                const size_t nd = (size_t)n * dim, stride = nd + 4;
                float *x = kt_rand_vec(nd, -2, 2, CUDA_DT_F32);
                float *part = kt_rand_vec(stride * (np ? np : 1), -1, 1,
                                          CUDA_DT_F32);
                float *w = kt_rand_vec(dim, 0.5f, 1.5f, dt);
                float *xs = (float *)malloc(sizeof(float) * nd);
                float *ref = (float *)malloc(sizeof(float) * nd);
                for (size_t i = 0; i < nd; i++) {
                    float v = x[i];
                    for (int p = 0; p < np; p++)
                        v += part[p * stride + i];
                    xs[i] = v;
                }
                rmsnorm_ref(xs, NULL, w, NULL, n, dim, 1e-5f, ref);
                float *d_x = (float *)kt_upload(x, nd, CUDA_DT_F32);
                float *d_part = (float *)kt_upload(
                    part, stride * (np ? np : 1), CUDA_DT_F32);
                void *d_w = kt_upload(w, dim, dt);
                void *d_out = kt_poisoned(nd, dt);

                KT_OK(cuda_rmsnorm_parts(d_x, d_part, np, stride, d_w, n, dim,
                                         1e-5f, with_out ? d_out : NULL, dt,
                                         0));
                float *xo = kt_download(d_x, nd, CUDA_DT_F32);
                char what[96];
                snprintf(what, sizeof(what), "rmsnorm_parts x %s n=%d dim=%d "
                         "parts=%d%s", kt_dt_name(dt), n, dim, np,
                         with_out ? "" : " (no norm)");
                kt_compare(what, xo, xs, nd, 1e-6);
                if (with_out) {
                    float *out = kt_download(d_out, nd, dt);
                    snprintf(what, sizeof(what), "rmsnorm_parts out %s n=%d "
                             "dim=%d parts=%d", kt_dt_name(dt), n, dim, np);
                    kt_compare(what, out, ref, nd,
                               dt == CUDA_DT_F32 ? 1e-5 : 4e-3);
                    free(out);
                }
                cudaFree(d_x);
                cudaFree(d_part);
                cudaFree(d_w);
                cudaFree(d_out);
                free(x); free(part); free(w); free(xs); free(ref); free(xo);
            }
        }
    }
}

int main(void)
{
    const int shapes[][2] = {{1, 64}, {7, 4096}, {33, 129}, {300, 1000},
                             {5, 8192},
                             {2048, 4096}, {3, 12}, {2, 6144}};
    kt_seed(2);
    /* pass 0: the default (vector kernel where dim % 4 == 0), pass 1:
     * BT_RMSNORM_VEC=0 (scalar kernel everywhere). */
    for (int pass = 0; pass < 2; pass++) {
    if (pass)
        setenv("BT_RMSNORM_VEC", "0", 1);
    for (int dti = 0; dti < 2; dti++) {
        cuda_dtype_t dt = dti ? CUDA_DT_BF16 : CUDA_DT_F32;
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            for (int mode = 0; mode < 3; mode++) { /* plain, add, gather */
                int n = shapes[s][0], dim = shapes[s][1];
                size_t nd = (size_t)n * dim;
                float *x = kt_rand_vec(nd, -2, 2, CUDA_DT_F32);
                float *add = kt_rand_vec(nd, -1, 1, dt);
                float *w = kt_rand_vec(dim, 0.5f, 1.5f, dt);
                int n_rows = mode == 2 ? (n + 1) / 2 : n;
                int *rows = (int *)malloc(sizeof(int) * n_rows);
                for (int r = 0; r < n_rows; r++)
                    rows[r] = (r * 2 + 1) % n;
                float *ref = (float *)malloc(sizeof(float) * nd);
                float *d_x = (float *)kt_upload(x, nd, CUDA_DT_F32);
                void *d_add = kt_upload(add, nd, dt);
                void *d_w = kt_upload(w, dim, dt);
                int *d_rows = (int *)kt_upload_raw(rows, sizeof(int) * n_rows);
                void *d_out = kt_poisoned(nd, dt);

                rmsnorm_ref(x, mode == 1 ? add : NULL, w,
                            mode == 2 ? rows : NULL, n_rows, dim, 1e-5f, ref);
                KT_OK(cuda_rmsnorm(d_x, mode == 1 ? d_add : NULL, d_w,
                                   mode == 2 ? d_rows : NULL, n_rows, dim,
                                   1e-5f, d_out, dt, 0));
                float *out = kt_download(d_out, (size_t)n_rows * dim, dt);
                float *xo = kt_download(d_x, nd, CUDA_DT_F32);
                char what[96];
                snprintf(what, sizeof(what), "rmsnorm%s %s %s n=%d dim=%d",
                         pass ? " (scalar)" : "", kt_dt_name(dt),
                         mode == 0 ? "plain" : mode == 1 ? "+add" : "gather",
                         n, dim);
                /* bf16 output rounding: 2^-9 relative per element. */
                kt_compare(what, out, ref, (size_t)n_rows * dim,
                           dt == CUDA_DT_F32 ? 1e-5 : 4e-3);
                snprintf(what, sizeof(what), "rmsnorm residual x %s n=%d "
                         "dim=%d", kt_dt_name(dt), n, dim);
                kt_compare(what, xo, x, nd, 1e-7);
                cudaFree(d_x);
                cudaFree(d_add);
                cudaFree(d_w);
                cudaFree(d_rows);
                cudaFree(d_out);
                free(x); free(add); free(w); free(rows); free(ref);
                free(out); free(xo);
            }
        }
    }
    }
    unsetenv("BT_RMSNORM_VEC");
    test_parts();
    return kt_finish("test_rmsnorm");
}
