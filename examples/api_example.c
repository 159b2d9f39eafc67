/* Will a LoRA fine-tune of this model fit? Reads only the model's headers (no weights) and prints
 * the memory plan of one training step, class by class, as `longtune plan` does.
 * usage: api_example MODEL [TOKENS]   (MODEL: a Hugging Face folder or a .gguf file) */
#include <longtune.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [TOKENS]\n", argv[0]);
        return 2;
    }
    lt_ctx *ctx = lt_ctx_new();
    lt_model_options load = {.device = LT_DEVICE_CPU};
    lt_plan_options opt = {.device = LT_DEVICE_CPU, .lora = {.rank = 16}}; /* zero fields: defaults */
    opt.run.B = 1;
    opt.run.T = argc > 2 ? atoll(argv[2]) : 2048;
    opt.run.recompute = LT_RECOMPUTE_EVERY; /* gradient checkpointing: keep each layer's input */
    lt_model_config cfg;
    lt_plan plan;
    int rc = 0;
    if (lt_model_inspect(ctx, argv[1], &load, &cfg) != LT_OK || lt_plan_compute(ctx, &cfg, &opt, &plan) != LT_OK) {
        fprintf(stderr, "error: %s\n", lt_ctx_error(ctx));
        rc = 1;
    } else {
        for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++)
            printf("%-16s %14zu bytes\n", lt_plan_class_name((lt_plan_class)c), plan.bytes[c]);
        printf("peak %.1f MiB, %lld trainable parameters\n", (double)plan.peak_bytes / 1048576.0,
               (long long)plan.n_lora_params);
    }
    lt_ctx_free(ctx);
    return rc;
}
