/*
 * test_sample.cu - cuda_argmax() against argmax_ref() on random rows,
 * rows with ties (lowest index wins) and odd vocabulary sizes.
 * Run: build-cuda/gpu/test_sample   (make gpu-test)
 */
#include "kernels/sample.h"
#include "kernels_ref.h"
#include "kt_common.h"

int main(void)
{
    const int shapes[][2] = {{1, 512}, {7, 32000}, {64, 128256}, {3, 5}};
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
        if (bad)
            kt_failures++;
        cudaFree(d_lg);
        cudaFree(d_ids);
        free(lg); free(ids);
    }
    return kt_finish("test_sample");
}
