/*
 * test_topk.cu - cuda_topk_logprob() against topk_ref(): the draft
 * head's shapes (Llama-3 vocab 128256 at 1..256 rows, k 1..16), vocabs
 * that are not multiples of the slice or of 4, vocabs past 131072 (the
 * wider slices), rows full of ties (integer logits: the lower id must
 * win), NaN entries (never chosen, left out of the sum), rows with fewer
 * finite entries than k; outputs poisoned first.  Ids must be equal,
 * log-probabilities within 2e-5 + 2e-5 |ref|.  Prints the kernel time
 * at the decode shapes.
 * Run: build-cuda/gpu/test_topk   (make gpu-test)
 */
#include "kernels/draft.h"
#include "kernels_ref.h"
#include "kt_common.h"

static void check(int n, int vocab, int k, int kind)
{
    size_t nv = (size_t)n * vocab;
    float *lg = (float *)malloc(sizeof(float) * nv);
    int *ids = (int *)malloc(sizeof(int) * n * k);
    int *rids = (int *)malloc(sizeof(int) * n * k);
    float *lp = (float *)malloc(sizeof(float) * n * k);
    float *rlp = (float *)malloc(sizeof(float) * n * k);
    size_t ws = cuda_topk_logprob_ws_floats(n, vocab, k);
    void *d_lg, *d_ids, *d_lp, *d_ws;
    int bad = 0;
    const char *kinds[] = {"random", "ties", "nan", "sparse"};

    for (size_t i = 0; i < nv; i++) {
        switch (kind) {
        case 0: lg[i] = kt_uniform(-12.0f, 12.0f); break;
        case 1: lg[i] = (float)(kt_u32() % 5); break;     /* many ties */
        case 2: lg[i] = kt_u32() % 7 == 0 ? NAN : kt_uniform(-5, 5); break;
        default: lg[i] = kt_u32() % 997 == 0 ? kt_uniform(-3, 3) : NAN;
        }
    }
    if (kind == 0) /* a confident row: one spike */
        lg[(size_t)(n - 1) * vocab + vocab / 3] = 40.0f;
    d_lg = kt_upload(lg, nv, CUDA_DT_F32);
    d_ids = kt_poisoned((size_t)n * k, CUDA_DT_F32);
    d_lp = kt_poisoned((size_t)n * k, CUDA_DT_F32);
    d_ws = kt_poisoned(ws, CUDA_DT_F32);
    KT_OK(cuda_topk_logprob((const float *)d_lg, n, vocab, k, (int *)d_ids,
                            (float *)d_lp, (float *)d_ws, 0));
    KT_CUDA(cudaDeviceSynchronize());
    KT_CUDA(cudaMemcpy(ids, d_ids, sizeof(int) * n * k,
                       cudaMemcpyDeviceToHost));
    KT_CUDA(cudaMemcpy(lp, d_lp, sizeof(float) * n * k,
                       cudaMemcpyDeviceToHost));
    topk_ref(lg, n, vocab, k, rids, rlp);
    for (int i = 0; i < n * k; i++) {
        bool ok = ids[i] == rids[i] &&
                  ((isinf(rlp[i]) && lp[i] == rlp[i]) ||
                   fabsf(lp[i] - rlp[i]) <= 2e-5f + 2e-5f * fabsf(rlp[i]));
        if (!ok && bad++ < 5)
            printf("  row %d rank %d: id %d logp %.7g, want %d %.7g\n",
                   i / k, i % k, ids[i], lp[i], rids[i], rlp[i]);
    }
    printf("%s topk n=%d vocab=%d k=%d %s: %d mismatches\n",
           bad ? "FAIL" : "PASS", n, vocab, k, kinds[kind], bad);
    kt_failures += bad != 0;
    if (kind == 0 && vocab == 128256 && (n == 4 || n == 128)) {
        double us;

        kt_timer_start();
        for (int it = 0; it < 20; it++)
            KT_OK(cuda_topk_logprob((const float *)d_lg, n, vocab, k,
                                    (int *)d_ids, (float *)d_lp,
                                    (float *)d_ws, 0));
        us = kt_timer_us(20);
        printf("INFO topk n=%d vocab=%d k=%d: %.1f us a call (%.0f GB/s)\n",
               n, vocab, k, us, (double)nv * 4 / (us * 1e-6) * 1e-9);
    }
    cudaFree(d_lg);
    cudaFree(d_ids);
    cudaFree(d_lp);
    cudaFree(d_ws);
    free(lg); free(ids); free(rids); free(lp); free(rlp);
}

int main(void)
{
    const int shapes[][3] = {
        {1, 128256, 1}, {4, 128256, 4}, {128, 128256, 1}, {113, 128256, 4},
        {64, 128256, 16}, {256, 128256, 1}, {3, 32000, 8}, {2, 512, 16}, {5, 1000, 3},
        {2, 3, 3}, {7, 4097, 5}, {2, 200000, 2}, {2, 300000, 4},
        {1, 4096, 16},
    };
    kt_seed(11);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int kind = 0; kind < 4; kind++)
            check(shapes[s][0], shapes[s][1], shapes[s][2], kind);
    return kt_finish("test_topk");
}
