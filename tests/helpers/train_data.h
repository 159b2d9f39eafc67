/* Shared fixtures of the training tests (test_train_run, test_cuda_train, test_plan): learnable
 * in-memory datasets and removal of the model and adapter folders a test wrote. Plain malloc, since
 * these are test scaffolding, not library allocations. No model writing: each test draws its own
 * weights in its own order, and folding them would change the sequences its printed seed replays. */
#ifndef LT_TEST_TRAIN_DATA_H
#define LT_TEST_TRAIN_DATA_H

#include <stdint.h>

#include "longtune/pack.h"

typedef struct lt_test_dataset {
    int32_t *tokens;  /* N */
    uint8_t *sup;     /* N: 1 where the token is supervised */
    int64_t *offsets; /* n_seqs + 1 */
    lt_pack_input in; /* views of the three arrays above */
} lt_test_dataset;

/* n_seqs learnable sequences tok[i] = (a + i·s) mod V with a, s drawn from rng, lengths
 * min_len + (rng % len_span); the first two tokens of each are an unsupervised prompt. The draws
 * come in a fixed order (all lengths, then a and s per sequence) so a printed seed replays them. */
void lt_test_dataset_make(lt_test_dataset *d, int64_t n_seqs, int64_t V, int64_t min_len, int64_t len_span,
                          uint64_t *rng);
void lt_test_dataset_free(lt_test_dataset *d);

/* Removes the files a training run writes into an adapter folder, then the folder. */
void lt_test_rm_adapter_dir(const char *dir);
/* Removes a test's HF model folder (config.json, model.safetensors), then the folder. */
void lt_test_rm_model_dir(const char *dir);

#endif
