/* A transformers + PEFT oracle fixture (expected.safetensors beside a model, written by the
 * generators in tests/oracle/): its batch, LoRA shape and expected tensors, the model loaded with
 * PEFT's adapter values, and the comparison the model tests share. Fails the test on any error. */
#ifndef LT_TEST_MODEL_FIXTURE_H
#define LT_TEST_MODEL_FIXTURE_H

#include <stdint.h>

#include "longtune/model.h"
#include "longtune/safetensors.h"

typedef struct lt_test_fixture {
    lt_safetensors *exp;
    int64_t B, T, S, rank, num_layers;
    float alpha;
    int32_t tokens[64], targets[64], positions[64], offsets[16];
} lt_test_fixture;

/* Opens dir/expected.safetensors and reads its metadata and batch. */
void lt_test_fixture_open(lt_ctx *ctx, const char *dir, lt_test_fixture *f);
/* The expected f32 tensor `name` (*numel its size, may be NULL). */
const float *lt_test_fixture_tensor(lt_ctx *ctx, const lt_test_fixture *f, const char *name, int64_t *numel);
/* Loads the model at path (quantize: INT4_G64 projections) with f's LoRA shape and sets the adapter
 * values PEFT used; `what` names the case in a failure. */
lt_model *lt_test_fixture_model(lt_ctx *ctx, const char *path, const char *what, const lt_test_fixture *f,
                                int quantize);
/* The model of the fixture folder dir, or of `file`: a model file inside dir, or (an absolute
 * path) a model folder elsewhere; as lt_test_fixture_model otherwise. */
lt_model *lt_test_fixture_model_in(lt_ctx *ctx, const char *dir, const char *file, const char *what,
                                   const lt_test_fixture *f, int quantize);
/* The prepared model m's logits on f's batch (into a poisoned buffer) against the fixture's
 * within rel; `what` names them in a failure. */
void lt_test_fixture_check_logits(lt_ctx *ctx, lt_model *m, const lt_test_fixture *f, const char *what, double rel);
/* One step of the prepared model m on f's batch against the fixture within rel: logits, loss,
 * per-token loss and every LoRA gradient (`what` names the case in a failure). */
void lt_test_fixture_check_step(lt_ctx *ctx, lt_model *m, const lt_test_fixture *f, const char *what, double rel);
/* The oracle check of one case: the fixture of dir and its model (file as above), under each
 * recompute policy (none, every layer, every two layers, and the last two again with attention
 * rerun in the recompute): logits, loss, per-token loss and every LoRA gradient against the
 * fixture within rel, and each policy's gradients against the first's within same_rel (policies
 * change memory, never numbers). Its own context; fails on a leak. */
void lt_test_fixture_check_oracle(const char *dir, const char *file, const char *what, double rel, double same_rel);
/* f's batch, pointing into f. */
lt_model_batch lt_test_fixture_batch(const lt_test_fixture *f);
/* Fails unless max |got - want| <= rel * max |want| + 1e-7, naming `what` and the worst index. */
void lt_test_compare(const char *what, const float *got, const float *want, int64_t n, double rel);

#endif
