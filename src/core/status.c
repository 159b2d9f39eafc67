/* Status strings, the context's error buffer and the abort hook. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "ctx_state.h"

static const char *const status_names[LT_STATUS_COUNT_] = {
    [LT_OK] = "ok",
    [LT_ERR_INVALID_ARG] = "invalid argument",
    [LT_ERR_SHAPE] = "shape mismatch",
    [LT_ERR_DTYPE] = "unsupported dtype",
    [LT_ERR_UNSUPPORTED] = "unsupported",
    [LT_ERR_OOM] = "out of memory",
    [LT_ERR_IO] = "I/O error",
    [LT_ERR_FORMAT] = "malformed input",
    [LT_ERR_NOT_FOUND] = "not found",
    [LT_ERR_CUDA] = "CUDA error",
    [LT_ERR_INTERRUPTED] = "interrupted",
    [LT_ERR_DIVERGED] = "training diverged",
};

const char *lt_status_str(lt_status s) {
    if ((int)s < 0 || s >= LT_STATUS_COUNT_) return "unknown status";
    return status_names[s];
}

lt_ctx *lt_ctx_new(void) {
    lt_ctx *ctx = calloc(1, sizeof *ctx);
    return ctx;
}

void lt_ctx_free(lt_ctx *ctx) {
    if (!ctx) return;
    for (int d = 0; d < LT_DEVICE_COUNT_; d++)
        if (ctx->backend_state[d] && ctx->backend_state_free[d]) ctx->backend_state_free[d](ctx->backend_state[d]);
    free(ctx);
}

void *lt_ctx_backend_state(const lt_ctx *ctx, lt_device dev) {
    if (!ctx || (unsigned)dev >= LT_DEVICE_COUNT_) return NULL;
    return ctx->backend_state[dev];
}

void lt_ctx_set_backend_state(lt_ctx *ctx, lt_device dev, void *state, void (*free_fn)(void *state)) {
    if (!ctx || (unsigned)dev >= LT_DEVICE_COUNT_) return;
    if (ctx->backend_state[dev] && ctx->backend_state_free[dev] && ctx->backend_state[dev] != state)
        ctx->backend_state_free[dev](ctx->backend_state[dev]);
    ctx->backend_state[dev] = state;
    ctx->backend_state_free[dev] = free_fn;
}

void lt_ctx_set_bf16x(lt_ctx *ctx, size_t ws_bytes) {
    if (ctx) ctx->bf16x = ws_bytes;
}

size_t lt_ctx_bf16x(const lt_ctx *ctx) { return ctx ? ctx->bf16x : 0; }

const char *lt_ctx_error(const lt_ctx *ctx) { return ctx ? ctx->error : ""; }
lt_status lt_ctx_status(const lt_ctx *ctx) { return ctx ? ctx->status : LT_OK; }

void lt_ctx_clear_error(lt_ctx *ctx) {
    if (!ctx) return;
    ctx->status = LT_OK;
    ctx->error[0] = '\0';
}

lt_status lt_error(lt_ctx *ctx, lt_status status, const char *fmt, ...) {
    if (!ctx) return status;
    ctx->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
    return status;
}

void lt_ctx_set_threads(lt_ctx *ctx, int threads) {
    if (ctx) ctx->threads = threads < 0 ? 0 : threads;
}
int lt_ctx_threads(const lt_ctx *ctx) { return ctx ? ctx->threads : 0; }

static lt_abort_fn abort_hook;

void lt_set_abort_hook(lt_abort_fn fn) { abort_hook = fn; }

void lt_abort_at(const char *file, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (abort_hook) abort_hook(file, line, msg);
    fprintf(stderr, "longtune: fatal: %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    abort();
}
