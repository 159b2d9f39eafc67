/* RoPE frequency table (theta and llama3 scaling). The rotation itself is a backend op; this is
 * computed once at load. */
#include <math.h>

#include "model/model_internal.h"

void lt_model_rope_inv_freq(const lt_model_config *cfg, float *inv_freq) {
    int64_t half = cfg->D / 2;
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, D, 2).float() / D), all in fp32 */
        float e = (float)(2 * i) / (float)cfg->D;
        float f = 1.0f / powf((float)cfg->rope_theta, e);
        if (cfg->rope_llama3) {
            double old = (double)cfg->rope_original_ctx;
            double low_wl = old / cfg->rope_low_freq, high_wl = old / cfg->rope_high_freq;
            double wl = 2 * pi / f;
            double g = f;
            if (wl > low_wl) {
                g = f / cfg->rope_factor;
            } else if (wl >= high_wl) { /* medium band: interpolate between scaled and unscaled */
                double smooth = (old / wl - cfg->rope_low_freq) / (cfg->rope_high_freq - cfg->rope_low_freq);
                g = (1 - smooth) * f / cfg->rope_factor + smooth * f;
            }
            f = (float)g;
        }
        inv_freq[i] = f;
    }
}
