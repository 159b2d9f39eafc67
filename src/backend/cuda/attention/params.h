/* The device-side parameter block of the CUDA attention kernels: every pointer and stride a kernel
 * reads, filled once per call by lt_attn_cuda_prepare (prepare.cu) from the validated
 * lt_attention_params / lt_attention_args and passed by value to every kernel. The public boundary
 * (validation of shapes, offsets, window) lives in src/backend/attention.c; nothing here
 * re-validates. C++ only (bf16 pointer types); private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_PARAMS_H
#define LT_ATTN_PARAMS_H

#include <stdint.h>

#include <cuda_bf16.h>

/* Strides in elements, D contiguous. Workspace (lt_attention_cuda_workspace_bytes, in this order):
 * lo (B, T) int32; backward only: delta (B, H, T), then dq_acc (B, T, H, D) fp32 unless dQ has its
 * own kernel, then dkv_acc (2, B, T, Hkv, D) fp32 when the heads of a group are split over CTAs. */
struct lt_attn_dev {
    const __nv_bfloat16 *q, *k, *v;
    __nv_bfloat16 *o;
    float *lse; /* (B, H, T) natural log */
    const __nv_bfloat16 *dout;
    __nv_bfloat16 *dq, *dk, *dv;
    float *dq_acc;     /* (B, T, H, D) fp32, contiguous */
    float *delta;      /* (B, H, T): rowsum(dO * O) */
    float *dkv_acc;    /* NULL, or (2, B, T, Hkv, D) fp32 sums of dK, dV when nsplit > 1 */
    int nsplit;        /* backward: CTAs sharing one kv head's query heads (1 = one CTA) */
    int no_dq;         /* backward main kernel: dQ comes from the dQ kernel instead */
    const int32_t *lo; /* (B, T): first key token t may see (packing and window folded in); the
                               workspace's, or the prepared batch's bounds */
    int64_t q_sb, q_st, q_sh, kv_sb, kv_st, kv_sh, o_sb, o_st, o_sh, dq_sb, dq_st, dq_sh;
    int T, H, Hkv, group;
    float scale;   /* softmax scale */
    float softcap; /* 0 = off */
};

#endif
