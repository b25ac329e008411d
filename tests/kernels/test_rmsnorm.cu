/*
 * test_rmsnorm.cu - cuda_rmsnorm() (with and without the fused residual
 * add, and the row gather) against rmsnorm_ref(), both dtypes, odd sizes,
 * outputs poisoned first.
 * Run: build-cuda/gpu/test_rmsnorm   (make gpu-test)
 */
#include "kernels/rmsnorm.h"
#include "kernels_ref.h"
#include "kt_common.h"

int main(void)
{
    const int shapes[][2] = {{1, 64}, {7, 4096}, {33, 129}, {300, 1000},
                             {5, 8192},
                             {2048, 4096}, {3, 12}, {2, 6144}};
    kt_seed(2);
    /* the vector kernel where dim % 4 == 0, else the scalar one */
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
                snprintf(what, sizeof(what), "rmsnorm %s %s n=%d dim=%d",
                         kt_dt_name(dt),
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
    return kt_finish("test_rmsnorm");
}
