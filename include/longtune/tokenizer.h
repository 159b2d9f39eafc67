/* Tokenizers: byte-level BPE (GPT-2 family: Llama 3, Qwen2/2.5/3/3.5, Mistral Nemo's Tekken,
 * SmolLM2, StarCoder, DeepSeek) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral
 * v0.1-v0.3, Phi-3, Gemma 2/3, Gemma 4's character BPE, TinyLlama), loaded from a
 * Hugging Face tokenizer.json (+ tokenizer_config.json) or from GGUF metadata. Special and added
 * tokens are matched before BPE; pre-tokenizer regexes run through PCRE2 (UTF, JIT). Encodings
 * equal the Hugging Face `tokenizers` library's, token for token. No training of tokenizers. */
#ifndef LONGTUNE_TOKENIZER_H
#define LONGTUNE_TOKENIZER_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_tokenizer lt_tokenizer;
struct lt_gguf;

/* From a tokenizer.json path; tokenizer_config.json beside it is read when present (chat template,
 * bos/eos/pad tokens). What add_special adds comes from the file's post_processor, as in HF
 * `tokenizers`. Errors: LT_ERR_NOT_FOUND, LT_ERR_IO, LT_ERR_FORMAT (names the key), LT_ERR_UNSUPPORTED
 * (model type, normalizer, pre-tokenizer, post-processor or decoder not implemented, named; see
 * docs/tokenizer.md). The tokenizer keeps `ctx` (its tables are accounted there): ctx must outlive
 * it. */
LT_API lt_status lt_tokenizer_load_json(lt_ctx *ctx, const char *path, lt_tokenizer **out);
/* From an open GGUF file's tokenizer.ggml.* metadata (model gpt2 with pre default, gpt-2, smollm,
 * starcoder, refact, command-r, llama-bpe, pixtral, qwen2, qwen35, tekken, deepseek-llm,
 * deepseek-coder; model llama, with or without add_space_prefix; model gemma4), encoding as
 * llama.cpp does. Copies what it needs: `g` may be closed afterwards. Errors: LT_ERR_UNSUPPORTED
 * naming an unknown model or pre value, LT_ERR_FORMAT naming the key of malformed metadata. */
LT_API lt_status lt_tokenizer_load_gguf(lt_ctx *ctx, const struct lt_gguf *g, lt_tokenizer **out);
/* The tokenizer of a model path: the tokenizer.ggml.* metadata of a GGUF file (a .gguf name, or a
 * file that starts with the GGUF magic), a file named *.json read as a tokenizer.json, else the
 * tokenizer.json of an HF folder (or of the folder holding a file such as model.safetensors).
 * Errors: those of lt_gguf_open, lt_tokenizer_load_gguf and lt_tokenizer_load_json;
 * LT_ERR_NOT_FOUND naming the folder when it has no tokenizer.json. */
LT_API lt_status lt_tokenizer_load(lt_ctx *ctx, const char *model_path, lt_tokenizer **out);
LT_API void lt_tokenizer_free(lt_tokenizer *tok);

/* Encodes `len` bytes of text (any bytes: invalid UTF-8 becomes U+FFFD per maximal ill-formed
 * subpart, as Python's decode(errors="replace") before HF sees it). add_special: what the
 * post-processor adds (e.g. BOS), as HF's add_special_tokens=True. *ids is allocated with malloc
 * (caller frees with free(); never NULL on success); *n_ids its length. Safe to call from several
 * threads at once on one tokenizer, each with its own ctx. Errors: LT_ERR_OOM, LT_ERR_INVALID_ARG. */
LT_API lt_status lt_tokenizer_encode(lt_ctx *ctx, const lt_tokenizer *tok, const char *text, size_t len,
                                     int add_special, int32_t **ids, size_t *n_ids);
/* Decodes ids to text through the tokenizer's decoders (malloc'd, NUL-terminated; *len excludes the
 * NUL); byte-level output is read as lossy UTF-8 (U+FFFD), as HF. skip_special drops special
 * tokens. Out-of-range ids are LT_ERR_INVALID_ARG naming the position. */
LT_API lt_status lt_tokenizer_decode(lt_ctx *ctx, const lt_tokenizer *tok, const int32_t *ids, size_t n_ids,
                                     int skip_special, char **text, size_t *len);

LT_API int32_t lt_tokenizer_vocab_size(const lt_tokenizer *tok);
/* -1 when the tokenizer has none. */
LT_API int32_t lt_tokenizer_bos(const lt_tokenizer *tok);
LT_API int32_t lt_tokenizer_eos(const lt_tokenizer *tok);
LT_API int32_t lt_tokenizer_pad(const lt_tokenizer *tok);
/* Id of an exact token string (e.g. "<|im_end|>"), -1 if absent. */
LT_API int32_t lt_tokenizer_token_id(const lt_tokenizer *tok, const char *token);
/* The chat template string from tokenizer_config.json or GGUF metadata; NULL if none. */
LT_API const char *lt_tokenizer_chat_template(const lt_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
