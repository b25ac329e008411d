/* rope_kv_ref.c - CPU reference of cuda_rope_kv(). */
#include <math.h>

#include "kernels_ref.h"

void rope_kv_ref(const float *qkv, const float *bias, const float *inv_freq,
                 const int *pos, const int *slot, int n_tokens, int nh,
                 int nkv, int hd, int rope_half, float *q, float *k_cache,
                 float *v_cache)
{
    int qkv_dim = (nh + 2 * nkv) * hd;

    for (int t = 0; t < n_tokens; t++) {
        const float *row = qkv + (size_t)t * qkv_dim;
        for (int head = 0; head < nh + nkv; head++) {
            for (int i = 0; i < hd / 2; i++) {
                int e0 = rope_half ? i : 2 * i;
                int e1 = rope_half ? i + hd / 2 : 2 * i + 1;
                float x0 = row[head * hd + e0], x1 = row[head * hd + e1];
                float a = (float)pos[t] * inv_freq[i];
                float c = cosf(a), s = sinf(a);
                float *dst;

                if (bias) {
                    x0 += bias[head * hd + e0];
                    x1 += bias[head * hd + e1];
                }
                if (head < nh) {
                    dst = q + ((size_t)t * nh + head) * hd;
                } else {
                    if (slot[t] < 0)
                        continue;
                    dst = k_cache +
                          ((size_t)slot[t] * nkv + head - nh) * hd;
                }
                dst[e0] = x0 * c - x1 * s;
                dst[e1] = x0 * s + x1 * c;
            }
        }
        if (slot[t] < 0)
            continue;
        for (int e = 0; e < nkv * hd; e++)
            v_cache[(size_t)slot[t] * nkv * hd + e] =
                row[(nh + nkv) * hd + e] +
                (bias ? bias[(nh + nkv) * hd + e] : 0.0f);
    }
}
