/* attn_ref.c - CPU reference of the paged attention kernels
 * (attn_decode.cu and attn_prefill.cu): plain softmax in double. */
#include <math.h>
#include <stdlib.h>

#include "kernels_ref.h"

void attn_ref(int nh, int nkv, int hd, int block_size, float scale,
              const float *q, const float *k_cache, const float *v_cache,
              const int *block_tables, const uint8_t *masks,
              const int *kv_len, const int *bt_off, const int *ctx_len,
              const int *mask_off, int n_tokens, float *out)
{
    int group = nh / nkv;

    for (int t = 0; t < n_tokens; t++) {
        int n = kv_len[t];
        double *sc = malloc(sizeof(double) * (n > 0 ? n : 1));
        for (int h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)t * nh + h) * hd;
            int kvh = h / group;
            double mx = -INFINITY, sum = 0.0;
            float *o = out + ((size_t)t * nh + h) * hd;

            for (int s = 0; s < n; s++) {
                const int *bt = block_tables + bt_off[t];
                size_t slot = (size_t)bt[s / block_size] * block_size +
                              s % block_size;
                const float *k = k_cache + (slot * nkv + kvh) * hd;
                double d = 0.0;

                if (mask_off[t] >= 0 && s >= ctx_len[t] &&
                    !masks[mask_off[t] + s - ctx_len[t]]) {
                    sc[s] = -INFINITY;
                    continue;
                }
                for (int e = 0; e < hd; e++)
                    d += (double)qh[e] * k[e];
                sc[s] = d * scale;
                if (sc[s] > mx)
                    mx = sc[s];
            }
            for (int e = 0; e < hd; e++)
                o[e] = 0.0f;
            if (mx == -INFINITY)
                continue;
            for (int s = 0; s < n; s++) {
                sc[s] = sc[s] == -INFINITY ? 0.0 : exp(sc[s] - mx);
                sum += sc[s];
            }
            for (int e = 0; e < hd; e++) {
                double acc = 0.0;
                for (int s = 0; s < n; s++) {
                    const int *bt = block_tables + bt_off[t];
                    size_t slot = (size_t)bt[s / block_size] * block_size +
                                  s % block_size;
                    if (sc[s] != 0.0)
                        acc += sc[s] * v_cache[(slot * nkv + kvh) * hd + e];
                }
                o[e] = (float)(acc / sum);
            }
        }
        free(sc);
    }
}
