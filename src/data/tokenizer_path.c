/* The tokenizer of a model path: a .gguf file's tokenizer.ggml.* metadata, or the tokenizer.json of
 * an HF folder (or of the folder holding a .safetensors file). Only picks the source; the loaders
 * are tokenizer_load.c and tokenizer_gguf.c. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

#define PATH_CAP 1024 /* as the run options' paths */

lt_status lt_tokenizer_load(lt_ctx *ctx, const char *model_path, lt_tokenizer **out) {
    size_t n = strlen(model_path);
    if (n > 5 && !strcmp(model_path + n - 5, ".gguf")) {
        lt_gguf *g = NULL;
        LT_TRY(lt_gguf_open(ctx, model_path, &g));
        lt_status s = lt_tokenizer_load_gguf(ctx, g, out);
        lt_gguf_close(g);
        return s;
    }
    char dir[PATH_CAP], path[PATH_CAP + 32];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", model_path);
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (stat(path, &st) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no tokenizer.json beside the model", dir);
    return lt_tokenizer_load_json(ctx, path, out);
}
