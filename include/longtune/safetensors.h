/* safetensors: a memory-mapped reader (one file, or the shards named by a
 * model.safetensors.index.json) and an atomic writer (temporary file, fsync, rename) for adapters.
 * Dtypes F32, F16, BF16 only; every header offset and size is validated against the file before
 * a tensor is handed out. Does not convert dtypes and does not copy tensor data. */
#ifndef LONGTUNE_SAFETENSORS_H
#define LONGTUNE_SAFETENSORS_H

#include "export.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_safetensors lt_safetensors;

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a folder holding either
 * (the index wins). Errors: LT_ERR_IO / LT_ERR_NOT_FOUND (file), LT_ERR_FORMAT (bad header JSON,
 * offsets outside the data, sizes that disagree with dtype×shape, overlapping tensors, duplicate
 * names — the message names the file and tensor), LT_ERR_UNSUPPORTED (another dtype, named). */
LT_API lt_status lt_safetensors_open(lt_ctx *ctx, const char *path, lt_safetensors **out);
LT_API void lt_safetensors_close(lt_ctx *ctx, lt_safetensors *st);

LT_API int64_t lt_safetensors_count(const lt_safetensors *st);
/* Name of tensor i (0 <= i < count), NUL-terminated, owned by st. */
LT_API const char *lt_safetensors_name(const lt_safetensors *st, int64_t i);
/* A read-only view (CPU, contiguous) into the mapping; valid until close. LT_ERR_NOT_FOUND. */
LT_API lt_status lt_safetensors_find(lt_ctx *ctx, const lt_safetensors *st, const char *name, lt_tensor *out);
/* Value of a "__metadata__" string entry, or NULL. */
LT_API const char *lt_safetensors_metadata(const lt_safetensors *st, const char *key);

typedef struct lt_safetensors_entry {
    const char *name;
    lt_tensor tensor; /* host, contiguous, F32 | F16 | BF16 */
} lt_safetensors_entry;

/* Writes n tensors (in the given order) and optional "__metadata__" string pairs
 * (meta_kv[2i] = key, meta_kv[2i+1] = value) to `path` atomically. Errors: LT_ERR_INVALID_ARG
 * (duplicate or empty name, unsupported dtype, non-contiguous tensor), LT_ERR_IO. */
LT_API lt_status lt_safetensors_write(lt_ctx *ctx, const char *path, const lt_safetensors_entry *entries, int64_t n,
                                      const char *const *meta_kv, int64_t n_meta);

#ifdef __cplusplus
}
#endif
#endif
