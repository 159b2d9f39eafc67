/* Fuzz target: arbitrary bytes as a Hugging Face model.safetensors.index.json beside two small valid
 * shards (a.safetensors: "x", "y"; b.safetensors: "z"), opened through the index. Shard names that
 * escape the folder, missing shards, tensors in the wrong shard and duplicate names must be typed
 * errors; whatever opens must expose only tensors inside the mapped shards. No crash, hang or leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longtune/alloc.h"
#include "longtune/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static void make_shards(void) {
    snprintf(dir, sizeof dir, "/tmp/lt_fuzz_st_index_%d", (int)getpid());
    mkdir(dir, 0755);
    lt_ctx *ctx = lt_ctx_new();
    float x[6] = {1, 2, 3, 4, 5, 6}, y[2] = {7, 8}, z[3] = {9, 10, 11};
    int64_t sx[2] = {2, 3}, sy[1] = {2}, sz[1] = {3};
    lt_safetensors_entry a[2] = {{"x", lt_tensor_view(x, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sx)},
                                 {"y", lt_tensor_view(y, LT_DTYPE_F32, LT_DEVICE_CPU, 1, sy)}};
    lt_safetensors_entry b[1] = {{"z", lt_tensor_view(z, LT_DTYPE_F32, LT_DEVICE_CPU, 1, sz)}};
    char path[128];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    if (lt_safetensors_write(ctx, path, a, 2, NULL, 0) != LT_OK) abort();
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    if (lt_safetensors_write(ctx, path, b, 1, NULL, 0) != LT_OK) abort();
    lt_ctx_free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) make_shards();
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    lt_ctx *ctx = lt_ctx_new();
    lt_safetensors *st = NULL;
    if (lt_safetensors_open(ctx, path, &st) == LT_OK) {
        for (int64_t i = 0; i < lt_safetensors_count(st); i++) {
            const char *name = lt_safetensors_name(st, i);
            lt_tensor t;
            if (!name || lt_safetensors_find(ctx, st, name, &t) != LT_OK) abort();
            int64_t nb = lt_tensor_nbytes(&t);
            if (nb > 0) {
                volatile uint8_t v = ((const uint8_t *)t.data)[0];
                v = ((const uint8_t *)t.data)[nb - 1];
                (void)v;
            }
        }
        lt_safetensors_close(ctx, st);
    }
    if (lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes != 0) abort();
    lt_ctx_free(ctx);
    return 0;
}
