/* The attention implementations each backend's table names in its attention slots (backend.h),
 * and the limits its `supports` (supports.c) reads. The boundary (src/backend/attention.c) has
 * validated every field, asked `supports` and resolved the defaults before these run: layouts are
 * explicit (never all-zero), scale is set, and args.workspace points at args.workspace_size >= the
 * backend's workspace bytes on p->device. Nothing here re-validates. */
#ifndef LT_BACKEND_ATTENTION_IMPL_H
#define LT_BACKEND_ATTENTION_IMPL_H

#include "longtune/attention.h"

/* The CUDA attention kernels (src/backend/cuda/attention_{fwd,bwd}.cu) are built whenever the
 * CUDA backend is; without it the CUDA `supports` answers LT_ERR_UNSUPPORTED "not in this build". */
#ifndef LT_HAVE_CUDA_ATTENTION
#define LT_HAVE_CUDA_ATTENTION LT_HAVE_CUDA
#endif

/* Largest head dim the CPU backend takes (any D in 1..256). */
#define LT_ATTENTION_CPU_MAX_D 256

/* Head dims the CUDA kernels are specialised for (LT_ATTENTION_CUDA_HEAD_DIMS, listed once in the
 * CUDA attention tuning header, plain C); anything else is LT_ERR_UNSUPPORTED. */
#include "backend/cuda/attention/tuning.h"

/* CPU reference backend (src/backend/cpu/attention_*.c). `threads` as in
 * lt_attention_workspace_bytes. */
size_t lt_attention_cpu_workspace_bytes(const lt_attention_params *p, int backward, int threads);
lt_status lt_attention_cpu_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
lt_status lt_attention_cpu_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);

#if LT_HAVE_CUDA_ATTENTION
size_t lt_attention_cuda_workspace_bytes(const lt_attention_params *p, int backward, int threads);
lt_status lt_attention_cuda_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
lt_status lt_attention_cuda_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
/* The per-batch key bounds (prepare.cu), for any dtype: (B, T) int32 into b->bounds, queued. */
size_t lt_attention_cuda_batch_bytes(const lt_attention_params *p);
lt_status lt_attention_cuda_batch_prepare(lt_ctx *ctx, const lt_attention_params *p, lt_attention_batch *b);
/* f32 tensors on the device (src/backend/cuda/attention/f32.cu): converted to bf16 copies in the
 * workspace around the bf16 kernels above; the workspace counts the copies and theirs. The CUDA
 * table's slots pick these or the bf16 ones by p->dtype. */
size_t lt_attention_cuda_f32_workspace_bytes(const lt_attention_params *p, int backward, int threads);
lt_status lt_attention_cuda_f32_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
lt_status lt_attention_cuda_f32_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
#endif

#endif
