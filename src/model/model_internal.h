/* Internals shared by the model's source files in src/model/ and its tests: the frequency
 * table of RoPE and the layer-level pieces. Not a public API. */
#ifndef LT_MODEL_INTERNAL_H
#define LT_MODEL_INTERNAL_H

#include "longtune/model.h"

/* inv_freq (D/2) for rotate-half RoPE: theta^(-2i/D) in fp32 as transformers computes it, then
 * the llama3 piecewise rescaling when cfg->rope_llama3 (factor, low/high frequency factors,
 * original context), exactly as transformers' _compute_llama3_parameters. */
void lt_model_rope_inv_freq(const lt_model_config *cfg, float *inv_freq);

#endif
