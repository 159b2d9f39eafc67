/* f32 attention on CUDA (the model keeps f32 activations): q, k, v (and for the backward out and
 * dout) are rounded to contiguous bf16 copies in the workspace, the bf16 flash kernels run on
 * those, and out (dq, dk, dv) are widened back into the caller's f32 tensors with their layouts.
 * The bf16 out that the forward widens is exactly what the backward re-rounds, so the backward's
 * rowsum(dO·O) sees the forward's values. No kernel here computes attention itself. */
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/attention_impl.h"
}

/* The bf16 copies, in workspace order, then the bf16 kernels' own workspace. */
typedef struct f32_layout {
    size_t q, k, v, o, dout, dq, dk, dv, inner, total;
} f32_layout;

static lt_attention_params inner_params(const lt_attention_params *p) {
    lt_attention_params r = *p;
    r.dtype = LT_DTYPE_BF16;
    r.q_layout.batch = p->T * p->H * p->D, r.q_layout.token = p->H * p->D, r.q_layout.head = p->D;
    r.o_layout = r.q_layout;
    r.kv_layout.batch = p->T * p->Hkv * p->D, r.kv_layout.token = p->Hkv * p->D, r.kv_layout.head = p->D;
    return r;
}

static f32_layout f32_plan(const lt_attention_params *p, int backward) {
    const size_t nq = (size_t)p->B * (size_t)p->T * (size_t)p->H * (size_t)p->D * 2;
    const size_t nkv = (size_t)p->B * (size_t)p->T * (size_t)p->Hkv * (size_t)p->D * 2;
    f32_layout l;
    memset(&l, 0, sizeof l);
    size_t at = 0;
    l.q = at, at += lt_cuda_align(nq);
    l.k = at, at += lt_cuda_align(nkv);
    l.v = at, at += lt_cuda_align(nkv);
    l.o = at, at += lt_cuda_align(nq);
    if (backward) {
        l.dout = at, at += lt_cuda_align(nq);
        l.dq = at, at += lt_cuda_align(nq);
        l.dk = at, at += lt_cuda_align(nkv);
        l.dv = at, at += lt_cuda_align(nkv);
    }
    l.inner = at;
    lt_attention_params r = inner_params(p);
    l.total = at + lt_attention_cuda_workspace_bytes(&r, backward, 0);
    return l;
}

extern "C" size_t lt_attention_cuda_f32_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    (void)threads;
    return f32_plan(p, backward).total;
}

/* (B, T, heads, D) with strides (sb, st, sh) <-> contiguous: one warp-row of 32 threads per (b, t,
 * h) row, 8 rows per block, D walked in steps of 32. */
struct rows {
    int64_t B, T, heads, D, sb, st, sh;
};

static __device__ __forceinline__ int64_t row_base(const rows &r, int64_t row) {
    int64_t h = row % r.heads, bt = row / r.heads, t = bt % r.T, b = bt / r.T;
    return b * r.sb + t * r.st + h * r.sh;
}

static __global__ void f32_to_bf16_rows(rows r, const float *src, __nv_bfloat16 *dst) {
    const int64_t nrows = r.B * r.T * r.heads;
    for (int64_t row = blockIdx.x * 8 + threadIdx.y; row < nrows; row += (int64_t)gridDim.x * 8) {
        const float *s = src + row_base(r, row);
        __nv_bfloat16 *d = dst + row * r.D;
        for (int64_t i = threadIdx.x; i < r.D; i += 32) d[i] = __float2bfloat16_rn(s[i]);
    }
}

static __global__ void bf16_to_f32_rows(rows r, const __nv_bfloat16 *src, float *dst) {
    const int64_t nrows = r.B * r.T * r.heads;
    for (int64_t row = blockIdx.x * 8 + threadIdx.y; row < nrows; row += (int64_t)gridDim.x * 8) {
        const __nv_bfloat16 *s = src + row * r.D;
        float *d = dst + row_base(r, row);
        for (int64_t i = threadIdx.x; i < r.D; i += 32) d[i] = __bfloat162float(s[i]);
    }
}

static rows rows_of(const lt_attention_params *p, int64_t heads, lt_attention_layout l) {
    rows r = {p->B, p->T, heads, p->D, l.batch, l.token, l.head};
    return r;
}

static unsigned row_blocks(const rows &r) {
    int64_t b = (r.B * r.T * r.heads + 7) / 8;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

static lt_status narrow(lt_ctx *ctx, const rows &r, const void *src, char *ws, size_t off, cudaStream_t stream) {
    f32_to_bf16_rows<<<row_blocks(r), dim3(32, 8), 0, stream>>>(r, (const float *)src, (__nv_bfloat16 *)(ws + off));
    return lt_cuda_check(ctx, cudaGetLastError(), "attention (CUDA f32): conversion to bf16");
}

static lt_status widen(lt_ctx *ctx, const rows &r, const char *ws, size_t off, void *dst, cudaStream_t stream) {
    bf16_to_f32_rows<<<row_blocks(r), dim3(32, 8), 0, stream>>>(r, (const __nv_bfloat16 *)(ws + off), (float *)dst);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention (CUDA f32): conversion to f32");
}

/* The boundary (attention.c) has resolved layouts and checked workspace size; p->dtype is F32. */
static lt_status f32_run(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a, int backward) {
    if (p->T == 0 || p->B == 0) return LT_OK;
    const cudaStream_t stream = lt_cuda_stream(ctx);
    const f32_layout l = f32_plan(p, backward);
    char *ws = (char *)a->workspace;
    const lt_attention_params r = inner_params(p);
    const rows rq = rows_of(p, p->H, p->q_layout), rk = rows_of(p, p->Hkv, p->kv_layout),
               ro = rows_of(p, p->H, p->o_layout);
    lt_attention_args b;
    memset(&b, 0, sizeof b);
    b.q = ws + l.q, b.k = ws + l.k, b.v = ws + l.v, b.out = ws + l.o, b.lse = a->lse;
    b.workspace = ws + l.inner;
    b.workspace_size = l.total - l.inner;
    LT_TRY(narrow(ctx, rq, a->q, ws, l.q, stream));
    LT_TRY(narrow(ctx, rk, a->k, ws, l.k, stream));
    LT_TRY(narrow(ctx, rk, a->v, ws, l.v, stream));
    if (!backward) {
        LT_TRY(lt_attention_cuda_forward(ctx, &r, &b));
        return widen(ctx, ro, ws, l.o, a->out, stream);
    }
    LT_TRY(narrow(ctx, ro, a->out, ws, l.o, stream));
    LT_TRY(narrow(ctx, ro, a->dout, ws, l.dout, stream));
    b.dout = ws + l.dout, b.dq = ws + l.dq, b.dk = ws + l.dk, b.dv = ws + l.dv;
    LT_TRY(lt_attention_cuda_backward(ctx, &r, &b));
    LT_TRY(widen(ctx, rq, ws, l.dq, a->dq, stream));
    LT_TRY(widen(ctx, rk, ws, l.dk, a->dk, stream));
    return widen(ctx, rk, ws, l.dv, a->dv, stream);
}

extern "C" lt_status lt_attention_cuda_f32_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return f32_run(ctx, p, a, 0);
}

extern "C" lt_status lt_attention_cuda_f32_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return f32_run(ctx, p, a, 1);
}
