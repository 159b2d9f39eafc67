/* `longtune export`: merges a LoRA adapter into its base and writes an HF folder or a GGUF, or
 * writes the adapter alone as llama.cpp's LoRA GGUF. Prints what was written and the
 * requantization error per tensor class (a table, or one JSON object with --json). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "longtune/export_model.h"

static const char *usage =
    "longtune export --model M [--adapter A] --out DIR|FILE --format hf|gguf|gguf-lora [--outtype T] "
    "[--dequantize] [--max-shard-size BYTES] [--rope-scaling TYPE --rope-factor F ...] [--overwrite] [--json]";

static const char *help =
    "Merges the LoRA adapter A (a PEFT folder as `longtune train` writes it, a training checkpoint\n"
    "folder, or checkpoint.ltck) into the base M (an HF folder or a .gguf; quantized bases are\n"
    "dequantized, merged in f32 and written in the chosen type) and writes:\n"
    "  --format hf         a folder for transformers: config.json, model.safetensors (sharded with\n"
    "                      model.safetensors.index.json above --max-shard-size [5GB]), tokenizer.json,\n"
    "                      tokenizer_config.json (with the chat template), generation_config.json\n"
    "  --format gguf       one .gguf for llama.cpp (the base's metadata and tokenizer carried over)\n"
    "  --format gguf-lora  the adapter alone as llama.cpp's LoRA GGUF: llama-cli -m base.gguf --lora FILE\n"
    "Options:\n"
    "  --outtype T         hf: f32|f16|bf16 [the base's float type; f16 for a quantized base]\n"
    "                      gguf: f32|f16|bf16|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k [each tensor keeps its type]\n"
    "                      (norms and biases stay f32 in a GGUF)\n"
    "  --dequantize        gguf: write a quantized base's matrices as f16 (or --outtype f32|bf16)\n"
    "  --rope-scaling TYPE linear|dynamic|yarn|llama3|longrope with --rope-factor F [--original-max-position N]\n"
    "                      [--yarn-beta-fast X --yarn-beta-slow Y] [--rope-attn-factor A]: the RoPE scaling a\n"
    "                      run trained with, written into config.json (rope_scaling) or the GGUF\n"
    "                      ({arch}.rope.scaling.*, Llama 3's as rope_freqs.weight) with the extended context\n"
    "  --overwrite         replace an existing output\n"
    "  --json              print the report as one JSON object\n"
    "Without --adapter the base is converted unchanged.\n";

static int parse_format(const char *v, lt_export_format *f) {
    if (!strcmp(v, "hf")) *f = LT_EXPORT_HF;
    else if (!strcmp(v, "gguf")) *f = LT_EXPORT_GGUF;
    else if (!strcmp(v, "gguf-lora")) *f = LT_EXPORT_GGUF_LORA;
    else return -1;
    return 0;
}

static void json_str(const char *s) {
    putchar('"');
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        putchar((unsigned char)*p >= 0x20 ? *p : ' ');
    }
    putchar('"');
}

static void print_report(const lt_export_report *r, const char *out, const char *fmt, int json) {
    char b[32];
    if (json) {
        printf("{\"out\": ");
        json_str(out);
        printf(", \"format\": \"%s\", \"tensors\": %lld, \"merged\": %lld, \"bytes\": %llu, \"files\": %d, "
               "\"shards\": %d, \"tokenizer_converted\": %s, \"note\": ",
               fmt, (long long)r->n_tensors, (long long)r->n_merged, (unsigned long long)r->bytes, r->n_files,
               r->n_shards, r->tokenizer_converted ? "true" : "false");
        json_str(r->note);
        printf(", \"requantization_error\": {");
        for (int c = 0; c < r->n_classes; c++) {
            const lt_export_class_error *e = &r->classes[c];
            printf("%s\"%s\": {\"dtype\": \"%s\", \"tensors\": %lld, \"elements\": %lld, \"max_abs\": %.6g, "
                   "\"rms\": %.6g}",
                   c ? ", " : "", e->name, lt_dtype_name(e->dtype), (long long)e->n_tensors, (long long)e->n_elems,
                   e->max_abs, e->rms);
        }
        printf("}}\n");
        return;
    }
    printf("wrote %s (%s): %lld tensors, %lld merged, %s in %d file(s)\n", out, fmt, (long long)r->n_tensors,
           (long long)r->n_merged, lt_cli_fmt_bytes(r->bytes, b, sizeof b), r->n_files);
    if (r->note[0]) printf("note: %s\n", r->note);
    if (r->n_classes) {
        printf("%-12s %-6s %8s %12s %12s\n", "class", "dtype", "tensors", "max_abs", "rms");
        for (int c = 0; c < r->n_classes; c++) {
            const lt_export_class_error *e = &r->classes[c];
            printf("%-12s %-6s %8lld %12.4g %12.4g\n", e->name, lt_dtype_name(e->dtype), (long long)e->n_tensors,
                   e->max_abs, e->rms);
        }
    }
}

int lt_cmd_export(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *fmt = NULL;
    lt_export_options opt;
    memset(&opt, 0, sizeof opt);
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s\n\n%s", usage, help);
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--dequantize")) {
            opt.dequantize = 1;
            continue;
        }
        if (!strcmp(a, "--overwrite")) {
            opt.overwrite = 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        const char *flags[] = {"--model",          "--adapter",        "--out",
                               "--format",         "--outtype",        "--max-shard-size",
                               "--rope-scaling",   "--rope-factor",    "--original-max-position",
                               "--yarn-beta-fast", "--yarn-beta-slow", "--rope-attn-factor"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof flags / sizeof flags[0]); j++)
            if (!strcmp(a, flags[j])) k = j;
        if (k < 0) return lt_cli_usage_error("export", usage, "unknown option '%s'", a);
        if (i + 1 >= argc) return lt_cli_usage_error("export", usage, "option '%s' needs a value", a);
        const char *v = argv[++i];
        switch (k) {
        case 0: model = v; break;
        case 1: opt.adapter = v; break;
        case 2: out = v; break;
        case 3:
            fmt = v;
            if (parse_format(v, &opt.format))
                return lt_cli_usage_error("export", usage, "--format must be hf|gguf|gguf-lora, not '%s'", v);
            break;
        case 4:
            if (lt_dtype_parse(v, &opt.outtype) != LT_OK)
                return lt_cli_usage_error("export", usage,
                                          "--outtype must be f32|f16|bf16|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k, not '%s'", v);
            opt.outtype_set = 1;
            break;
        case 5: {
            uint64_t bytes;
            if (lt_cli_parse_bytes(v, &bytes) || bytes == 0)
                return lt_cli_usage_error("export", usage, "bad --max-shard-size '%s'", v);
            opt.max_shard_bytes = bytes;
            break;
        }
        case 6:
            if (!strcmp(v, "default") || lt_rope_scaling_parse(NULL, v, &opt.rope.scaling) != LT_OK)
                return lt_cli_usage_error("export", usage,
                                          "--rope-scaling must be linear|dynamic|yarn|llama3|longrope, not '%s'", v);
            break;
        case 7:
        case 9:
        case 10:
        case 11: {
            double x;
            if (lt_cli_parse_f64(v, k == 7 ? 1e-9 : 0, 1e9, &x))
                return lt_cli_usage_error("export", usage, "option '%s': '%s' is not a number in [%s, 1e9]", a, v,
                                          k == 7 ? "1e-9" : "0");
            *(k == 7        ? &opt.rope.factor
                  : k == 9  ? &opt.rope.beta_fast
                  : k == 10 ? &opt.rope.beta_slow
                            : &opt.rope.attn_factor) = x;
            break;
        }
        case 8:
            if (lt_cli_parse_i64(v, 1, (int64_t)1 << 40, &opt.rope.original_ctx))
                return lt_cli_usage_error("export", usage, "option '%s': '%s' is not an integer in [1, 2^40]", a, v);
            break;
        }
    }
    if (!model) return lt_cli_usage_error("export", usage, "option 'model' is required");
    if (!out) return lt_cli_usage_error("export", usage, "option 'out' is required");
    if (!fmt) return lt_cli_usage_error("export", usage, "option 'format' is required");
    if (opt.rope.scaling == LT_ROPE_SCALING_NONE &&
        (opt.rope.factor != 0 || opt.rope.original_ctx != 0 || opt.rope.beta_fast != 0 || opt.rope.beta_slow != 0 ||
         opt.rope.attn_factor != 0))
        return lt_cli_usage_error("export", usage, "--rope-factor and the other RoPE options need --rope-scaling");
    if (opt.rope.scaling != LT_ROPE_SCALING_NONE && opt.rope.factor == 0)
        return lt_cli_usage_error("export", usage, "--rope-scaling %s needs --rope-factor",
                                  lt_rope_scaling_name(opt.rope.scaling));
    if (opt.format == LT_EXPORT_GGUF_LORA && !opt.adapter)
        return lt_cli_usage_error("export", usage, "--format gguf-lora needs --adapter");
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_export_report rep;
    lt_status s = lt_export_model(ctx, model, out, &opt, &rep);
    if (s != LT_OK) {
        int rc = lt_cli_fail("export", ctx, s);
        lt_ctx_free(ctx);
        return rc;
    }
    print_report(&rep, out, fmt, json);
    lt_ctx_free(ctx);
    return LT_EXIT_OK;
}
