/* Fuzz target: the safetensors reader — header JSON, dtypes, shapes and offsets on arbitrary bytes;
 * every tensor it accepts must lie inside the file (first and last byte are touched). */
#include <stdlib.h>

#include "fuzz_util.h"
#include "longtune/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = lt_fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_safetensors *st = NULL;
    if (lt_safetensors_open(ctx, path, &st) == LT_OK) {
        for (int64_t i = 0; i < lt_safetensors_count(st); i++) {
            const char *name = lt_safetensors_name(st, i);
            lt_tensor t;
            if (name && lt_safetensors_find(ctx, st, name, &t) == LT_OK) {
                int64_t nb = lt_tensor_nbytes(&t);
                if (nb > 0) {
                    volatile uint8_t x = ((const uint8_t *)t.data)[0];
                    x = ((const uint8_t *)t.data)[nb - 1];
                    (void)x;
                }
            }
        }
        lt_safetensors_close(ctx, st);
    }
    lt_ctx_free(ctx);
    close(fd);
    return 0;
}
