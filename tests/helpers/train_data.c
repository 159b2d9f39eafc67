/* Shared training-test fixtures (see train_data.h). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "longtune/train.h"
#include "test_util.h"
#include "train_data.h"

void lt_test_dataset_make(lt_test_dataset *d, int64_t n_seqs, int64_t V, int64_t min_len, int64_t len_span,
                          uint64_t *rng) {
    d->offsets = malloc((size_t)(n_seqs + 1) * sizeof(int64_t));
    d->offsets[0] = 0;
    for (int64_t i = 0; i < n_seqs; i++)
        d->offsets[i + 1] = d->offsets[i] + min_len + (int64_t)(lt_test_rand_u64(rng) % (uint64_t)len_span);
    int64_t N = d->offsets[n_seqs];
    d->tokens = malloc((size_t)N * sizeof(int32_t));
    d->sup = malloc((size_t)N);
    for (int64_t i = 0; i < n_seqs; i++) {
        int64_t a = (int64_t)(lt_test_rand_u64(rng) % (uint64_t)V), s = 1 + (int64_t)(lt_test_rand_u64(rng) % 3);
        for (int64_t j = d->offsets[i]; j < d->offsets[i + 1]; j++) {
            int64_t k = j - d->offsets[i];
            d->tokens[j] = (int32_t)((a + k * s) % V);
            d->sup[j] = k >= 2;
        }
    }
    d->in = (lt_pack_input){d->tokens, d->sup, d->offsets, n_seqs};
}

void lt_test_dataset_free(lt_test_dataset *d) {
    free(d->tokens);
    free(d->sup);
    free(d->offsets);
}

/* Unlinks dir/files[i] for each i, then removes dir (missing files are fine). */
static void rm_files_and_dir(const char *dir, const char *const *files, int n) {
    char p[400];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

void lt_test_rm_adapter_dir(const char *dir) {
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors", LT_TRAIN_CHECKPOINT_FILE,
                                        "metrics.jsonl"};
    rm_files_and_dir(dir, files, 4);
}

void lt_test_rm_model_dir(const char *dir) {
    static const char *const files[] = {"config.json", "model.safetensors"};
    rm_files_and_dir(dir, files, 2);
}
