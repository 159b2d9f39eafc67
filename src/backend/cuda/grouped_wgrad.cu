/* The experts' weight gradients on CUDA (grouped_matmul_wgrad): dw_e = beta·dw_e + dy_eᵀ·x_e for
 * all experts in one launch. One side of dw_e is a LoRA rank r (the narrow side, the smaller of
 * out and in), the other a model width (the wide side); the op reads every grouped row of dy and
 * x once and does r multiply-adds per wide element read, so at LoRA ranks it is bound by reading
 * its inputs, and it runs on fp32 FMA with the inputs read as they are (no bf16 rounding) and fp32
 * accumulation.
 *
 * A CTA owns one (expert, 64 wide columns, 16 narrow columns) tile of dw and walks all of that
 * expert's rows, found from the offsets on the device (no host wait; capturable in a graph): no
 * partials leave the CTA, so the call needs no workspace and no atomics. Rows stream through a
 * 4-stage cp.async pipeline of 32 rows a stage; the 256 threads form 4 row groups (group g sums the
 * rows g, g + 4, ... of each stage, in order) of 64 threads with a 4 × 4 block of the tile each,
 * and the groups' partials are added in group order at the end. Every element is thus one sum in
 * an order fixed by the expert's row count alone: the same call gives the same bits. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define GW_TW 64 /* wide columns of a tile */
#define GW_RN 16 /* narrow columns of a tile */
#define GW_BR 32 /* rows of a pipeline stage */
#define GW_STAGES 4
#define GW_THREADS 256
#define GW_GROUPS 4        /* row groups of a CTA */
#define GW_RLD (GW_TW + 1) /* row stride of the partials' reduction area (odd: no bank conflicts) */

typedef struct gw_params {
    const int32_t *off;
    const float *wide, *narrow; /* grouped rows: (nk, nw) and (nk, r) */
    float *dw;
    int64_t nw, r, in, per; /* per: floats of one expert's dw (out·in) */
    int narrow_out;         /* the narrow side is dw's rows (out = r, dw_e[j][c]); else dw_e[c][j] */
    float beta;
} gw_params;

/* 4-byte async copy; ok = 0 zero-fills. */
static __device__ __forceinline__ void gw_cp4(float *smem, const float *g, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(lt_smem_addr(smem)), "l"(g), "r"(ok ? 4 : 0));
}

/* WV / NV: the wide / narrow rows are whole float4s (width a multiple of 4, 16-byte aligned base),
 * copied 16 bytes at a time; else 4. */
template <bool WV, bool NV>
static __global__ void __launch_bounds__(GW_THREADS, WV ? 4 : 2) grouped_wgrad_k(gw_params p) {
    __shared__ __align__(16) float sw[GW_STAGES][GW_BR][GW_TW];
    __shared__ __align__(16) float sn[GW_STAGES][GW_BR][GW_RN];
    const int tid = threadIdx.x, e = (int)blockIdx.y;
    const int64_t c0 = (int64_t)blockIdx.x * GW_TW, j0 = (int64_t)blockIdx.z * GW_RN;
    const int64_t m0 = p.off[e], m1 = p.off[e + 1];
    const int64_t nb = (m1 - m0 + GW_BR - 1) / GW_BR;

    /* Stage s gets rows [m0 + 32·b, +32) of the tile's columns; rows past the expert and columns
     * past the matrix are zeros. */
    const auto load = [&](int64_t b, int s) {
        const int64_t rb = m0 + b * GW_BR;
        if constexpr (WV) {
#pragma unroll
            for (int q = 0; q < GW_BR * GW_TW / 4 / GW_THREADS; q++) {
                const int i = tid + q * GW_THREADS, rr = i / (GW_TW / 4), cc = (i % (GW_TW / 4)) * 4;
                const int64_t row = rb + rr, col = c0 + cc;
                const bool ok = row < m1 && col < p.nw;
                lt_cp_async16(&sw[s][rr][cc], ok ? p.wide + row * p.nw + col : p.wide, ok ? 16 : 0);
            }
        } else {
#pragma unroll
            for (int q = 0; q < GW_BR * GW_TW / GW_THREADS; q++) {
                const int i = tid + q * GW_THREADS, rr = i / GW_TW, cc = i % GW_TW;
                const int64_t row = rb + rr, col = c0 + cc;
                const bool ok = row < m1 && col < p.nw;
                gw_cp4(&sw[s][rr][cc], ok ? p.wide + row * p.nw + col : p.wide, ok);
            }
        }
        if constexpr (NV) {
            if (tid < GW_BR * GW_RN / 4) {
                const int rr = tid / (GW_RN / 4), cc = (tid % (GW_RN / 4)) * 4;
                const int64_t row = rb + rr, col = j0 + cc;
                const bool ok = row < m1 && col < p.r;
                lt_cp_async16(&sn[s][rr][cc], ok ? p.narrow + row * p.r + col : p.narrow, ok ? 16 : 0);
            }
        } else {
#pragma unroll
            for (int q = 0; q < GW_BR * GW_RN / GW_THREADS; q++) {
                const int i = tid + q * GW_THREADS, rr = i / GW_RN, cc = i % GW_RN;
                const int64_t row = rb + rr, col = j0 + cc;
                const bool ok = row < m1 && col < p.r;
                gw_cp4(&sn[s][rr][cc], ok ? p.narrow + row * p.r + col : p.narrow, ok);
            }
        }
    };

#pragma unroll
    for (int s = 0; s < GW_STAGES - 1; s++) {
        if (s < nb) load(s, s);
        lt_cp_async_commit();
    }
    const int g = tid / 64, t = tid % 64, jr = (t / 16) * 4, cw = (t % 16) * 4;
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
#pragma unroll 1
    for (int64_t b = 0; b < nb; b++) {
        lt_cp_async_wait<GW_STAGES - 2>(); /* stage b's copies (this thread's) are in */
        __syncthreads();                   /* everyone's are, and stage b − 1 is no longer read */
        if (b + GW_STAGES - 1 < nb) load(b + GW_STAGES - 1, (int)((b + GW_STAGES - 1) % GW_STAGES));
        lt_cp_async_commit();
        const int s = (int)(b % GW_STAGES);
#pragma unroll
        for (int k = 0; k < GW_BR / GW_GROUPS; k++) {
            const int rr = g + GW_GROUPS * k;
            const float4 w = *(const float4 *)&sw[s][rr][cw];
            const float4 n = *(const float4 *)&sn[s][rr][jr];
            const float nv[4] = {n.x, n.y, n.z, n.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[a][c] = __fmaf_rn(nv[a], wv[c], acc[a][c]);
        }
    }
    lt_cp_async_wait<0>();
    __syncthreads();

    /* The groups' partials, added in group order; consecutive threads write consecutive dw
     * elements (along the wide side when it is dw's columns, else along the narrow side). */
    float *red = &sw[0][0][0]; /* GW_GROUPS × GW_RN × GW_RLD floats */
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) red[(g * GW_RN + jr + a) * GW_RLD + cw + c] = acc[a][c];
    __syncthreads();
    float *const dwe = p.dw + (size_t)e * (size_t)p.per;
#pragma unroll
    for (int q = 0; q < GW_RN * GW_TW / GW_THREADS; q++) {
        const int o = tid + q * GW_THREADS;
        const int j = p.narrow_out ? o / GW_TW : o % GW_RN, c = p.narrow_out ? o % GW_TW : o / GW_RN;
        float v = red[j * GW_RLD + c];
#pragma unroll
        for (int gg = 1; gg < GW_GROUPS; gg++) v += red[(gg * GW_RN + j) * GW_RLD + c];
        const int64_t jg = j0 + j, cg = c0 + c;
        if (jg >= p.r || cg >= p.nw) continue;
        float *d = dwe + (p.narrow_out ? jg * p.in + cg : cg * p.in + jg);
        *d = p.beta == 0.0f ? v : __fmaf_rn(p.beta, *d, v);
    }
}

template <bool WV, bool NV> static void gw_run(const gw_params &p, dim3 grid, cudaStream_t s) {
    grouped_wgrad_k<WV, NV><<<grid, GW_THREADS, 0, s>>>(p);
}

extern "C" void lt_cuda_grouped_matmul_wgrad(lt_ctx *ctx, int64_t E, const int32_t *off, const float *dy, int64_t out,
                                             const float *x, int64_t in, int64_t nk, float beta, float *dw) {
    (void)nk; /* each expert's rows come from the offsets on the device */
    if (E <= 0 || out <= 0 || in <= 0) return;
    gw_params p;
    p.narrow_out = out <= in;
    p.narrow = p.narrow_out ? dy : x, p.wide = p.narrow_out ? x : dy;
    p.r = p.narrow_out ? out : in, p.nw = p.narrow_out ? in : out;
    p.in = in, p.per = out * in;
    p.off = off, p.dw = dw, p.beta = beta;
    LT_ASSERT(p.r <= LT_MOE_WGRAD_MAX_RANK && E <= LT_MOE_MAX_EXPERTS);
    const bool wv = p.nw % 4 == 0 && !((uintptr_t)p.wide & 15), nv = p.r % 4 == 0 && !((uintptr_t)p.narrow & 15);
    const int64_t wt = (p.nw + GW_TW - 1) / GW_TW;
    LT_ASSERT(wt <= 0x7fffffff);
    dim3 grid((unsigned)wt, (unsigned)E, (unsigned)((p.r + GW_RN - 1) / GW_RN));
    cudaStream_t s = lt_cuda_stream(ctx);
    if (wv && nv) gw_run<true, true>(p, grid, s);
    else if (wv) gw_run<true, false>(p, grid, s);
    else if (nv) gw_run<false, true>(p, grid, s);
    else gw_run<false, false>(p, grid, s);
    LT_CUDA_LAUNCHED(ctx, "grouped_matmul_wgrad");
}
