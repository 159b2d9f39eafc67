/* Private to the CUDA attention kernels: the device-side parameter block shared by the forward
 * and backward launchers, the workspace layout, and the helper that turns packed-row offsets into
 * a per-token lower key bound. The public boundary (validation of shapes, offsets, window) lives
 * in src/backend/attention.c; nothing here re-validates. */
#ifndef LT_ATTENTION_CUDA_H
#define LT_ATTENTION_CUDA_H

#include <stdint.h>

/* The entry points lt_attention_cuda_{forward,backward,workspace_bytes} are declared in
 * backend/attention_impl.h: bf16 tensors on the device, D in {64, 96, 128}; anything else is
 * LT_ERR_UNSUPPORTED with the reason. The workspace holds the per-token key bounds, and for the
 * backward the fp32 dQ accumulator (B, T, H, D) and the row dot
 * products dO·O (B, H, T). */
#ifdef __cplusplus
extern "C" {
#include "backend/attention_impl.h"
}

#include <cuda_bf16.h>

/* Everything a kernel needs, strides in elements (D contiguous). */
struct lt_attn_dev {
    const __nv_bfloat16 *q, *k, *v;
    __nv_bfloat16 *o;
    float *lse;             /* (B, H, T) natural log */
    const __nv_bfloat16 *dout;
    __nv_bfloat16 *dq, *dk, *dv;
    float *dq_acc;          /* (B, T, H, D) fp32, contiguous */
    float *delta;           /* (B, H, T): rowsum(dO * O) */
    float *dkv_acc;         /* NULL, or (2, B, T, Hkv, D) fp32 sums of dK, dV when nsplit > 1 */
    int nsplit;             /* backward: CTAs sharing one kv head's query heads (1 = one CTA) */
    int no_dq;              /* backward main kernel: dQ comes from attn_bwd_dq_kernel instead */
    const int32_t *lo;      /* (B, T): first key token t may see (packing and window folded in) */
    int64_t q_sb, q_st, q_sh, kv_sb, kv_st, kv_sh, o_sb, o_st, o_sh, dq_sb, dq_st, dq_sh;
    int T, H, Hkv, group;
    float scale;            /* softmax scale */
    float softcap;          /* 0 = off */
};

/* How the backward runs, a function of the shape, the device and (for measurements) the
 * LONGTUNE_ATTN_BWD / _SPLIT / _DQ environment overrides, so that lt_attention_cuda_workspace_bytes
 * is exact. wg: 0 = mma.sync kernels, 1 = wgmma (sm_90a).
 * split: CTAs sharing the query heads of one (key block, kv head) so that short rows fill the GPU
 * (> 1 adds fp32 dK/dV sums to the workspace). dq_sep: dQ by its own kernel (no fp32 buffer),
 * for rows whose visible key ranges are short (packed rows of short sequences, small windows). */
/* Rows whose queries see few keys: packed rows of sequences averaging at most 1024 tokens, or a
 * window of at most 512 keys. Both directions pick kernels for many small tiles then. */
int lt_attn_cuda_sparse(const lt_attention_params *p);

/* bn: keys per CTA of the wgmma main kernel, 128 (two warpgroups) or 64 (one warpgroup, two
 * CTAs per SM; with dq_sep, where the main kernel has no dQ). delta_dq: with dq_sep, the dQ kernel
 * computes delta = rowsum(dO·O) for its rows and runs before the main kernel (no delta pass). */
typedef struct lt_attn_bwd_plan {
    int wg, split, dq_sep, bn, delta_dq;
} lt_attn_bwd_plan;
lt_attn_bwd_plan lt_attn_cuda_bwd_plan(const lt_attention_params *p);

/* The specialisations both launchers implement (bf16; D 64, 96, 128; not the naive oracle) and
 * CUDA's grid limits (grid_heads: the heads one launch spreads over a grid axis): LT_OK, or
 * LT_ERR_UNSUPPORTED naming the reason. */
lt_status lt_attn_cuda_supported(lt_ctx *ctx, const lt_attention_params *p, int64_t grid_heads);

/* Fills the common part of the parameter block, builds the key bounds into the workspace and
 * returns the first unused workspace byte offset in *used. */
lt_status lt_attn_cuda_prepare(lt_ctx *ctx, const lt_attention_params *p, const lt_attention_args *a,
                               void *workspace, lt_attn_dev *d, size_t *used);
#endif

#endif
