/* Export: a LoRA adapter merged into its base and written where people run models -- a Hugging
 * Face folder (config, sharded safetensors, tokenizer, generation config), a GGUF file for
 * llama.cpp, or llama.cpp's LoRA adapter GGUF to apply to the untouched base. The base is an HF
 * folder or a GGUF (quantized bases are dequantized, merged in f32 and written in the chosen
 * type); the adapter is a PEFT folder or a longtune training checkpoint. Every output is written
 * to a temporary beside the target, fsynced and renamed, after the free space was checked. */
#ifndef LONGTUNE_EXPORT_MODEL_H
#define LONGTUNE_EXPORT_MODEL_H

#include "export.h"
#include "model.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_export_format {
    LT_EXPORT_HF = 0,    /* folder: config.json, model*.safetensors (+ index), tokenizer, generation */
    LT_EXPORT_GGUF,      /* one .gguf: the merged model */
    LT_EXPORT_GGUF_LORA, /* one .gguf: the adapter alone (general.type = adapter) */
} lt_export_format;

typedef struct lt_export_options {
    lt_export_format format;
    /* Weight dtype of the matrices. HF: f32, f16 or bf16. GGUF: f32, f16, bf16 or a block format
     * lt_export_can_quantize accepts (norms and biases always f32). Ignored by GGUF LoRA (f32). */
    lt_dtype outtype;
    int outtype_set;          /* 0: HF keeps a float base's dtype (a quantized base becomes f16); GGUF keeps
                        each tensor's own type (merged ones requantized into it) */
    int dequantize;           /* GGUF from a quantized base: write f16 (or outtype when it is a float type)
                        instead of requantizing; HF output is always dequantized */
    int overwrite;            /* replace an existing output (else LT_ERR_INVALID_ARG naming it) */
    uint64_t max_shard_bytes; /* HF: shard above this many bytes of tensors; 0 = 5 GB (5e9) */
    const char *adapter;      /* PEFT folder, checkpoint folder or checkpoint.ltck; NULL = export
                                 the base unchanged (a format conversion); required for GGUF LoRA */
    lt_rope_override rope;    /* RoPE scaling written into the model (the --rope-scaling a run trained
                                 with; lt_model_config_apply_rope's rules); scaling NONE = the base's */
} lt_export_options;

#define LT_EXPORT_MAX_CLASSES 16

/* Requantization error of one tensor class (attn_q, ffn_down, token_embd, ...): written minus
 * merged-in-f32, over every element of every tensor of the class. */
typedef struct lt_export_class_error {
    char name[24];
    lt_dtype dtype; /* the type the class was written in (the last tensor's) */
    int64_t n_tensors, n_elems;
    double max_abs, rms;
} lt_export_class_error;

typedef struct lt_export_report {
    int64_t n_tensors; /* tensors written */
    int64_t n_merged;  /* projections that received an adapter delta */
    uint64_t bytes;    /* bytes written, all files */
    int n_files;
    int n_shards;            /* HF: safetensors files */
    int tokenizer_converted; /* HF from GGUF: 1 tokenizer.json written, 0 not (see note) */
    char note[256];          /* what could not be carried over, "" when everything was */
    int n_classes;
    lt_export_class_error classes[LT_EXPORT_MAX_CLASSES];
} lt_export_report;

/* 1 when GGUF output can be written in t: F32, F16, BF16 and the block formats whose quantizer
 * lt_quantize_row implements. */
LT_API int lt_export_can_quantize(lt_dtype t);

/* Merges opt->adapter into the base at `model` (HF folder or .gguf; llama, qwen2, qwen3) and
 * writes `out` (a folder for HF, a file for GGUF). W' = W + (alpha/r)·B·A in f32 for every
 * targeted projection. Errors: LT_ERR_NOT_FOUND (model, adapter), LT_ERR_SHAPE (adapter does not
 * match the base: the tensor and both shapes named), LT_ERR_INVALID_ARG (output exists without
 * overwrite, an outtype the format cannot hold, a target the base lacks), LT_ERR_UNSUPPORTED
 * (architecture, a tensor the output cannot carry), LT_ERR_IO (no space: needed and available
 * bytes named; write failures), LT_ERR_FORMAT, LT_ERR_OOM. report may be NULL. */
LT_API lt_status lt_export_model(lt_ctx *ctx, const char *model, const char *out, const lt_export_options *opt,
                                 lt_export_report *report);

#ifdef __cplusplus
}
#endif
#endif
