/* Logits of a model as longtune computes them, for scripts/export-check.py: loads M (HF folder or
 * .gguf) with the PEFT adapter A when given (the LoRA path, not merged), runs one row of the
 * token ids read from a text file and writes the (T, V) f32 logits to OUT, raw little-endian.
 * usage: export_logits M A|- TOKENS.txt OUT.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: export_logits MODEL ADAPTER|- TOKENS.txt OUT.f32\n");
        return 2;
    }
    const char *model = argv[1], *adapter = strcmp(argv[2], "-") ? argv[2] : NULL;
    int32_t tok[4096];
    int64_t T = 0;
    FILE *f = fopen(argv[3], "r");
    if (!f) return 1;
    while (T < 4096 && fscanf(f, "%d", &tok[T]) == 1) T++;
    fclose(f);
    lt_ctx *ctx = lt_ctx_new();
    lt_lora_options lora = {0};
    lora.rank = 1;
    lt_model_config cfg;
    lt_model *m = NULL;
    lt_status s = lt_model_inspect(ctx, model, NULL, &cfg);
    if (s == LT_OK && adapter) s = lt_peft_read_config(ctx, adapter, cfg.L, &lora);
    if (s == LT_OK) s = lt_model_load(ctx, model, NULL, &lora, &m);
    if (s == LT_OK && adapter) s = lt_peft_load(ctx, adapter, m);
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = T, ro.forward_only = 1;
    if (s == LT_OK) s = lt_model_prepare(ctx, m, &ro);
    float *logits = malloc(sizeof(float) * (size_t)(T * cfg.V));
    lt_model_batch b = {0};
    b.B = 1, b.T = T, b.tokens = tok;
    if (s == LT_OK) s = lt_model_logits(ctx, m, &b, logits);
    if (s != LT_OK) {
        fprintf(stderr, "export_logits: %s: %s\n", lt_status_str(s), lt_ctx_error(ctx));
        return 1;
    }
    FILE *o = fopen(argv[4], "wb");
    if (!o || fwrite(logits, sizeof(float), (size_t)(T * cfg.V), o) != (size_t)(T * cfg.V)) return 1;
    fclose(o);
    free(logits);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
    return 0;
}
