/* Fuzz target: a Hugging Face config.json through the model-config reader (architecture, sizes,
 * rope_scaling, head_dim, tie flags): errors are expected, crashes and leaks are not. */
#include "fuzz_util.h"
#include "longtune/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = lt_fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    (void)lt_model_config_read_hf(ctx, path, &cfg);
    lt_ctx_free(ctx);
    close(fd);
    return 0;
}
