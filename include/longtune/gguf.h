/* GGUF reader (versions 2 and 3): header, metadata key/values (incl. arrays), tensor infos and
 * memory-mapped tensor data. Every count, length, dimension and offset is validated against the
 * file size before use; a malformed file is LT_ERR_FORMAT naming the key or tensor. The writer
 * (version 3, alignment 32) takes the metadata and tensor infos first, then the tensor data in
 * order, and publishes the file atomically (temporary in the same folder, fsync, rename). */
#ifndef LONGTUNE_GGUF_H
#define LONGTUNE_GGUF_H

#include "export.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_gguf lt_gguf;

typedef enum lt_gguf_type {
    LT_GGUF_U8 = 0,
    LT_GGUF_I8,
    LT_GGUF_U16,
    LT_GGUF_I16,
    LT_GGUF_U32,
    LT_GGUF_I32,
    LT_GGUF_F32,
    LT_GGUF_BOOL,
    LT_GGUF_STRING,
    LT_GGUF_ARRAY,
    LT_GGUF_U64,
    LT_GGUF_I64,
    LT_GGUF_F64,
    LT_GGUF_TYPE_COUNT_
} lt_gguf_type;

/* Bytes of one value of scalar type `type` as a GGUF file stores it (a raw type code from a file
 * may be any value); 0 for strings, arrays and codes that name no type. */
LT_API uint64_t lt_gguf_scalar_bytes(uint32_t type);

/* Opens and maps `path`. Errors: LT_ERR_NOT_FOUND (no such file), LT_ERR_IO, LT_ERR_FORMAT (names
 * the key or tensor), LT_ERR_UNSUPPORTED (GGUF v1, big-endian, nested arrays). The handle keeps
 * `ctx` (its tables are accounted there), so ctx must outlive it. */
LT_API lt_status lt_gguf_open(lt_ctx *ctx, const char *path, lt_gguf **out);
/* Unmaps and frees; NULL is a no-op. Pointers obtained from the handle die with it. */
LT_API void lt_gguf_close(lt_gguf *g);
LT_API uint32_t lt_gguf_version(const lt_gguf *g);
/* general.alignment, or the default 32. */
LT_API uint64_t lt_gguf_alignment(const lt_gguf *g);

/* Metadata lookups; LT_ERR_NOT_FOUND when the key is absent, LT_ERR_FORMAT on a type mismatch
 * (integers of any width convert when the value fits). Strings point into the mapping and are
 * NOT NUL-terminated: use the length. */
LT_API lt_status lt_gguf_get_u64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t *out);
LT_API lt_status lt_gguf_get_i64(lt_ctx *ctx, const lt_gguf *g, const char *key, int64_t *out);
LT_API lt_status lt_gguf_get_f64(lt_ctx *ctx, const lt_gguf *g, const char *key, double *out);
/* Any integer or bool; nonzero is 1. */
LT_API lt_status lt_gguf_get_bool(lt_ctx *ctx, const lt_gguf *g, const char *key, int *out);
LT_API lt_status lt_gguf_get_type(lt_ctx *ctx, const lt_gguf *g, const char *key, lt_gguf_type *type);
LT_API lt_status lt_gguf_get_str(lt_ctx *ctx, const lt_gguf *g, const char *key, const char **s, size_t *len);
/* Arrays: element type and count; then element access. */
LT_API lt_status lt_gguf_get_array(lt_ctx *ctx, const lt_gguf *g, const char *key, lt_gguf_type *elem_type,
                                   uint64_t *count);
LT_API lt_status lt_gguf_array_str(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, const char **s,
                                   size_t *len);
LT_API lt_status lt_gguf_array_i64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, int64_t *out);
LT_API lt_status lt_gguf_array_f64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, double *out);

/* Metadata enumeration in file order: key i (not NUL-terminated) and its type. */
LT_API int64_t lt_gguf_kv_count(const lt_gguf *g);
LT_API lt_status lt_gguf_kv_key(lt_ctx *ctx, const lt_gguf *g, int64_t i, const char **key, size_t *len,
                                lt_gguf_type *type);

/* Tensors: shape in row-major (PyTorch) order, i.e. GGUF's ne[] reversed; dtype mapped from the
 * ggml type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
 * IQ4_XS; any other is LT_ERR_UNSUPPORTED naming the tensor and its type); data points into the
 * mapping, validated to lie inside the file. lt_gguf_open already rejects (LT_ERR_FORMAT, naming
 * tensor and type) a tensor of a known block type whose row length is not a whole number of
 * blocks, or whose bytes (blocks x block bytes) overflow or run past the end of the file. */
LT_API int64_t lt_gguf_tensor_count(const lt_gguf *g);
LT_API const char *lt_gguf_tensor_name(const lt_gguf *g, int64_t i);
LT_API lt_status lt_gguf_find_tensor(lt_ctx *ctx, const lt_gguf *g, const char *name, lt_tensor *out);
/* The raw ggml type id of a tensor and its name ("Q6_K", "unknown"), also for types longtune does
 * not read. LT_ERR_NOT_FOUND when absent. */
LT_API lt_status lt_gguf_tensor_ggml_type(lt_ctx *ctx, const lt_gguf *g, const char *name, uint32_t *type,
                                          const char **type_name);

/* ---- writer ---- */

typedef struct lt_gguf_writer lt_gguf_writer;

/* An empty writer (no file yet); its tables are accounted in ctx. LT_ERR_OOM. */
LT_API lt_status lt_gguf_writer_new(lt_ctx *ctx, lt_gguf_writer **out);
/* Frees the writer; an unfinished file is removed (the target is never touched). NULL is a no-op. */
LT_API void lt_gguf_writer_free(lt_gguf_writer *w);

/* Metadata in the order added; a key may be set once (LT_ERR_INVALID_ARG names a repeat, an empty
 * key or one over 65535 bytes). Strings are copied, with their length (no NUL needed). */
LT_API lt_status lt_gguf_writer_set_u32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, uint32_t v);
LT_API lt_status lt_gguf_writer_set_i32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, int32_t v);
LT_API lt_status lt_gguf_writer_set_u64(lt_ctx *ctx, lt_gguf_writer *w, const char *key, uint64_t v);
LT_API lt_status lt_gguf_writer_set_f32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, float v);
LT_API lt_status lt_gguf_writer_set_bool(lt_ctx *ctx, lt_gguf_writer *w, const char *key, int v);
LT_API lt_status lt_gguf_writer_set_str(lt_ctx *ctx, lt_gguf_writer *w, const char *key, const char *s, size_t len);
/* A numeric array: `data` holds n elements of elem (LT_GGUF_U8 ... LT_GGUF_F64, not strings or
 * arrays) in their GGUF widths. */
LT_API lt_status lt_gguf_writer_set_array(lt_ctx *ctx, lt_gguf_writer *w, const char *key, lt_gguf_type elem,
                                          const void *data, uint64_t n);
/* A string array: n strings of the given lengths (lens NULL: NUL-terminated). */
LT_API lt_status lt_gguf_writer_set_array_str(lt_ctx *ctx, lt_gguf_writer *w, const char *key, const char *const *s,
                                              const size_t *lens, uint64_t n);
/* Copies metadata entry i of an open GGUF (its key, type and value) into the writer. */
LT_API lt_status lt_gguf_writer_copy_kv(lt_ctx *ctx, lt_gguf_writer *w, const lt_gguf *g, int64_t i);
/* 1 when the writer already holds `key`. */
LT_API int lt_gguf_writer_has_key(const lt_gguf_writer *w, const char *key);

/* Declares the next tensor: row-major (PyTorch) shape, 1 to 4 dims, in any dtype with a ggml type
 * (F32, F16, BF16 and the GGUF block formats; the last dim a whole number of blocks). Names are
 * unique, at most 63 bytes (llama.cpp's limit). Errors: LT_ERR_INVALID_ARG (named). */
LT_API lt_status lt_gguf_writer_add_tensor(lt_ctx *ctx, lt_gguf_writer *w, const char *name, lt_dtype dtype, int ndim,
                                           const int64_t *shape);
/* Bytes of the whole file as declared so far (header, metadata, infos, aligned data). */
LT_API uint64_t lt_gguf_writer_file_bytes(const lt_gguf_writer *w);
/* Opens "<path>.tmp.<pid>" and writes everything before the tensor data. Metadata and tensors are
 * frozen from here on. LT_ERR_IO names the file. */
LT_API lt_status lt_gguf_writer_begin(lt_ctx *ctx, lt_gguf_writer *w, const char *path);
/* Appends n bytes of tensor data: the tensors' bytes in declaration order, in pieces of any size
 * (the alignment padding between tensors is written automatically). LT_ERR_INVALID_ARG when the
 * bytes pass the declared total; LT_ERR_IO. */
LT_API lt_status lt_gguf_writer_write(lt_ctx *ctx, lt_gguf_writer *w, const void *data, size_t n);
/* Checks that every declared byte was written, then fsyncs and renames the temporary onto path.
 * LT_ERR_INVALID_ARG (bytes missing, named by tensor), LT_ERR_IO. */
LT_API lt_status lt_gguf_writer_finish(lt_ctx *ctx, lt_gguf_writer *w);

/* The ggml type id of a dtype (F32 0, F16 1, Q4_0 2, ..., BF16 30); -1 when ggml has none. */
LT_API int lt_gguf_ggml_type_of(lt_dtype t);

#ifdef __cplusplus
}
#endif
#endif
