/* Elementwise CUDA ops: SwiGLU and GeGLU forward/backward, embedding gather (any table dtype), axpy, bias add,
 * counter-hash dropout (the CPU backend's hash, so masks are identical), zero, scale and the sum
 * of squares and global-norm clipping. All are grid-stride loops on the backend's stream; only sumsq
 * waits for the device (clip_norm keeps the norm on the device, or queues its copy to pinned memory).
 * The gated activations also come with bf16 outputs, which the MLP's products read directly. */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_state.cuh"

#define EW_THREADS 256

static __global__ void swiglu_fwd_k(const float *g, const float *u, int64_t n, float *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = g[i];
        a[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

/* The same four elements a thread with 16-byte loads and stores (n % 4 == 0, aligned pointers):
 * the scalar loop ran at ~70% of the H200's bandwidth on the 8B MLP. */
static __device__ __forceinline__ float silu_mul(float x, float u) { return x / (1.0f + expf(-x)) * u; }

static __global__ void swiglu_fwd4_k(const float4 *g, const float4 *u, int64_t n4, float4 *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = g[i], v = u[i];
        a[i] = make_float4(silu_mul(x.x, v.x), silu_mul(x.y, v.y), silu_mul(x.z, v.z), silu_mul(x.w, v.w));
    }
}

static int aligned16_3(const void *a, const void *b, const void *c) {
    return !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15);
}

void lt_cuda_swiglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a) {
    if (n <= 0) return;
    if (n % 4 == 0 && aligned16_3(g, u, a)) {
        swiglu_fwd4_k<<<lt_cuda_grid(n / 4, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)g,
                                                                                               (const float4 *)u, n / 4,
                                                                                               (float4 *)a);
        LT_CUDA_LAUNCHED(ctx, "swiglu_fwd");
        return;
    }
    swiglu_fwd_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(g, u, n, a);
    LT_CUDA_LAUNCHED(ctx, "swiglu_fwd");
}

/* silu'(g) = σ(g)·(1 + g·(1 − σ(g))), as the CPU op; one element, shared by both kernels. */
static __device__ __forceinline__ void swiglu_bwd1(float d, float x, float u, float *dg, float *du) {
    const float s = 1.0f / (1.0f + expf(-x));
    *dg = d * u * s * (1.0f + x * (1.0f - s));
    *du = d * x * s;
}

static __global__ void swiglu_bwd_k(const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        swiglu_bwd1(da[i], g[i], u[i], &dg[i], &du[i]);
}

/* Four elements a thread, 16-byte loads and stores: the scalar loop moved the 8B MLP's five
 * arrays (2 GB a layer at 8k) at ~77% of the H200's bandwidth. */
static __global__ void swiglu_bwd4_k(const float4 *da, const float4 *g, const float4 *u, int64_t n4, float4 *dg,
                                     float4 *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 d = da[i], x = g[i], v = u[i];
        float4 a, b;
        swiglu_bwd1(d.x, x.x, v.x, &a.x, &b.x);
        swiglu_bwd1(d.y, x.y, v.y, &a.y, &b.y);
        swiglu_bwd1(d.z, x.z, v.z, &a.z, &b.z);
        swiglu_bwd1(d.w, x.w, v.w, &a.w, &b.w);
        dg[i] = a, du[i] = b;
    }
}

void lt_cuda_swiglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    if (n <= 0) return;
    if (n % 4 == 0 && aligned16_3(da, g, u) && aligned16_3(dg, du, du)) {
        swiglu_bwd4_k<<<lt_cuda_grid(n / 4, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)da,
                                                                                               (const float4 *)g,
                                                                                               (const float4 *)u, n / 4,
                                                                                               (float4 *)dg,
                                                                                               (float4 *)du);
        LT_CUDA_LAUNCHED(ctx, "swiglu_bwd");
        return;
    }
    swiglu_bwd_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(da, g, u, n, dg, du);
    LT_CUDA_LAUNCHED(ctx, "swiglu_bwd");
}

/* GeGLU with GELU's tanh approximation, as the CPU op: gelu(g) = g/2·(1 + tanh(k·(g + 0.044715·g³))). */
#define GELU_K 0.7978845608028654f
#define GELU_A 0.044715f

static __device__ __forceinline__ float gelu_mul(float x, float u) {
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x))) * u;
}

static __device__ __forceinline__ void geglu_bwd1(float d, float x, float u, float *dg, float *du) {
    const float t = tanhf(GELU_K * (x + GELU_A * x * x * x));
    const float dgelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    *dg = d * u * dgelu;
    *du = d * 0.5f * x * (1.0f + t);
}

static __global__ void geglu_fwd_k(const float *g, const float *u, int64_t n, float *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] = gelu_mul(g[i], u[i]);
}

void lt_cuda_geglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a) {
    if (n <= 0) return;
    geglu_fwd_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(g, u, n, a);
    LT_CUDA_LAUNCHED(ctx, "geglu_fwd");
}

/* gelu'(g) = (1 + t)/2 + g/2·(1 − t²)·k·(1 + 3·0.044715·g²), as the CPU op. */
static __global__ void geglu_bwd_k(const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        geglu_bwd1(da[i], g[i], u[i], &dg[i], &du[i]);
}

void lt_cuda_geglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    if (n <= 0) return;
    geglu_bwd_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(da, g, u, n, dg, du);
    LT_CUDA_LAUNCHED(ctx, "geglu_bwd");
}

/* ---- the gated activations with bf16 outputs (glu_fwd_bf16 / glu_bwd_bf16) ----
 * The same per-element math as the f32 kernels above, rounded to bf16 (nearest even) on the
 * store, from f32 or bf16 g and u (and the backward's da): four elements a thread with vector
 * loads and 8-byte stores when n % 4 == 0 and the pointers allow, one otherwise. */
template <bool GELU> static __device__ __forceinline__ float glu1(float x, float u) {
    return GELU ? gelu_mul(x, u) : silu_mul(x, u);
}

template <bool GELU> static __device__ __forceinline__ void glu_bwd1(float d, float x, float u, float *dg, float *du) {
    if (GELU) geglu_bwd1(d, x, u, dg, du);
    else swiglu_bwd1(d, x, u, dg, du);
}

static __device__ __forceinline__ uint2 bf16x4(float a, float b, float c, float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    return make_uint2(*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi));
}

/* g and u elements: f32, or bf16 widened (one, or four from 8 bytes). */
static __device__ __forceinline__ float ld1(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld1(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ float4 ld4(const float *p, int64_t i) { return ((const float4 *)p)[i]; }
static __device__ __forceinline__ float4 ld4(const __nv_bfloat16 *p, int64_t i) {
    const uint2 v = ((const uint2 *)p)[i];
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.x)),
                 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <bool GELU, typename TI>
static __global__ void glu_fwd_h_k(const TI *g, const TI *u, int64_t n, __nv_bfloat16 *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] = __float2bfloat16_rn(glu1<GELU>(ld1(g, i), ld1(u, i)));
}

template <bool GELU, typename TI> static __global__ void glu_fwd_h4_k(const TI *g, const TI *u, int64_t n4, uint2 *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = ld4(g, i), v = ld4(u, i);
        a[i] = bf16x4(glu1<GELU>(x.x, v.x), glu1<GELU>(x.y, v.y), glu1<GELU>(x.z, v.z), glu1<GELU>(x.w, v.w));
    }
}

template <bool GELU, typename TI>
static __global__ void glu_bwd_h_k(const TI *da, const TI *g, const TI *u, int64_t n, __nv_bfloat16 *dg,
                                   __nv_bfloat16 *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, b;
        glu_bwd1<GELU>(ld1(da, i), ld1(g, i), ld1(u, i), &a, &b);
        dg[i] = __float2bfloat16_rn(a), du[i] = __float2bfloat16_rn(b);
    }
}

template <bool GELU, typename TI>
static __global__ void glu_bwd_h4_k(const TI *da, const TI *g, const TI *u, int64_t n4, uint2 *dg, uint2 *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 d = ld4(da, i), x = ld4(g, i), v = ld4(u, i);
        float4 a, b;
        glu_bwd1<GELU>(d.x, x.x, v.x, &a.x, &b.x);
        glu_bwd1<GELU>(d.y, x.y, v.y, &a.y, &b.y);
        glu_bwd1<GELU>(d.z, x.z, v.z, &a.z, &b.z);
        glu_bwd1<GELU>(d.w, x.w, v.w, &a.w, &b.w);
        dg[i] = bf16x4(a.x, a.y, a.z, a.w), du[i] = bf16x4(b.x, b.y, b.z, b.w);
    }
}

static int aligned8(const void *p) { return !((uintptr_t)p & 7); }

template <typename TI> static void glu_fwd_h(lt_ctx *ctx, int gelu, const TI *g, const TI *u, int64_t n, uint16_t *a) {
    cudaStream_t st = lt_cuda_stream(ctx);
    if (n % 4 == 0 && aligned16_3(g, u, g) && aligned8(a)) {
        const unsigned grid = lt_cuda_grid(n / 4, EW_THREADS);
        if (gelu) glu_fwd_h4_k<true, TI><<<grid, EW_THREADS, 0, st>>>(g, u, n / 4, (uint2 *)a);
        else glu_fwd_h4_k<false, TI><<<grid, EW_THREADS, 0, st>>>(g, u, n / 4, (uint2 *)a);
    } else {
        const unsigned grid = lt_cuda_grid(n, EW_THREADS);
        if (gelu) glu_fwd_h_k<true, TI><<<grid, EW_THREADS, 0, st>>>(g, u, n, (__nv_bfloat16 *)a);
        else glu_fwd_h_k<false, TI><<<grid, EW_THREADS, 0, st>>>(g, u, n, (__nv_bfloat16 *)a);
    }
    LT_CUDA_LAUNCHED(ctx, "glu_fwd_bf16");
}

void lt_cuda_glu_fwd_bf16(lt_ctx *ctx, int gelu, const void *g, const void *u, int gu_bf16, int64_t n, uint16_t *a) {
    if (n <= 0) return;
    if (gu_bf16) glu_fwd_h(ctx, gelu, (const __nv_bfloat16 *)g, (const __nv_bfloat16 *)u, n, a);
    else glu_fwd_h(ctx, gelu, (const float *)g, (const float *)u, n, a);
}

template <typename TI>
static void glu_bwd_h(lt_ctx *ctx, int gelu, const TI *da, const TI *g, const TI *u, int64_t n, uint16_t *dg,
                      uint16_t *du) {
    cudaStream_t st = lt_cuda_stream(ctx);
    if (n % 4 == 0 && aligned16_3(da, g, u) && aligned8(dg) && aligned8(du)) {
        const unsigned grid = lt_cuda_grid(n / 4, EW_THREADS);
        if (gelu) glu_bwd_h4_k<true, TI><<<grid, EW_THREADS, 0, st>>>(da, g, u, n / 4, (uint2 *)dg, (uint2 *)du);
        else glu_bwd_h4_k<false, TI><<<grid, EW_THREADS, 0, st>>>(da, g, u, n / 4, (uint2 *)dg, (uint2 *)du);
    } else {
        const unsigned grid = lt_cuda_grid(n, EW_THREADS);
        __nv_bfloat16 *a = (__nv_bfloat16 *)dg, *b = (__nv_bfloat16 *)du;
        if (gelu) glu_bwd_h_k<true, TI><<<grid, EW_THREADS, 0, st>>>(da, g, u, n, a, b);
        else glu_bwd_h_k<false, TI><<<grid, EW_THREADS, 0, st>>>(da, g, u, n, a, b);
    }
    LT_CUDA_LAUNCHED(ctx, "glu_bwd_bf16");
}

void lt_cuda_glu_bwd_bf16(lt_ctx *ctx, int gelu, const void *da, const void *g, const void *u, int gu_bf16, int64_t n,
                          uint16_t *dg, uint16_t *du) {
    if (n <= 0) return;
    typedef const __nv_bfloat16 *H;
    if (gu_bf16) glu_bwd_h(ctx, gelu, (H)da, (H)g, (H)u, n, dg, du);
    else glu_bwd_h(ctx, gelu, (const float *)da, (const float *)g, (const float *)u, n, dg, du);
}

/* One block row per token (grid-stride in y), threads across C. */
static __global__ void embedding_k(lt_dtype t, const uint8_t *table, size_t row_bytes, const int32_t *ids, int64_t N,
                                   int64_t C, float *out) {
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
        const uint8_t *row = table + (size_t)ids[n] * row_bytes;
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x)
            out[n * C + c] = lt_dq_elem(t, row, c);
    }
}

void lt_cuda_embedding(lt_ctx *ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out) {
    int64_t C = table->shape[1];
    if (N <= 0 || C <= 0) return;
    dim3 grid((unsigned)((C + EW_THREADS - 1) / EW_THREADS), (unsigned)(N < 65535 ? N : 65535));
    embedding_k<<<grid, EW_THREADS, 0, lt_cuda_stream(ctx)>>>(table->dtype, (const uint8_t *)table->data,
                                                              (size_t)lt_dtype_row_bytes(table->dtype, C), ids, N, C,
                                                              out);
    LT_CUDA_LAUNCHED(ctx, "embedding");
}

static __global__ void axpy_k(float *y, const float *x, float alpha, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

/* The same four elements a thread (16-byte loads and stores): the residual stream's gradient
 * adds, 8192 x 4096 f32 at 8k, ran at ~60% of the bandwidth one float a thread. */
static __global__ void axpy4_k(float4 *y, const float4 *x, float alpha, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = y[i];
        const float4 b = x[i];
        a.x += alpha * b.x, a.y += alpha * b.y, a.z += alpha * b.z, a.w += alpha * b.w;
        y[i] = a;
    }
}

void lt_cuda_add(lt_ctx *ctx, float *y, const float *x, float alpha, int64_t n) {
    if (n <= 0) return;
    if (n % 4 == 0 && aligned16_3(y, x, x)) {
        axpy4_k<<<lt_cuda_grid(n / 4, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>((float4 *)y, (const float4 *)x,
                                                                                         alpha, n / 4);
        LT_CUDA_LAUNCHED(ctx, "add");
        return;
    }
    axpy_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(y, x, alpha, n);
    LT_CUDA_LAUNCHED(ctx, "add");
}

static __global__ void bias_k(float *y, const float *b, int64_t N, int64_t C) {
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y)
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x)
            y[n * C + c] += b[c];
}

void lt_cuda_add_bias(lt_ctx *ctx, float *y, const float *b, int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return;
    dim3 grid((unsigned)((C + EW_THREADS - 1) / EW_THREADS), (unsigned)(N < 65535 ? N : 65535));
    bias_k<<<grid, EW_THREADS, 0, lt_cuda_stream(ctx)>>>(y, b, N, C);
    LT_CUDA_LAUNCHED(ctx, "add_bias");
}

/* The CPU backend's splitmix64 finaliser of (seed, index) (src/backend/cpu/ops_elementwise.c):
 * the two must stay the same function or CPU and CUDA draw different masks. */
static __device__ __forceinline__ uint32_t dropout_hash(uint64_t seed, uint64_t i) {
    uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static __global__ void dropout_k(const float *x, float *y, int64_t n, uint32_t threshold, float keep_scale,
                                 uint64_t seed, uint64_t offset) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = dropout_hash(seed, offset + (uint64_t)i) >= threshold ? __fmul_rn(x[i], keep_scale) : 0.0f;
}

void lt_cuda_dropout(lt_ctx *ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset) {
    if (n <= 0) return;
    if (p <= 0.0f) {
        if (y != x)
            lt_cuda_check_abort(ctx,
                                cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                                lt_cuda_stream(ctx)),
                                "dropout copy");
        return;
    }
    /* threshold and scale computed on the host exactly as the CPU op does */
    uint32_t threshold = (uint32_t)fmin((double)p * 4294967296.0, 4294967295.0);
    float keep_scale = 1.0f / (1.0f - p);
    dropout_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(x, y, n, threshold, keep_scale, seed,
                                                                                   offset);
    LT_CUDA_LAUNCHED(ctx, "dropout");
}

void lt_cuda_zero(lt_ctx *ctx, void *p, size_t bytes) {
    if (!bytes) return;
    lt_cuda_check_abort(ctx, cudaMemsetAsync(p, 0, bytes, lt_cuda_stream(ctx)), "zero");
}

static __global__ void scale_k(float *x, float a, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

void lt_cuda_scale(lt_ctx *ctx, float *x, float a, int64_t n) {
    if (n <= 0) return;
    scale_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(x, a, n);
    LT_CUDA_LAUNCHED(ctx, "scale");
}

/* Sum of squares in two deterministic passes: SUMSQ_BLOCKS fixed blocks each reduce a strided
 * share in float64 into a partial, then one block adds the partials in a fixed order. The
 * partials and the total (part[SUMSQ_BLOCKS]) live in the context's state (cuda_state.cuh), so
 * the op needs no workspace argument and contexts never share them. */
#define SUMSQ_BLOCKS LT_CUDA_SUMSQ_PARTS
#define SUMSQ_THREADS 256

static double *sumsq_parts(lt_ctx *ctx) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    LT_ASSERT(st != NULL); /* the partials live in a context's state */
    pthread_mutex_lock(&st->blas_mu);
    (void)lt_cuda_blas_handle(st);
    pthread_mutex_unlock(&st->blas_mu);
    return st->sumsq;
}

static __device__ double block_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = 0;
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v; /* valid in thread 0 */
}

static __global__ void sumsq_part_k(const float *x, int64_t n, double *part) {
    __shared__ double sh[32];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = x[i];
        s += v * v;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void sumsq_final_k(int parts, double *part) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[SUMSQ_BLOCKS] = s;
}

float lt_cuda_sumsq(lt_ctx *ctx, const float *x, int64_t n) {
    if (n <= 0) return 0.0f;
    unsigned blocks = lt_cuda_grid(n, SUMSQ_THREADS);
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    double *part = sumsq_parts(ctx);
    sumsq_part_k<<<blocks, SUMSQ_THREADS, 0, lt_cuda_stream(ctx)>>>(x, n, part);
    LT_CUDA_LAUNCHED(ctx, "sumsq");
    sumsq_final_k<<<1, SUMSQ_THREADS, 0, lt_cuda_stream(ctx)>>>((int)blocks, part);
    LT_CUDA_LAUNCHED(ctx, "sumsq");
    double s = 0;
    lt_cuda_check_abort(ctx,
                        cudaMemcpyAsync(&s, part + SUMSQ_BLOCKS, sizeof s, cudaMemcpyDeviceToHost, lt_cuda_stream(ctx)),
                        "sumsq result");
    lt_cuda_check_abort(ctx, cudaStreamSynchronize(lt_cuda_stream(ctx)), "sumsq wait");
    return (float)s;
}

/* The trainer's clipping rule on the device: every thread derives the same factor from the total
 * (rounded to float first, as sumsq hands it to the host), so no host wait decides it. */
static __global__ void clip_k(float *g, int64_t n, double max_norm, const double *total) {
    const double norm = sqrt((double)(float)*total);
    if (!(norm > max_norm)) return;
    const float a = (float)(max_norm / norm);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        g[i] *= a;
}

void lt_cuda_clip_norm(lt_ctx *ctx, float *g, int64_t n, double max_norm, double *sumsq_host) {
    if (n <= 0) {
        if (sumsq_host) *sumsq_host = 0;
        return;
    }
    unsigned blocks = lt_cuda_grid(n, SUMSQ_THREADS);
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    double *part = sumsq_parts(ctx);
    sumsq_part_k<<<blocks, SUMSQ_THREADS, 0, lt_cuda_stream(ctx)>>>(g, n, part);
    LT_CUDA_LAUNCHED(ctx, "clip_norm");
    sumsq_final_k<<<1, SUMSQ_THREADS, 0, lt_cuda_stream(ctx)>>>((int)blocks, part);
    LT_CUDA_LAUNCHED(ctx, "clip_norm");
    if (sumsq_host) /* pinned: the copy is queued (and captured), not waited for */
        lt_cuda_check_abort(ctx,
                            cudaMemcpyAsync(sumsq_host, part + SUMSQ_BLOCKS, sizeof *sumsq_host, cudaMemcpyDeviceToHost,
                                            lt_cuda_stream(ctx)),
                            "clip_norm sum of squares");
    if (isinf(max_norm)) return; /* measuring only */
    clip_k<<<lt_cuda_grid(n, EW_THREADS), EW_THREADS, 0, lt_cuda_stream(ctx)>>>(g, n, max_norm, part + SUMSQ_BLOCKS);
    LT_CUDA_LAUNCHED(ctx, "clip_norm");
}
