/* The tokenizer of a model path: GGUF metadata (a .gguf file, or any file that starts with the
 * GGUF magic), a tokenizer.json named directly, or the tokenizer.json of an HF folder (or of the
 * folder holding a file such as model.safetensors). Only picks the source; the loaders are
 * tokenizer_gguf.c and tokenizer_load.c. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

#define PATH_CAP 4096

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

/* A regular file whose first four bytes are "GGUF". */
static int has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4];
    int yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes;
}

static lt_status load_gguf(lt_ctx *ctx, const char *path, lt_tokenizer **out) {
    lt_gguf *g = NULL;
    LT_TRY(lt_gguf_open(ctx, path, &g));
    lt_status s = lt_tokenizer_load_gguf(ctx, g, out);
    lt_gguf_close(g);
    return s;
}

lt_status lt_tokenizer_load(lt_ctx *ctx, const char *model_path, lt_tokenizer **out) {
    struct stat st;
    int exists = stat(model_path, &st) == 0, is_dir = exists && S_ISDIR(st.st_mode);
    if (ends_with(model_path, ".gguf") || (exists && !is_dir && has_gguf_magic(model_path)))
        return load_gguf(ctx, model_path, out);
    if (!is_dir && ends_with(model_path, ".json")) return lt_tokenizer_load_json(ctx, model_path, out);
    char dir[PATH_CAP], path[PATH_CAP + 32];
    if (snprintf(dir, sizeof dir, "%s", model_path) >= (int)sizeof dir)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model path of %zu bytes is too long", strlen(model_path));
    if (exists && !is_dir && !S_ISREG(st.st_mode))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: is not a model folder or file (a device, FIFO or socket)",
                        model_path);
    if (exists && !is_dir) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (stat(path, &st) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no tokenizer.json beside the model", dir);
    return lt_tokenizer_load_json(ctx, path, out);
}
