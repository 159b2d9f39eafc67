/* A tiny random Llama-family (or Gemma 3) model written as a Hugging Face folder (config.json +
 * model.safetensors), for tests that need more layers or another shape than the committed fixtures
 * (the checkpoint offload tests: at least three LoRA layers; the by-kind recompute policies: runs of
 * sliding layers between global ones). Head dim 64 so the CUDA attention
 * serves it. Test scaffolding: plain malloc. */
#ifndef LT_TEST_TINY_MODEL_H
#define LT_TEST_TINY_MODEL_H

#include <stdint.h>

#include "longtune/tensor.h"

typedef struct lt_test_tiny {
    int64_t V, C, F, L, H, Hkv, D;
    int qk_norm;    /* Qwen3 (per-head q/k norm, explicit head_dim) instead of Llama */
    lt_dtype dtype; /* f32 or bf16 */
} lt_test_tiny;

/* Writes the model into dir (created): weights drawn from rng (matrices N(0, 0.6/sqrt(in)), norms
 * near 1, embedding N(0, 1)), untied head. Fails the test on any error. */
void lt_test_tiny_write(const lt_test_tiny *t, const char *dir, uint64_t *rng);

/* The same as a Gemma 3 text model (sandwich norms, GeGLU, q/k norms, tied head; t->qk_norm is
 * implied) whose layers slide over the last `window` keys but every period-th, which attends
 * globally. */
void lt_test_tiny_write_gemma3(const lt_test_tiny *t, int64_t window, int64_t period, const char *dir, uint64_t *rng);

#endif
