/* The linear cross-entropy implementations each backend's table names in its lce slots
 * (backend.h). Every entry point here is called only after lce.c has validated shapes, dtypes,
 * host targets, weights and options and asked the backend's `supports`, and with resolved
 * options: impl is never AUTO and ignore_index is the real (negative) index; tile_n/tile_v of 0
 * mean the backend's defaults. Nothing here re-validates. */
#ifndef LT_BACKEND_LCE_IMPL_H
#define LT_BACKEND_LCE_IMPL_H

#include "longtune/lce.h"

/* CPU reference backend (src/backend/cpu/lce_*.c). workspace: a->workspace if set, else one
 * lt_alloc block of lt_lce_cpu_workspace_bytes(). */
lt_status lt_lce_cpu_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
lt_status lt_lce_cpu_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
lt_status lt_lce_cpu_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
/* pass: LT_LCE_PASS_FORWARD, _BACKWARD or _FORWARD_BACKWARD (lce.h). */
size_t lt_lce_cpu_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads);
/* Tile sizes the CPU backend uses when the options leave them 0. */
void lt_lce_cpu_default_tiles(lt_lce_impl impl, int *tile_n, int *tile_v);

/* CUDA backend (src/backend/cuda/lce.cu, built with the CUDA backend): same contract. Targets and
 * weights live on the device there; the backend checks them there (first bad position named) before
 * computing. bf16 h (f32 h arrives through the f32 entry points below), bf16 or block-quantized
 * heads (`supports` refuses the others). */
lt_status lt_lce_cuda_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
lt_status lt_lce_cuda_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
lt_status lt_lce_cuda_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
size_t lt_lce_cuda_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads);
/* The token chunk and vocabulary tile width lt_lce_cuda_forward_backward's one pass takes at this
 * shape (the options' tile_n / tile_v and fp32_logit_tiles read as it reads them). */
void lt_lce_cuda_fb_tiles(const lt_lce_options *opt, int64_t N, int64_t V, int64_t C, int quantized, int64_t *nc,
                          int64_t *vc);
/* f32 h on CUDA (src/backend/cuda/lce_f32.cu): h rounded to a bf16 copy at the start of the
 * workspace, then the entry point above of `pass` (LT_LCE_PASS_*); the workspace counts the copy
 * and theirs. */
lt_status lt_lce_cuda_f32_run(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a, int pass);
size_t lt_lce_cuda_f32_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads);

#endif
