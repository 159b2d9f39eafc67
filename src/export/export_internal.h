/* Private to src/export: the base being exported (its readers and configuration), the adapter in
 * f32, the list of tensors a model of the one decoder holds with their HF and GGUF names, and the
 * row pipeline that reads, merges and converts one row at a time. The writers (HF folder, GGUF,
 * GGUF LoRA) and the tokenizer conversions sit on top of it. */
#ifndef LT_EXPORT_INTERNAL_H
#define LT_EXPORT_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "longtune/export_model.h"
#include "longtune/gguf.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"

#define EX_PATH_MAX 4096

typedef struct lt_ex_base {
    const char *path;
    char dir[EX_PATH_MAX]; /* HF: the folder holding config.json and the tokenizer files */
    lt_gguf *gg;
    lt_safetensors *st;
    lt_model_config cfg;
    char arch[32];      /* GGUF architecture: "llama" (also Mixtral), "qwen2", "qwen3", "qwen3moe", "qwen2moe" */
    int permute_qk;     /* llama-arch GGUF: Q/K rows stored for interleaved RoPE */
    int has_rope_freqs; /* GGUF rope_freqs.weight */
    int rope_override;  /* cfg's RoPE scaling replaced by lt_export_options.rope */
} lt_ex_base;

typedef enum lt_ex_kind {
    EX_EMBED = 0,
    EX_ATTN_NORM,
    EX_PROJ,
    EX_BIAS,
    EX_Q_NORM,
    EX_K_NORM,
    EX_MLP_NORM,
    EX_FINAL_NORM,
    EX_HEAD,
    EX_ROPE_FREQS,
    EX_ROUTER,     /* an MoE layer's router (E, C) */
    EX_EXPERT,     /* one expert's gate, up or down matrix (which: LT_PROJ_GATE/UP/DOWN) */
    EX_SHEXP,      /* the shared expert's gate, up or down matrix (Qwen2-MoE) */
    EX_SHEXP_GATE, /* the shared expert's sigmoid gate (1, C); a vector (C) in GGUF */
} lt_ex_kind;

typedef struct lt_ex_piece {
    lt_ex_kind kind;
    int64_t layer; /* -1 for model-wide pieces */
    int which;     /* lt_proj for EX_PROJ and EX_EXPERT, 0..2 (q, k, v) for EX_BIAS */
    int ndim;
    int64_t shape[2]; /* row-major; 1-D pieces use shape[0]; one expert's (rows, cols) for EX_EXPERT */
    int64_t expert;   /* EX_EXPERT: the expert; a GGUF stack (E, rows, cols) is its E pieces in order */
} lt_ex_piece;

/* The adapter: A (r, in) and B (out, r) per (layer, projection), f32, host; on the experts of MoE
 * layers (targets LT_LORA_EXPERTS_*) the stacks in longtune's storage (model.h): per layer and
 * w (0 gate_up, 1 down) A (E·r, in) and B (the gate stack then the up stack (E·moe_F, r) each, or
 * (E·C, r)). */
typedef struct lt_ex_adapter {
    int64_t rank, L;
    float alpha, scale;
    unsigned targets;
    int64_t l0;       /* first layer with LoRA */
    float **a, **b;   /* [L * LT_PROJ_COUNT_], NULL where absent */
    float **xa, **xb; /* [L * 2] expert stacks, NULL where absent */
    float *data;
    size_t data_bytes, ptr_bytes;
    char base_model[512]; /* adapter_config.json base_model_name_or_path, "" if none */
} lt_ex_adapter;

lt_status lt_ex_base_open(lt_ctx *ctx, const char *path, lt_ex_base *b);
void lt_ex_base_close(lt_ctx *ctx, lt_ex_base *b);

/* Pieces of cfg in HF order (embed, per layer, final norm, head; rope freqs last when present).
 * Returns the count; writes at most cap into out (out NULL: count only). */
int64_t lt_ex_pieces(const lt_ex_base *b, int with_rope_freqs, lt_ex_piece *out, int64_t cap);
void lt_ex_hf_name(const lt_ex_base *b, const lt_ex_piece *p, char *buf, size_t n);
void lt_ex_gguf_name(const lt_ex_piece *p, char *buf, size_t n);
/* The class a piece's error is reported under ("attn_q", "token_embd", "norm", ...). */
const char *lt_ex_class_name(const lt_ex_piece *p);
/* The source tensor of a piece (NULL data for computed rope freqs of an HF llama3 base). */
lt_status lt_ex_find(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_piece *p, lt_tensor *t);
/* Row r (canonical rotate-half order) of piece p as f32: un-permutes llama GGUF Q/K rows,
 * dequantizes. 1-D pieces have one row. */
void lt_ex_read_row(const lt_ex_base *b, const lt_ex_piece *p, const lt_tensor *t, int64_t r, float *out);
/* Stored row index of canonical row r in a source with interleaved (GGUF llama) Q/K. */
int64_t lt_ex_interleaved_row(int64_t r, int64_t D);
/* Llama 3 RoPE frequency factors (D/2) as convert_hf_to_gguf writes rope_freqs.weight. */
void lt_ex_llama3_rope_factors(const lt_model_config *c, float *out);

/* Reads a PEFT folder (adapter_config.json + adapter_model.safetensors), a folder holding
 * checkpoint.ltck, or a checkpoint file, checked against the base's shapes. */
lt_status lt_ex_adapter_read(lt_ctx *ctx, const char *path, const lt_ex_base *b, lt_ex_adapter *a);
void lt_ex_adapter_free(lt_ctx *ctx, lt_ex_adapter *a);
/* Adds scale·(B·A)[r, :] to row (in floats) for projection k of layer l; no-op without LoRA. */
int lt_ex_adapter_has(const lt_ex_adapter *a, int64_t l, int k);
void lt_ex_adapter_add_row(const lt_ex_adapter *a, int64_t l, int k, int64_t r, int64_t in, float *row);
/* The same for row o of expert e's matrix `which` (LT_PROJ_GATE/UP/DOWN) in MoE layer l:
 * scale·(B_e·A_e)[o, :] with the gate_up stack's A shared by gate and up. */
int lt_ex_adapter_has_expert(const lt_ex_adapter *a, int64_t l, int which);
void lt_ex_adapter_add_expert_row(const lt_ex_adapter *a, const lt_model_config *c, int64_t l, int which, int64_t e,
                                  int64_t o, float *row);
/* Whether piece p is changed by the adapter. */
int lt_ex_piece_merged(const lt_ex_adapter *a, const lt_ex_piece *p);
/* Rows and columns of one expert's matrix `which` (gate/up (moe_F, C), down (C, moe_F)). */
void lt_ex_expert_shape(const lt_model_config *c, int which, int64_t *rows, int64_t *cols);

/* Error accumulation per class. */
void lt_ex_report_add(lt_export_report *rep, const char *cls, lt_dtype dt, const float *merged, const float *written,
                      int64_t n, int new_tensor);
void lt_ex_report_finish(lt_export_report *rep);

/* Converts n f32 values to dtype (plain or block) into dst; writes the round-tripped values
 * into back (may be NULL) for the error report. */
void lt_ex_convert_row(lt_dtype dt, const float *src, void *dst, float *back, int64_t n);

/* Free space at the folder holding path (statvfs); LT_ERR_IO naming need and have when short. */
lt_status lt_ex_check_space(lt_ctx *ctx, const char *path, uint64_t need);

/* Writers. */
lt_status lt_ex_write_hf(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                         const lt_export_options *opt, lt_export_report *rep);
lt_status lt_ex_write_gguf(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                           const lt_export_options *opt, lt_export_report *rep);
lt_status lt_ex_write_gguf_lora(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                                const lt_export_options *opt, lt_export_report *rep);

/* Tokenizer and metadata conversions. */
/* GGUF base → tokenizer.json text (malloc'd; caller frees with free) and tokenizer_config.json
 * object; LT_ERR_UNSUPPORTED with the reason when the vocabulary kind has no conversion. */
lt_status lt_ex_tokenizer_from_gguf(lt_ctx *ctx, const lt_ex_base *b, char **tokenizer_json, cJSON **tokenizer_config);
/* HF base → the tokenizer.ggml.* metadata of its tokenizer.json / tokenizer_config.json. */
lt_status lt_ex_tokenizer_to_gguf(lt_ctx *ctx, const lt_ex_base *b, lt_gguf_writer *w, char *note, size_t note_n);

/* Whole-file helpers. */
lt_status lt_ex_read_file(lt_ctx *ctx, const char *path, size_t max, char **out, size_t *n);
/* Writes n bytes to path atomically (temp in the same folder, fsync, rename). */
lt_status lt_ex_write_file(lt_ctx *ctx, const char *path, const void *data, size_t n);
/* A GGUF string metadata value as a NUL-terminated copy into buf (0 when absent or too long). */
int lt_ex_gguf_str(lt_ctx *ctx, const lt_gguf *g, const char *key, char *buf, size_t n);

#endif
