/* Which kernels run for a call: pure functions of the call's parameters, the device's properties
 * and the caller's override (tuning.h), so that lt_attention_cuda_workspace_bytes and the launch
 * always agree. The device's properties come from lt_attn_cuda_device, the one place that asks
 * the runtime. Private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_HEURISTICS_H
#define LT_ATTN_HEURISTICS_H

#include "backend/cuda/attention/tuning.h"

extern "C" {
#include "backend/attention_impl.h"
}

/* What the heuristics need to know of the device. */
typedef struct lt_attn_device {
    int sm_count; /* multiprocessors */
    int wgmma;    /* compute capability 9.0: the sm_90a kernels (wgmma, TMA) run */
    int tma;      /* the driver offers cuTensorMapEncodeTiled (the TMA kernels' host side) */
} lt_attn_device;

/* The current device's properties, queried once per device and cached. */
const lt_attn_device *lt_attn_cuda_device(void);

/* Rows whose queries see few keys (tuning.h: LT_ATTN_SPARSE_*). */
int lt_attn_sparse(const lt_attention_params *p);

/* The forward kernel for D = 64, 128 or 256 (D = 96 always runs LT_ATTN_FWD_MMA; D = 256 runs
 * LT_ATTN_FWD_WG1 or, off compute capability 9.0, LT_ATTN_FWD_MMA). */
lt_attn_fwd_kind lt_attn_fwd_choose(const lt_attention_params *p, const lt_attn_device *dev,
                                    const lt_attn_cuda_tuning *force);

/* How the backward runs. wg: 0 = mma.sync kernels, 1 = wgmma (D = 256: bwd_wg256.cu, with split 1,
 * dQ by atomics, bn 64). split: CTAs sharing the query heads
 * of one (key block, kv head) (> 1 adds fp32 dK/dV sums to the workspace). dq_sep: dQ by its own
 * kernel (no fp32 buffer). bn: keys per CTA of the wgmma main kernel, 128 (two warpgroups) or 64
 * (one warpgroup, two CTAs per SM; only with dq_sep). delta_dq: with dq_sep, the dQ kernel forms
 * delta = rowsum(dO·O) and runs before the main kernel (no delta pass). ws_ok: the
 * warp-specialised kernel may replace the wgmma main kernel where lt_attn_bwd_ws_eligible says
 * the call suits it. */
typedef struct lt_attn_bwd_plan {
    int wg, split, dq_sep, bn, delta_dq, ws_ok;
} lt_attn_bwd_plan;
lt_attn_bwd_plan lt_attn_bwd_choose(const lt_attention_params *p, const lt_attn_device *dev,
                                    const lt_attn_cuda_tuning *force);

/* 1 when the warp-specialised backward handles the call: ws_ok, the wgmma plan with dQ by atomics
 * and one CTA per kv head (no split), D = 64, 96 (padded to 128) or 128, no packed rows, no window,
 * T a multiple of 64 (at least 128) and lse 16-byte aligned. */
int lt_attn_bwd_ws_eligible(const lt_attention_params *p, const lt_attn_bwd_plan *pl, const float *lse);

/* The floats in a (b, t, h) row of the fp32 dQ sums (lt_attn_dev.dq_acc): D, or 128 at a padded head
 * dim whose call the warp-specialised backward may take (its dQ tiles keep the kernel's 128-wide
 * layout), decided without the lse so the workspace is sized before the call. */
int lt_attn_dq_acc_cols(const lt_attention_params *p, const lt_attn_bwd_plan *pl);

#endif
