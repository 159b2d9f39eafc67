/* CUDA mixture-of-experts routing and dispatch: softmax + top-k routing (a warp per token) and
 * its backward, the load-balancing statistics (one block, a fixed order), the counting sort of
 * assignments by expert (count, scan, stable placement: three launches, no host wait), gather and
 * combine and their backwards (each token reads its k slots: no atomics on floats anywhere, so
 * every result is the same bits run to run). The experts' products are in grouped_matmul.cu. */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_state.cuh"

#define RT_WARPS 8        /* tokens (warps) per routing block */
#define ST_THREADS 1024   /* the statistics block */
#define SORT_THREADS 1024 /* the placement blocks: 4 assignments a thread per pass */
#define ROW_THREADS 256

/* p = softmax(l) over E <= 32·EPL as lane `lane` holds it: v[i] = p of expert lane + 32·i (0 past E). The
 * max and the sum are reduced by a fixed butterfly, so every kernel that calls this gets the same
 * bits for the same row. */
template <int EPL> static __device__ __forceinline__ void softmax_lane(const float *l, int E, int lane, float v[EPL]) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? l[e] : -INFINITY;
        m = fmaxf(m, v[i]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        v[i] = lane + 32 * i < E ? expf(v[i] - m) : 0.0f;
        s = __fadd_rn(s, v[i]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    const float inv = __frcp_rn(s);
#pragma unroll
    for (int i = 0; i < EPL; i++) v[i] = __fmul_rn(v[i], inv);
}

/* One warp per token: the probabilities in shared memory, then k rounds of a warp argmax (ties to
 * the lower expert: strict comparisons in increasing expert order within a lane, the lower index
 * on equal values across lanes); a chosen expert's p is set to −1 (every p is >= 0). */
template <int EPL>
static __global__ void __launch_bounds__(RT_WARPS * 32)
    route_k(const float *logits, int64_t n, int E, int k, int norm, int32_t *idx, float *w) {
    __shared__ float sp[RT_WARPS][LT_MOE_MAX_EXPERTS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *p = sp[warp];
    for (int64_t t = blockIdx.x * (int64_t)RT_WARPS + warp; t < n; t += (int64_t)gridDim.x * RT_WARPS) {
        float v[EPL];
        softmax_lane<EPL>(logits + t * E, E, lane, v);
#pragma unroll
        for (int i = 0; i < EPL; i++)
            if (lane + 32 * i < E) p[lane + 32 * i] = v[i];
        __syncwarp();
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) {
            float bv = -1.0f;
            int be = 0x7fffffff;
            for (int e = lane; e < E; e += 32)
                if (p[e] > bv) bv = p[e], be = e;
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oe = __shfl_xor_sync(0xffffffffu, be, o);
                if (ov > bv || (ov == bv && oe < be)) bv = ov, be = oe;
            }
            if (be >= E) be = j, bv = 0.0f; /* only NaN logits get here: keep the index in range */
            if (lane == 0) idx[t * k + j] = be, w[t * k + j] = bv;
            wsum = __fadd_rn(wsum, bv);
            __syncwarp();
            if (lane == (be & 31)) p[be] = -1.0f;
            __syncwarp();
        }
        if (norm)
            for (int j = lane; j < k; j += 32) w[t * k + j] = __fdiv_rn(w[t * k + j], wsum);
        __syncwarp();
    }
}

/* The statistics in one block: warp w sums tokens w, w + 32, ... (ST_TOK at a time, so their loads
 * overlap) in float64 per expert, the 32 warps' sums are added in warp order, counts are integer
 * shared-memory atomics (exact in any order). One block keeps the order fixed without a scratch
 * buffer; it reads the logits once. */
#define ST_TOK 4
template <int EPL>
static __global__ void __launch_bounds__(ST_THREADS)
    route_stats_k(const float *logits, const int32_t *idx, int64_t n, int E, int k, float *stats) {
    __shared__ double acc[LT_MOE_MAX_EXPERTS];
    __shared__ int cnt[LT_MOE_MAX_EXPERTS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, NW = ST_THREADS / 32;
    for (int e = threadIdx.x; e < E; e += ST_THREADS) acc[e] = 0.0, cnt[e] = 0;
    __syncthreads();
    double part[EPL];
#pragma unroll
    for (int i = 0; i < EPL; i++) part[i] = 0.0;
    for (int64_t t0 = warp; t0 < n; t0 += (int64_t)NW * ST_TOK) {
        float v[ST_TOK][EPL];
#pragma unroll
        for (int q = 0; q < ST_TOK; q++)
            if (t0 + q * NW < n) softmax_lane<EPL>(logits + (t0 + q * NW) * E, E, lane, v[q]);
#pragma unroll
        for (int q = 0; q < ST_TOK; q++)
            if (t0 + q * NW < n)
#pragma unroll
                for (int i = 0; i < EPL; i++) part[i] += (double)v[q][i];
    }
    for (int64_t a = threadIdx.x; a < n * k; a += ST_THREADS) atomicAdd(&cnt[idx[a]], 1);
    for (int q = 0; q < NW; q++) {
        if (warp == q)
#pragma unroll
            for (int i = 0; i < EPL; i++)
                if (lane + 32 * i < E) acc[lane + 32 * i] += part[i];
        __syncthreads();
    }
    for (int e = threadIdx.x; e < E; e += ST_THREADS) {
        stats[e] += (float)cnt[e];
        stats[E + e] += (float)acc[e];
    }
}

/* The instantiation of a routing kernel for E experts (ceil(E / 32) a lane, rounded up to 2^i). */
template <typename K> static K by_epl(int64_t E, K k1, K k2, K k4, K k8, K k16) {
    return E <= 32 ? k1 : E <= 64 ? k2 : E <= 128 ? k4 : E <= 256 ? k8 : k16;
}

extern "C" void lt_cuda_moe_route(lt_ctx *ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk,
                                  int32_t *idx, float *w, float *stats) {
    if (n <= 0) return;
    int64_t blocks = (n + RT_WARPS - 1) / RT_WARPS;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    const cudaStream_t s = lt_cuda_stream(ctx);
    by_epl(E, route_k<1>, route_k<2>, route_k<4>, route_k<8>,
           route_k<16>)<<<(unsigned)blocks, RT_WARPS * 32, 0, s>>>(logits, n, (int)E, (int)k, norm_topk, idx, w);
    LT_CUDA_LAUNCHED(ctx, "moe_route");
    if (!stats) return;
    by_epl(E, route_stats_k<1>, route_stats_k<2>, route_stats_k<4>, route_stats_k<8>,
           route_stats_k<16>)<<<1, ST_THREADS, 0, s>>>(logits, idx, n, (int)E, (int)k, stats);
    LT_CUDA_LAUNCHED(ctx, "moe_route: statistics");
}

/* One warp per token: g = dp + ∂/∂p of Σ dw·w, dlogits = p ⊙ (g − p·g); dp[e] = scale[0]·stats[e]
 * read from device memory (stats NULL: none), so a captured graph reads each step's values. */
template <int EPL>
static __global__ void __launch_bounds__(RT_WARPS * 32)
    route_bwd_k(const float *logits, const int32_t *idx, const float *dw, int64_t n, int E, int k, int norm,
                const float *stats, const float *scale, float *dlogits) {
    __shared__ float sp[RT_WARPS][LT_MOE_MAX_EXPERTS], sg[RT_WARPS][LT_MOE_MAX_EXPERTS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *p = sp[warp], *g = sg[warp];
    const float sc = stats ? __ldg(scale) : 0.0f;
    for (int64_t t = blockIdx.x * (int64_t)RT_WARPS + warp; t < n; t += (int64_t)gridDim.x * RT_WARPS) {
        float v[EPL];
        softmax_lane<EPL>(logits + t * E, E, lane, v);
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            const int e = lane + 32 * i;
            if (e < E) p[e] = v[i], g[e] = stats ? __fmul_rn(sc, __ldg(stats + e)) : 0.0f;
        }
        __syncwarp();
        const int32_t *id = idx + t * k;
        const float *d = dw + t * k;
        if (norm) {
            float Z = 0.0f;
            for (int j = 0; j < k; j++) Z = __fadd_rn(Z, p[id[j]]);
            double c = 0.0;
            for (int j = 0; j < k; j++) c += (double)d[j] * (double)__fdiv_rn(p[id[j]], Z);
            for (int j = lane; j < k; j += 32) g[id[j]] += (float)(((double)d[j] - c) / (double)Z);
        } else {
            for (int j = lane; j < k; j += 32) g[id[j]] += d[j];
        }
        __syncwarp();
        double dot = 0.0;
        for (int e = lane; e < E; e += 32) dot += (double)p[e] * (double)g[e];
#pragma unroll
        for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float fd = (float)dot;
        for (int e = lane; e < E; e += 32) dlogits[t * E + e] = p[e] * (g[e] - fd);
        __syncwarp();
    }
}

extern "C" void lt_cuda_moe_route_bwd(lt_ctx *ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n,
                                      int64_t E, int64_t k, int norm_topk, const float *stats, const float *scale,
                                      float *dlogits) {
    if (n <= 0) return;
    int64_t blocks = (n + RT_WARPS - 1) / RT_WARPS;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    by_epl(E, route_bwd_k<1>, route_bwd_k<2>, route_bwd_k<4>, route_bwd_k<8>,
           route_bwd_k<16>)<<<(unsigned)blocks, RT_WARPS * 32, 0, lt_cuda_stream(ctx)>>>(logits, idx, dw, n, (int)E,
                                                                                         (int)k, norm_topk, stats,
                                                                                         scale, dlogits);
    LT_CUDA_LAUNCHED(ctx, "moe_route_bwd");
}

/* ---- the counting sort ---- */

/* Per-block histograms added into off[1 + e] (integer atomics: the counts are exact in any order). */
static __global__ void sort_count_k(const int32_t *idx, int64_t nk, int E, int32_t *off) {
    __shared__ int h[LT_MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    for (int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; a < nk; a += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(&h[idx[a]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (h[e]) atomicAdd(&off[1 + e], h[e]);
}

/* off[1..E] counts -> the inclusive scan in place (one block of LT_MOE_MAX_EXPERTS threads). */
static __global__ void __launch_bounds__(LT_MOE_MAX_EXPERTS) sort_scan_k(int E, int32_t *off) {
    __shared__ int s[LT_MOE_MAX_EXPERTS];
    const int e = threadIdx.x;
    s[e] = e < E ? off[1 + e] : 0;
    __syncthreads();
    for (int o = 1; o < LT_MOE_MAX_EXPERTS; o <<= 1) {
        const int add = e >= o ? s[e - o] : 0;
        __syncthreads();
        s[e] += add;
        __syncthreads();
    }
    if (e < E) off[1 + e] = s[e];
    if (e == 0) off[0] = 0;
}

/* Block e places expert e's assignments in increasing order: passes of 4·SORT_THREADS
 * assignments, each thread's four in a row, ranked by a block-wide exclusive scan. */
static __global__ void __launch_bounds__(SORT_THREADS)
    sort_place_k(const int32_t *idx, int64_t nk, const int32_t *off, int32_t *rows, int32_t *slot) {
    __shared__ int wsum[SORT_THREADS / 32];
    __shared__ int total;
    const int e = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int base = off[e];
    for (int64_t a0 = 0; a0 < nk; a0 += 4 * SORT_THREADS) {
        const int64_t a = a0 + 4 * (int64_t)threadIdx.x;
        int hit[4], c = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            hit[q] = a + q < nk && idx[a + q] == e;
            c += hit[q];
        }
        int incl = c; /* warp inclusive scan */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) wsum[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            int ws = lane < SORT_THREADS / 32 ? wsum[lane] : 0, wi = ws;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, wi, o);
                if (lane >= o) wi += y;
            }
            if (lane < SORT_THREADS / 32) wsum[lane] = wi - ws; /* exclusive over warps */
            if (lane == 31) total = wi;
        }
        __syncthreads();
        int pos = base + wsum[warp] + incl - c;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (hit[q]) {
                rows[pos] = (int32_t)(a + q);
                slot[a + q] = pos;
                pos++;
            }
        base += total;
        __syncthreads();
    }
}

extern "C" void lt_cuda_moe_sort(lt_ctx *ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off,
                                 int32_t *rows, int32_t *slot) {
    const int64_t nk = n * k;
    cudaStream_t s = lt_cuda_stream(ctx);
    lt_cuda_check_abort(ctx, cudaMemsetAsync(off, 0, (size_t)(E + 1) * sizeof(int32_t), s), "moe_sort: clear counts");
    if (nk > 0) {
        int64_t blocks = (nk + 1023) / 1024;
        if (blocks > 1024) blocks = 1024;
        sort_count_k<<<(unsigned)blocks, 256, 0, s>>>(idx, nk, (int)E, off);
        LT_CUDA_LAUNCHED(ctx, "moe_sort: count");
    }
    sort_scan_k<<<1, LT_MOE_MAX_EXPERTS, 0, s>>>((int)E, off);
    LT_CUDA_LAUNCHED(ctx, "moe_sort: scan");
    if (nk > 0) {
        sort_place_k<<<(unsigned)E, SORT_THREADS, 0, s>>>(idx, nk, off, rows, slot);
        LT_CUDA_LAUNCHED(ctx, "moe_sort: place");
    }
}

/* ---- gather, combine and their backwards ---- */

static __global__ void gather_k(const float *x, const int32_t *rows, int64_t nk, int k, int64_t C, float *xg) {
    for (int64_t i = blockIdx.x; i < nk; i += gridDim.x) {
        const float *src = x + (int64_t)(rows[i] / k) * C;
        float *dst = xg + i * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
    }
}

static __global__ void gather4_k(const float4 *x, const int32_t *rows, int64_t nk, int k, int64_t C4, float4 *xg) {
    for (int64_t i = blockIdx.x; i < nk; i += gridDim.x) {
        const float4 *src = x + (int64_t)(rows[i] / k) * C4;
        float4 *dst = xg + i * C4;
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) dst[c] = src[c];
    }
}

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows < 65535 * 4 ? (rows > 0 ? rows : 1) : 65535 * 4); }

extern "C" void lt_cuda_moe_gather(lt_ctx *ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C,
                                   float *xg) {
    if (nk <= 0 || C <= 0) return;
    if (C % 4 == 0 && !(((uintptr_t)x | (uintptr_t)xg) & 15))
        gather4_k<<<row_blocks(nk), ROW_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)x, rows, nk, (int)k, C / 4,
                                                                           (float4 *)xg);
    else gather_k<<<row_blocks(nk), ROW_THREADS, 0, lt_cuda_stream(ctx)>>>(x, rows, nk, (int)k, C, xg);
    LT_CUDA_LAUNCHED(ctx, "moe_gather");
}

/* out[t] = beta·out[t] + Σ_j (w ? w[t, j] : 1)·src[slot[t·k + j]], j in order; beta 0 overwrites. */
static __global__ void combine_k(const float *src, const float *w, const int32_t *slot, int64_t n, int k, int64_t C,
                                 float beta, float *out) {
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        const int32_t *sl = slot + t * k;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) {
                const float v = src[(int64_t)sl[j] * C + c];
                s = w ? __fmaf_rn(w[t * k + j], v, s) : __fadd_rn(s, v);
            }
            float *o = out + t * C + c;
            *o = beta == 0.0f ? s : __fmaf_rn(beta, *o, s);
        }
    }
}

extern "C" void lt_cuda_moe_gather_bwd(lt_ctx *ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k,
                                       int64_t C, float beta, float *dx) {
    if (n <= 0 || C <= 0) return;
    combine_k<<<row_blocks(n), ROW_THREADS, 0, lt_cuda_stream(ctx)>>>(dxg, NULL, slot, n, (int)k, C, beta, dx);
    LT_CUDA_LAUNCHED(ctx, "moe_gather_bwd");
}

extern "C" void lt_cuda_moe_combine(lt_ctx *ctx, const float *yg, const float *w, const int32_t *slot, int64_t n,
                                    int64_t k, int64_t C, float beta, float *y) {
    if (n <= 0 || C <= 0) return;
    combine_k<<<row_blocks(n), ROW_THREADS, 0, lt_cuda_stream(ctx)>>>(yg, w, slot, n, (int)k, C, beta, y);
    LT_CUDA_LAUNCHED(ctx, "moe_combine");
}

/* One warp per assignment: its grouped row of dyg and, when asked, its dw (a butterfly sum). */
static __global__ void combine_bwd_k(const float *dy, const float *yg, const float *w, const int32_t *slot, int64_t nk,
                                     int k, int64_t C, float *dyg, float *dw) {
    const int lane = threadIdx.x % 32;
    for (int64_t a = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; a < nk;
         a += (int64_t)gridDim.x * blockDim.x / 32) {
        const int64_t s = slot[a], t = a / k;
        const float wv = w[a], *d = dy + t * C, *g = yg + s * C;
        float *o = dyg + s * C;
        float acc = 0.0f;
        for (int64_t c = lane; c < C; c += 32) {
            o[c] = wv * d[c];
            if (dw) acc = __fmaf_rn(d[c], g[c], acc);
        }
        if (dw) {
#pragma unroll
            for (int q = 16; q; q >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, q);
            if (lane == 0) dw[a] = acc;
        }
    }
}

extern "C" void lt_cuda_moe_combine_bwd(lt_ctx *ctx, const float *dy, const float *yg, const float *w,
                                        const int32_t *slot, int64_t n, int64_t k, int64_t C, float *dyg, float *dw) {
    const int64_t nk = n * k;
    if (nk <= 0 || C <= 0) return;
    combine_bwd_k<<<lt_cuda_grid(nk * 32, ROW_THREADS), ROW_THREADS, 0, lt_cuda_stream(ctx)>>>(dy, yg, w, slot, nk,
                                                                                               (int)k, C, dyg, dw);
    LT_CUDA_LAUNCHED(ctx, "moe_combine_bwd");
}
