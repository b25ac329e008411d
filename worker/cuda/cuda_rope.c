/*
 * cuda_rope.c - the RoPE inverse-frequency table uploaded by the CUDA
 * backend (and used by the kernel tests), with LINEAR and LLAMA3
 * scaling as Hugging Face computes them.
 */
#include <math.h>

#include "cuda_backend.h"

void cuda__rope_inv_freq(const model_config_t *cfg, float *out)
{
    int hd = cfg->head_dim;

    for (int i = 0; i < hd / 2; i++) {
        float f = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)hd);

        if (cfg->rope_scaling == MODEL_ROPE_SCALING_LINEAR &&
            cfg->rope_factor > 0.0f) {
            f /= cfg->rope_factor;
        } else if (cfg->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) {
            double orig = cfg->rope_orig_max_pos;
            double low_wl = orig / cfg->rope_low_freq_factor;
            double high_wl = orig / cfg->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;

            if (wl > low_wl) {
                f /= cfg->rope_factor;
            } else if (wl >= high_wl) {
                double smooth = (orig / wl - cfg->rope_low_freq_factor) /
                                (cfg->rope_high_freq_factor -
                                 cfg->rope_low_freq_factor);
                f = (float)((1.0 - smooth) * f / cfg->rope_factor +
                            smooth * f);
            }
        }
        out[i] = f;
    }
}
