/*
 * cpu_rope.c - rotary position embeddings.
 *
 * The frequencies are computed once per backend (cpu__rope_inv_freq), the
 * cos/sin of a position once per token and forward (shared by every head
 * and layer), and cpu__rope_apply rotates q or k in place.
 *
 * Float arithmetic follows llama2.c (1 / powf(theta, 2i/hd), pos * freq,
 * cosf/sinf) so greedy outputs match it id for id.
 */
#include <math.h>

#include "cpu_int.h"

void cpu__rope_inv_freq(const model_config_t *cfg, float *inv_freq)
{
    int half = cfg->head_dim / 2;

    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf(cfg->rope_theta,
                                  (float)(2 * i) / (float)cfg->head_dim);
    if (cfg->rope_scaling == MODEL_ROPE_SCALING_LINEAR) {
        /* positions / factor == frequencies / factor */
        for (int i = 0; i < half; i++)
            inv_freq[i] /= cfg->rope_factor;
    } else if (cfg->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) {
        /* transformers _compute_llama3_parameters: keep high frequencies,
         * divide low ones by the factor, interpolate in between. */
        float factor = cfg->rope_factor;
        float low = cfg->rope_low_freq_factor;
        float high = cfg->rope_high_freq_factor;
        float old_len = (float)cfg->rope_orig_max_pos;
        float low_wavelen = old_len / low;
        float high_wavelen = old_len / high;

        for (int i = 0; i < half; i++) {
            float f = inv_freq[i];
            float wavelen = 2.0f * (float)M_PI / f;

            if (wavelen > low_wavelen) {
                inv_freq[i] = f / factor;
            } else if (wavelen >= high_wavelen) {
                float smooth = (old_len / wavelen - low) / (high - low);

                inv_freq[i] = (1.0f - smooth) * f / factor + smooth * f;
            }
        }
    }
}

void cpu__rope_cos_sin(int pos, const float *inv_freq, int half,
                       float *cos_out, float *sin_out)
{
    for (int i = 0; i < half; i++) {
        float val = (float)pos * inv_freq[i];

        cos_out[i] = cosf(val);
        sin_out[i] = sinf(val);
    }
}

void cpu__rope_apply(float *vec, int n_heads, int head_dim,
                     model_rope_layout_t layout, const float *cos_v,
                     const float *sin_v)
{
    int half = head_dim / 2;

    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;

        if (layout == MODEL_ROPE_ADJACENT) {
            for (int i = 0; i < half; i++) {
                float v0 = v[2 * i], v1 = v[2 * i + 1];

                v[2 * i] = v0 * cos_v[i] - v1 * sin_v[i];
                v[2 * i + 1] = v0 * sin_v[i] + v1 * cos_v[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                float v0 = v[i], v1 = v[i + half];

                v[i] = v0 * cos_v[i] - v1 * sin_v[i];
                v[i + half] = v1 * cos_v[i] + v0 * sin_v[i];
            }
        }
    }
}
