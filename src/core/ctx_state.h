/* The per-device slot of a context where a backend keeps its instance state (the CUDA backend:
 * stream, cuBLASLt handle and plans, workspace, SM count, capture state). The context only stores
 * the pointer and frees it through the backend's function in lt_ctx_free; what the state holds
 * is the backend's business. One host thread runs a context's ops, so the slot takes no lock. */
#ifndef LT_CORE_CTX_STATE_H
#define LT_CORE_CTX_STATE_H

#include "longtune/status.h"

/* The state stored for dev, or NULL (none yet, ctx NULL or dev out of range). */
void *lt_ctx_backend_state(const lt_ctx *ctx, lt_device dev);
/* Stores state for dev and the function lt_ctx_free calls on it; a state already stored is freed
 * first. Does nothing when ctx is NULL or dev out of range. */
void lt_ctx_set_backend_state(lt_ctx *ctx, lt_device dev, void *state, void (*free_fn)(void *state));

/* The CPU's bf16 products (lt_model_run_options.bf16_products) for the weight products that follow:
 * the bytes of the workspace those calls get, which the layout sized for them (0 = off, the f32
 * products). The model sets it around its projections' calls and clears it after. */
void lt_ctx_set_bf16x(lt_ctx *ctx, size_t ws_bytes);
size_t lt_ctx_bf16x(const lt_ctx *ctx);

#endif
