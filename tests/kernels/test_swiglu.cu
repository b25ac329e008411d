/*
 * test_swiglu.cu - cuda_swiglu() against swiglu_ref(), both dtypes, odd
 * and vector-friendly sizes (a 2048-token prefill), outputs poisoned
 * first.
 * Run: build-cuda/gpu/test_swiglu   (make gpu-test)
 */
#include "kernels/swiglu.h"
#include "kernels_ref.h"
#include "kt_common.h"

int main(void)
{
    const int shapes[][2] = {{1, 172}, {7, 14336}, {33, 129}, {64, 1000},
                             {3, 8}, {2048, 14336}, {513, 1032},
                             {5, 2056}};
    kt_seed(3);
    for (int dti = 0; dti < 2; dti++) {
        cuda_dtype_t dt = dti ? CUDA_DT_BF16 : CUDA_DT_F32;
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int n = shapes[s][0], hid = shapes[s][1];
            size_t nh = (size_t)n * hid;
            float *gu = kt_rand_vec(2 * nh, -4, 4, dt);
            float *ref = (float *)malloc(sizeof(float) * nh);
            void *d_gu = kt_upload(gu, 2 * nh, dt);
            void *d_out = kt_poisoned(nh, dt);
            swiglu_ref(gu, n, hid, ref);
            KT_OK(cuda_swiglu(d_gu, n, hid, d_out, dt, 0));
            float *out = kt_download(d_out, nh, dt);
            char what[96];
            snprintf(what, sizeof(what), "swiglu %s n=%d hidden=%d",
                     kt_dt_name(dt), n, hid);
            kt_compare(what, out, ref, nh, dt == CUDA_DT_F32 ? 1e-6 : 4e-3);
            cudaFree(d_gu);
            cudaFree(d_out);
            free(gu); free(ref); free(out);
        }
    }
    return kt_finish("test_swiglu");
}
