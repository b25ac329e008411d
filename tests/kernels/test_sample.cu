/*
 * test_sample.cu - cuda_argmax() against argmax_ref() on random rows,
 * rows with ties (lowest index wins) and odd vocabulary sizes; and
 * cuda_sample_top() (top-k candidates + normalizer, chosen rows of a
 * strided buffer) against sample_top_ref(): ids and values exactly,
 * the normalizer within 1e-6 relative, with odd vocabularies, k above
 * the vocabulary, many ties at the k-th value, NaN and -inf entries.
 * Run: build-cuda/gpu/test_sample   (make gpu-test)
 */
#include "kernels/sample.h"
#include "kernels_ref.h"
#include "kt_common.h"

/* One cuda_sample_top case: n rows picked in reverse from a (2n, ld)
 * buffer. */
static void check_top(int n, int vocab, int k, int mode)
{
    size_t ld = (size_t)vocab + 3;
    float *lg = kt_rand_vec(2 * (size_t)n * ld, -8, 8, CUDA_DT_F32);
    int *rows = (int *)malloc(sizeof(int) * n);
    float *inv_t = (float *)malloc(sizeof(float) * n);
    int *ids = (int *)malloc(sizeof(int) * (size_t)n * k);
    float *vals = (float *)malloc(sizeof(float) * (size_t)n * k);
    double *sums = (double *)malloc(sizeof(double) * n);
    int *rid = (int *)malloc(sizeof(int) * k);
    float *rval = (float *)malloc(sizeof(float) * k);
    int kk = k < vocab ? k : vocab, bad = 0;

    for (int i = 0; i < n; i++) {
        float *row;
        rows[i] = 2 * n - 1 - 2 * i;
        inv_t[i] = 1.0f / (0.3f + 0.2f * (float)(i % 7));
        row = lg + (size_t)rows[i] * ld;
        if (mode == 1) /* coarse values: many ties everywhere */
            for (int j = 0; j < vocab; j++)
                row[j] = (float)((int)(row[j] * 2.0f)) * 0.5f;
        if (mode == 2 && vocab > 8) { /* NaN, -inf, a huge tie at top */
            row[3] = NAN;
            row[vocab - 2] = -INFINITY;
            for (int j = 0; j < vocab; j += 5)
                row[j] = 9.0f;
        }
    }
    float *d_lg = (float *)kt_upload(lg, 2 * (size_t)n * ld, CUDA_DT_F32);
    int *d_rows = (int *)kt_upload_raw(rows, sizeof(int) * n);
    float *d_it = (float *)kt_upload_raw(inv_t, sizeof(float) * n);
    int *d_ids = (int *)kt_poisoned((size_t)n * k, CUDA_DT_F32);
    float *d_vals = (float *)kt_poisoned((size_t)n * k, CUDA_DT_F32);
    double *d_sums = NULL;
    void *d_ws = NULL;
    KT_CUDA(cudaMalloc(&d_sums, sizeof(double) * n));
    KT_CUDA(cudaMalloc(&d_ws, cuda_sample_top_ws_bytes(n, vocab)));
    KT_OK(cuda_sample_top(d_lg, ld, d_rows, n, vocab, d_it, k, d_ids,
                          d_vals, d_sums, d_ws, 0));
    KT_CUDA(cudaDeviceSynchronize());
    KT_CUDA(cudaMemcpy(ids, d_ids, sizeof(int) * n * k,
                       cudaMemcpyDeviceToHost));
    KT_CUDA(cudaMemcpy(vals, d_vals, sizeof(float) * n * k,
                       cudaMemcpyDeviceToHost));
    KT_CUDA(cudaMemcpy(sums, d_sums, sizeof(double) * n,
                       cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        double rs;
        sample_top_ref(lg + (size_t)rows[i] * ld, vocab, inv_t[i], k, rid,
                       rval, &rs);
        for (int j = 0; j < kk; j++) {
            float v = vals[(size_t)i * k + j];
            if (ids[(size_t)i * k + j] != rid[j] ||
                (v != rval[j] && !(isnan(v) && isnan(rval[j])))) {
                if (bad++ < 5)
                    printf("  row %d cand %d: got (%d, %g), want (%d, %g)\n",
                           i, j, ids[(size_t)i * k + j], v, rid[j], rval[j]);
            }
        }
        if (!(fabs(sums[i] - rs) <= 1e-6 * rs)) {
            if (bad++ < 5)
                printf("  row %d: sum %.9g, want %.9g\n", i, sums[i], rs);
        }
    }
    printf("%s sample_top rows=%d vocab=%d k=%d mode=%d\n",
           bad ? "FAIL" : "PASS", n, vocab, k, mode);
    if (bad)
        kt_failures++;
    cudaFree(d_lg); cudaFree(d_rows); cudaFree(d_it); cudaFree(d_ids);
    cudaFree(d_vals); cudaFree(d_sums); cudaFree(d_ws);
    free(lg); free(rows); free(inv_t); free(ids); free(vals); free(sums);
    free(rid); free(rval);
}

int main(void)
{
    const int top_shapes[][3] = {{1, 512, 256}, {5, 32000, 256},
                                 {64, 128256, 256}, {3, 5, 256},
                                 {4, 1000, 1}, {7, 257, 64},
                                 {2, 151936, 100}, {3, 4099, 256}};
    const int shapes[][2] = {{1, 512}, {7, 32000}, {64, 128256}, {3, 5},
                             {5, 4099}, {2, 151936}, {128, 128256},
                             {1, 128256}};
    kt_seed(4);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], vocab = shapes[s][1];
        float *lg = kt_rand_vec((size_t)n * vocab, -10, 10, CUDA_DT_F32);
        int *ids = (int *)malloc(sizeof(int) * n);
        int bad = 0;
        /* Row 0 gets a tie between two late indices. */
        if (vocab > 4)
            lg[vocab - 1] = lg[vocab - 3] = 100.0f;
        float *d_lg = (float *)kt_upload(lg, (size_t)n * vocab, CUDA_DT_F32);
        int *d_ids = NULL;
        KT_CUDA(cudaMalloc(&d_ids, sizeof(int) * n));
        KT_CUDA(cudaMemset(d_ids, 0xFF, sizeof(int) * n));
        KT_OK(cuda_argmax(d_lg, n, vocab, d_ids, 0));
        KT_CUDA(cudaMemcpy(ids, d_ids, sizeof(int) * n,
                           cudaMemcpyDeviceToHost));
        for (int r = 0; r < n; r++) {
            int want = argmax_ref(lg + (size_t)r * vocab, vocab);
            if (ids[r] != want && bad++ < 10)
                printf("  row %d: got %d, want %d\n", r, ids[r], want);
        }
        printf("%s argmax rows=%d vocab=%d first ids %d %d\n",
               bad ? "FAIL" : "PASS", n, vocab, ids[0], n > 1 ? ids[1] : -1);
        if (vocab == 128256 && (n == 1 || n == 64)) {
            kt_timer_start();
            for (int it = 0; it < 20; it++)
                KT_OK(cuda_argmax(d_lg, n, vocab, d_ids, 0));
            printf("INFO argmax rows=%d vocab=%d: %.1f us a call\n", n,
                   vocab, kt_timer_us(20));
        }
        if (bad)
            kt_failures++;
        cudaFree(d_lg);
        cudaFree(d_ids);
        free(lg); free(ids);
    }
    for (size_t s = 0; s < sizeof(top_shapes) / sizeof(top_shapes[0]); s++)
        for (int mode = 0; mode < 3; mode++)
            check_top(top_shapes[s][0], top_shapes[s][1], top_shapes[s][2],
                      mode);
    return kt_finish("test_sample");
}
