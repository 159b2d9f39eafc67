/* The warp-specialised attention backward (attention_bwd_ws.cu) as seen by the backward launcher
 * in attention_bwd.cu: whether a call may take it, and its launch. It does not compute delta or
 * clear the dQ accumulator; the caller does both first. Private to src/backend/cuda/. */
#ifndef LT_ATTENTION_BWD_WS_H
#define LT_ATTENTION_BWD_WS_H

#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/cuda_common.cuh"

/* 1 when the kernel handles this call: the plan is the wgmma one with dQ by atomics and one CTA
 * per kv head (no split), D = 64 or 128, no packed rows, no window, T a multiple of 64 (at least
 * 128) and lse 16-byte aligned. */
int lt_attn_bwd_ws_eligible(const lt_attention_params *p, const lt_attn_bwd_plan *pl, const float *lse);

/* Queues the kernel and the dQ conversion on lt_cuda_stream(). d.delta must hold rowsum(dO·O)
 * and d.dq_acc (B·H·T·D fp32, the kernel's own tile order) must be zero. */
lt_status lt_attn_bwd_ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D);

#endif
