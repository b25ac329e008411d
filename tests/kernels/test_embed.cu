/*
 * test_embed.cu - cuda_embed() against embed_ref() on random tables, odd
 * sizes, both dtypes, output poisoned first.
 * Run: build-cuda/gpu/test_embed   (make gpu-test runs every kernel test)
 */
#include "kernels/embed.h"
#include "kernels_ref.h"
#include "kt_common.h"

int main(void)
{
    const int shapes[][3] = {{512, 64, 7}, {1000, 4096, 33}, {37, 129, 1},
                             {128256, 4096, 64}};
    kt_seed(1);
    for (int dti = 0; dti < 2; dti++) {
        cuda_dtype_t dt = dti ? CUDA_DT_BF16 : CUDA_DT_F32;
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int vocab = shapes[s][0], dim = shapes[s][1], n = shapes[s][2];
            float *table = kt_rand_vec((size_t)vocab * dim, -1, 1, dt);
            int *ids = (int *)malloc(sizeof(int) * n);
            for (int i = 0; i < n; i++)
                ids[i] = (int)(kt_u32() % vocab);
            ids[0] = vocab - 1;
            float *ref = (float *)malloc(sizeof(float) * n * dim);
            embed_ref(table, ids, n, dim, ref);
            void *d_table = kt_upload(table, (size_t)vocab * dim, dt);
            int *d_ids = (int *)kt_upload_raw(ids, sizeof(int) * n);
            float *d_out = (float *)kt_poisoned((size_t)n * dim, CUDA_DT_F32);
            KT_OK(cuda_embed(d_table, dt, d_ids, n, dim, d_out, 0));
            float *out = kt_download(d_out, (size_t)n * dim, CUDA_DT_F32);
            char what[96];
            snprintf(what, sizeof(what), "embed %s vocab=%d dim=%d n=%d",
                     kt_dt_name(dt), vocab, dim, n);
            kt_compare(what, out, ref, (size_t)n * dim, 0.0);
            cudaFree(d_table);
            cudaFree(d_ids);
            cudaFree(d_out);
            free(table);
            free(ids);
            free(ref);
            free(out);
        }
    }
    return kt_finish("test_embed");
}
