/* longtune status codes and the library context.
 * Every fallible call returns an lt_status and, on failure, leaves a message in the context's
 * error buffer naming the problem (file:line, key, index). The library never exits the process;
 * broken invariants go through LT_ASSERT, which calls a settable abort hook. */
#ifndef LONGTUNE_STATUS_H
#define LONGTUNE_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_status {
    LT_OK = 0,
    LT_ERR_INVALID_ARG, /* a caller-supplied value is out of range or inconsistent */
    LT_ERR_SHAPE,       /* tensor shapes do not agree */
    LT_ERR_DTYPE,       /* tensor dtype not accepted here */
    LT_ERR_UNSUPPORTED, /* a valid request this build or backend does not implement */
    LT_ERR_OOM,         /* host or device allocation failed or would pass the hard limit */
    LT_ERR_IO,          /* open/read/write/fsync/rename failed */
    LT_ERR_FORMAT,      /* a file or record is malformed (truncated, bad offsets, bad JSON) */
    LT_ERR_NOT_FOUND,   /* a named file, key or tensor is absent */
    LT_ERR_CUDA,        /* a CUDA runtime or library call failed */
    LT_ERR_INTERRUPTED, /* stopped by a signal or by the memory guard */
    LT_ERR_DIVERGED,    /* training produced a non-finite loss, gradient norm or parameter */
    LT_STATUS_COUNT_
} lt_status;

/* Static, never NULL: "ok", "invalid argument", ... ; "unknown status" outside the enum. */
LT_API const char *lt_status_str(lt_status s);

typedef enum lt_device { LT_DEVICE_CPU = 0, LT_DEVICE_CUDA = 1, LT_DEVICE_COUNT_ } lt_device;

/* Library context: error buffer, allocator accounting per device, limits, fault injection and
 * thread count. Opaque; one per run or per test. Not thread-safe for concurrent error setting,
 * but the allocator accounting inside it is. */
typedef struct lt_ctx lt_ctx;

/* Returns NULL only if the host cannot allocate the small context itself. */
LT_API lt_ctx *lt_ctx_new(void);
LT_API void lt_ctx_free(lt_ctx *ctx);

/* The message of the last failure recorded in ctx ("" when none). Valid until the next error. */
LT_API const char *lt_ctx_error(const lt_ctx *ctx);
LT_API lt_status lt_ctx_status(const lt_ctx *ctx);
LT_API void lt_ctx_clear_error(lt_ctx *ctx);

/* Records status and a printf-style message in ctx and returns status, so callers can write
 * `return lt_error(ctx, LT_ERR_FORMAT, "%s:%d: ...", file, line);`. ctx may be NULL. */
LT_API lt_status lt_error(lt_ctx *ctx, lt_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Threads used by parallel loops (0 = OpenMP default). */
LT_API void lt_ctx_set_threads(lt_ctx *ctx, int threads);
LT_API int lt_ctx_threads(const lt_ctx *ctx);

/* Abort hook for broken invariants: called with file, line and message; if it returns,
 * abort() follows. Process-wide. NULL restores the default (print to stderr). */
typedef void (*lt_abort_fn)(const char *file, int line, const char *msg);
LT_API void lt_set_abort_hook(lt_abort_fn fn);
LT_API void lt_abort_at(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4), noreturn))
#endif
    ;

#define LT_ABORT(...) lt_abort_at(__FILE__, __LINE__, __VA_ARGS__)
#define LT_ASSERT(cond)                                                              \
    do {                                                                             \
        if (!(cond)) lt_abort_at(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

/* Propagate a failing status: `LT_TRY(lt_foo(...));` inside a function returning lt_status. */
#define LT_TRY(expr)                              \
    do {                                          \
        lt_status lt_try_s_ = (expr);             \
        if (lt_try_s_ != LT_OK) return lt_try_s_; \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
