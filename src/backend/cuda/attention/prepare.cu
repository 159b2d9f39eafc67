/* What every CUDA attention call does first: the specialisation check, the parameter block, the
 * per-token key bounds from packed-row offsets and sliding window (or those a per-batch
 * preparation computed once, lt_attention_cuda_batch_prepare, with the same kernels), and the
 * workspace size (from the same backward plan the launch uses, so the two agree). */
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/cuda_common.cuh"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Key bounds: lo[b*T + t] = first key token t may attend to (start of its packed sequence, raised
 * by the sliding window). Non-decreasing in t within a row, which is what tile skipping uses. */
/* Sequence offsets passed by value (a kernel parameter, so no host-to-device copy precedes the
 * launch): packed rows of up to LT_ATTN_OFFS_INLINE - 1 sequences in all, which covers training
 * batches of short sequences, where the copy's latency is a visible share of the call. */
struct lt_attn_offs_inline {
    int32_t o[LT_ATTN_OFFS_INLINE];
};

static __device__ __forceinline__ int32_t attn_lo_of(const int32_t *o, int64_t S, int t, int64_t window) {
    int64_t start = 0;
    if (o) {
        int64_t a = 0, z = S; /* largest s in [0, S) with o[s] <= t */
        while (a < z) {
            int64_t m = (a + z + 1) / 2;
            if (o[m] <= t) a = m;
            else z = m - 1;
        }
        if (a >= S) a = S - 1;
        start = o[a];
    }
    if (window > 0 && (int64_t)t - window + 1 > start) start = (int64_t)t - window + 1;
    return (int32_t)start;
}

static __global__ void attn_build_lo(const int32_t *off, int64_t S, int T, int B, int64_t window, int32_t *lo) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * T) return;
    const int b = (int)(idx / T), t = (int)(idx % T);
    lo[idx] = attn_lo_of(off ? off + (int64_t)b * (S + 1) : NULL, S, t, window);
}

static __global__ void attn_build_lo_inline(lt_attn_offs_inline off, int64_t S, int T, int B, int64_t window,
                                            int32_t *lo) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * T) return;
    const int b = (int)(idx / T), t = (int)(idx % T);
    lo[idx] = attn_lo_of(off.o + (int64_t)b * (S + 1), S, t, window);
}

/* Longer host offsets travel in pieces of up to LT_ATTN_OFFS_INLINE entries, one launch each: the
 * piece o[i0..i1] of row b covers tokens [o[i0], o[i1]) (from 0 for the first piece, to T for the
 * last), whose sequences all start inside the piece. No copy, no host wait, graph-capturable. */
static __global__ void attn_build_lo_piece(lt_attn_offs_inline off, int n, int b, int t_begin, int t_end, int T,
                                           int64_t window, int32_t *lo) {
    const int t = t_begin + (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= t_end) return;
    lo[(int64_t)b * T + t] = attn_lo_of(off.o, n - 1, t, window);
}

/* Queues lo (B, T) for p's offsets (host or device memory) and window on `stream`. */
static lt_status key_bounds(lt_ctx *ctx, const lt_attention_params *p, int32_t *lo, cudaStream_t stream) {
    const int32_t *dev_off = NULL;
    int64_t n = p->B * p->T;
    const unsigned nb_lo = (unsigned)((n + 255) / 256);
    int inl = 0;
    if (p->seq_offsets) {
        /* Offsets may live on the host (the boundary validated them there) or on the device. Host
         * offsets travel as kernel parameters: all rows in one launch when they fit, else in
         * pieces (attn_build_lo_piece), so the step never waits on a host-to-device copy. */
        cudaPointerAttributes attr;
        cudaError_t e = cudaPointerGetAttributes(&attr, p->seq_offsets);
        if (e != cudaSuccess) (void)cudaGetLastError();
        size_t nb = (size_t)p->B * (size_t)(p->S + 1) * 4;
        if (e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)) {
            dev_off = p->seq_offsets;
        } else if (nb <= sizeof(lt_attn_offs_inline)) {
            lt_attn_offs_inline in;
            memcpy(in.o, p->seq_offsets, nb);
            attn_build_lo_inline<<<nb_lo, 256, 0, stream>>>(in, p->S, (int)p->T, (int)p->B, p->window, lo);
            inl = 1;
        } else {
            for (int64_t b = 0; b < p->B; b++) {
                const int32_t *o = p->seq_offsets + b * (p->S + 1);
                for (int64_t i0 = 0; i0 < p->S;) {
                    const int64_t i1 = i0 + LT_ATTN_OFFS_INLINE - 1 < p->S ? i0 + LT_ATTN_OFFS_INLINE - 1 : p->S;
                    const int t0 = i0 == 0 ? 0 : o[i0], t1 = i1 == p->S ? (int)p->T : o[i1];
                    if (t1 > t0) {
                        lt_attn_offs_inline in;
                        memcpy(in.o, o + i0, (size_t)(i1 - i0 + 1) * 4);
                        attn_build_lo_piece<<<(unsigned)((t1 - t0 + 255) / 256), 256, 0, stream>>>(in,
                                                                                                   (int)(i1 - i0 + 1),
                                                                                                   (int)b, t0, t1,
                                                                                                   (int)p->T, p->window,
                                                                                                   lo);
                    }
                    i0 = i1;
                }
            }
            inl = 1;
        }
    }
    if (!inl) attn_build_lo<<<nb_lo, 256, 0, stream>>>(dev_off, p->S, (int)p->T, (int)p->B, p->window, lo);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention (CUDA): key bounds kernel");
}

extern "C" size_t lt_attention_cuda_batch_bytes(const lt_attention_params *p) {
    return lt_cuda_align((size_t)p->B * (size_t)p->T * 4);
}

extern "C" lt_status lt_attention_cuda_batch_prepare(lt_ctx *ctx, const lt_attention_params *p, lt_attention_batch *b) {
    if (p->T > INT32_MAX / 2 || p->B > LT_ATTN_GRID_YZ_MAX)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): B, H or T beyond the grid limits");
    return key_bounds(ctx, p, (int32_t *)b->bounds, lt_cuda_stream(ctx));
}

extern "C" size_t lt_attention_cuda_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    (void)threads;
    size_t n = lt_cuda_align((size_t)p->B * (size_t)p->T * 4);
    if (backward) {
        const lt_attn_cuda_tuning force = lt_attn_cuda_tuning_get();
        const lt_attn_bwd_plan pl = lt_attn_bwd_choose(p, lt_attn_cuda_device(), &force);
        n += lt_cuda_align((size_t)p->B * (size_t)p->H * (size_t)p->T * 4);
        if (!pl.dq_sep)
            n += lt_cuda_align((size_t)p->B * (size_t)p->T * (size_t)p->H * (size_t)lt_attn_dq_acc_cols(p, &pl) * 4);
        if (pl.split > 1)
            n += lt_cuda_align((size_t)2 * (size_t)p->B * (size_t)p->T * (size_t)p->Hkv * (size_t)p->D * 4);
    }
    return n;
}

static int64_t stride_or(int64_t s, int64_t dflt) { return s ? s : dflt; }

lt_status lt_attn_cuda_supported(lt_ctx *ctx, const lt_attention_params *p, int64_t grid_heads) {
    if (p->dtype != LT_DTYPE_BF16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): dtype %s; only bf16 is implemented",
                        lt_dtype_name(p->dtype));
    static const int64_t dims[] = LT_ATTENTION_CUDA_HEAD_DIMS;
    int dim_ok = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) dim_ok |= dims[i] == p->D;
    if (!dim_ok)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): head dim %lld; implemented: %s", (long long)p->D,
                        LT_ATTENTION_CUDA_HEAD_DIMS_TEXT);
    if (p->impl == LT_ATTENTION_NAIVE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): the naive oracle is CPU-only");
    if (p->T > INT32_MAX / 2 || p->B > LT_ATTN_GRID_YZ_MAX || grid_heads > LT_ATTN_GRID_YZ_MAX)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): B, H or T beyond the grid limits");
    return LT_OK;
}

lt_status lt_attn_cuda_prepare(lt_ctx *ctx, const lt_attention_params *p, const lt_attention_args *a, void *workspace,
                               lt_attn_dev *d, size_t *used, cudaStream_t stream) {
    const int64_t T = p->T, H = p->H, Hkv = p->Hkv, D = p->D;
    memset(d, 0, sizeof *d);
    d->q = (const __nv_bfloat16 *)a->q;
    d->k = (const __nv_bfloat16 *)a->k;
    d->v = (const __nv_bfloat16 *)a->v;
    d->o = (__nv_bfloat16 *)a->out;
    d->lse = a->lse;
    d->dout = (const __nv_bfloat16 *)a->dout;
    d->dq = (__nv_bfloat16 *)a->dq;
    d->dk = (__nv_bfloat16 *)a->dk;
    d->dv = (__nv_bfloat16 *)a->dv;
    d->q_sb = stride_or(p->q_layout.batch, T * H * D);
    d->q_st = stride_or(p->q_layout.token, H * D);
    d->q_sh = stride_or(p->q_layout.head, D);
    d->kv_sb = stride_or(p->kv_layout.batch, T * Hkv * D);
    d->kv_st = stride_or(p->kv_layout.token, Hkv * D);
    d->kv_sh = stride_or(p->kv_layout.head, D);
    d->o_sb = stride_or(p->o_layout.batch, T * H * D);
    d->o_st = stride_or(p->o_layout.token, H * D);
    d->o_sh = stride_or(p->o_layout.head, D);
    /* dq shares the query layout (lt_attention_args: "dq: out (B, T, H, D), q_layout"). */
    d->dq_sb = d->q_sb;
    d->dq_st = d->q_st;
    d->dq_sh = d->q_sh;
    d->T = (int)T;
    d->H = (int)H;
    d->Hkv = (int)Hkv;
    d->group = (int)(H / Hkv);
    d->scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)D);
    d->softcap = p->softcap;

    /* cp.async moves 16-byte pieces: every row start must be 16-byte aligned. */
    const int64_t strides[9] = {d->q_sb, d->q_st, d->q_sh, d->kv_sb, d->kv_st, d->kv_sh, d->o_sb, d->o_st, d->o_sh};
    for (int i = 0; i < 9; i++)
        if (strides[i] % 8)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "attention (CUDA): strides must be multiples of 8 elements (16 bytes)");
    const void *ptrs[8] = {a->q, a->k, a->v, a->out, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 8; i++)
        if ((uintptr_t)ptrs[i] % 16)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): tensors must be 16-byte aligned");

    char *ws = (char *)workspace;
    size_t off = 0;
    int32_t *lo = (int32_t *)(ws + off);
    off += lt_cuda_align((size_t)p->B * (size_t)T * 4);
    if (p->batch && p->batch->bounds) {
        d->lo = (const int32_t *)p->batch->bounds; /* computed once for the batch */
    } else {
        LT_TRY(key_bounds(ctx, p, lo, stream));
        d->lo = lo;
    }
    *used = off;
    return LT_OK;
}
