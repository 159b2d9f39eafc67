/* The experts' grouped products on CUDA: one launch for all experts of a call, a tiled bf16
 * tensor-core GEMM (mma.sync m16n8k16, fp32 accumulate) whose CTAs find their (expert, row tile)
 * from the offsets on the device, so nothing waits for the host and the call can be captured in a
 * graph. x (f32) is rounded to bf16 and W (f32, bf16, f16 or any block format cuda_dequant.cuh
 * decodes) converted to bf16 in the tile loads: no bf16 copy of the experts is ever made, and the
 * call needs no workspace. Not here: split-K, Hopper wgmma/TMA pipelines. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_ops.h"

/* Tiles: 128 grouped rows × 128 output columns × 64 of the reduction per step, 8 warps of 64 × 32
 * each (4 × 4 mma tiles, 64 accumulators a thread). A 64-wide step makes every W row of a tile two
 * whole 32-weight groups (NT) and every x row two 32-float runs: one group or run per thread. The
 * shared tiles are padded by 8 bf16 a row (144-byte rows), so each 8-row phase of an ldmatrix
 * reads 8 distinct 16-byte bank groups. Single-buffered: two CTAs an SM overlap one's loads with
 * the other's products. */
#define GM_BM 128
#define GM_BN 128
#define GM_BK 64
#define GM_LD (GM_BK + 8)
#define GM_THREADS 256

/* Weight formats by how a 32-weight group is decoded (each its own instantiation, so the plain
 * and 32-block kernels keep their register budget). */
enum { GM_PLAIN = 0, GM_B32 = 1, GM_EXT = 2 };

typedef struct gm_params {
    const uint8_t *w;
    size_t row_bytes;
    lt_dtype dt;
    const int32_t *off;
    const float *x;
    float *y;
    int E;
    int64_t out, in; /* one expert's W: (out, in) */
    int64_t K, N;    /* the product's reduction and output widths: NT (in, out), NN (out, in) */
    float beta;
} gm_params;

/* 32 weights of row `row` of the stack starting at column c0 (a multiple of 32), as f32; zeros
 * past the row's end (the row's length `in` is a multiple of the block for block formats). */
template <int FMT>
static __device__ __forceinline__ void gm_group(const gm_params &p, int64_t row, int64_t c0, float v[32]) {
    const uint8_t *r = p.w + (size_t)row * p.row_bytes;
    if (FMT == GM_PLAIN) {
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = c0 + j < p.in ? lt_dq_plain(p.dt, r, c0 + j) : 0.0f;
    } else if (c0 < p.in) {
        if (FMT == GM_B32) lt_dq_group32(p.dt, r, c0 / 32, v);
        else lt_dq_group32_ext(p.dt, r, c0 / 32, v);
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = 0.0f;
    }
}

static __device__ __forceinline__ void gm_store32(__nv_bfloat16 *dst, const float v[32]) {
    uint4 *d = (uint4 *)dst;
#pragma unroll
    for (int q = 0; q < 4; q++)
        d[q] = make_uint4(lt_pack_bf16(v[8 * q], v[8 * q + 1]), lt_pack_bf16(v[8 * q + 2], v[8 * q + 3]),
                          lt_pack_bf16(v[8 * q + 4], v[8 * q + 5]), lt_pack_bf16(v[8 * q + 6], v[8 * q + 7]));
}

template <int FMT, bool NN> static __global__ void __launch_bounds__(GM_THREADS, 2) grouped_mm_k(gm_params p) {
    __shared__ __align__(16) __nv_bfloat16 As[GM_BM * GM_LD];
    __shared__ __align__(16) __nv_bfloat16 Bs[GM_BN * GM_LD];
    __shared__ int cum[LT_MOE_MAX_EXPERTS];
    __shared__ int s_e, s_tile;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    /* Which (expert, row tile) this CTA is: expert e owns ceil(m_e / BM) consecutive tiles. */
    const int y_tile = (int)blockIdx.y;
    if (tid == 0) s_e = -1;
    if (warp == 0) {
        const int per = (p.E + 31) / 32, e0 = lane * per;
        int run = 0;
        for (int e = e0; e < e0 + per && e < p.E; e++) run += (p.off[e + 1] - p.off[e] + GM_BM - 1) / GM_BM;
        int incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        int c = incl - run;
        for (int e = e0; e < e0 + per && e < p.E; e++) {
            c += (p.off[e + 1] - p.off[e] + GM_BM - 1) / GM_BM;
            cum[e] = c;
        }
    }
    __syncthreads();
    for (int e = tid; e < p.E; e += GM_THREADS) {
        const int lo = e ? cum[e - 1] : 0;
        if (y_tile >= lo && y_tile < cum[e]) s_e = e, s_tile = y_tile - lo;
    }
    __syncthreads();
    const int e = s_e;
    if (e < 0) return; /* past the last tile of this call */
    const int64_t row0 = p.off[e] + (int64_t)s_tile * GM_BM;
    const int rows = (int)min((int64_t)GM_BM, (int64_t)p.off[e + 1] - row0);
    const int64_t n0 = (int64_t)blockIdx.x * GM_BN, wrow0 = (int64_t)e * p.out;

    const int wm = warp / 4, wn = warp % 4, g = lane / 4, t4 = lane % 4; /* g, t4: an accumulator's row, column pair */
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    const bool xvec = (p.K % 4) == 0 && !((uintptr_t)p.x & 15);
    for (int64_t k0 = 0; k0 < p.K; k0 += GM_BK) {
        /* A: row tid / 2, 32 floats from column k0 + (tid % 2)·32 */
        {
            const int r = tid / 2, h = tid % 2;
            const int64_t c0 = k0 + h * 32;
            float v[32];
            if (r < rows) {
                const float *src = p.x + (row0 + r) * p.K + c0;
                if (xvec && c0 + 32 <= p.K) {
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const float4 f = ((const float4 *)src)[q];
                        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 32; j++) v[j] = c0 + j < p.K ? src[j] : 0.0f;
                }
            } else {
#pragma unroll
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
            }
            gm_store32(As + r * GM_LD + h * 32, v);
        }
        /* B as [n][k]: NT reads W rows n (groups along k); NN reads W rows k (groups along n) and
         * transposes while storing. */
        if (!NN) {
            const int r = tid / 2, h = tid % 2;
            float v[32];
            if (n0 + r < p.N) gm_group<FMT>(p, wrow0 + n0 + r, k0 + h * 32, v);
            else
#pragma unroll
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
            gm_store32(Bs + r * GM_LD + h * 32, v);
        } else {
            const int kk = tid % 64, gi = tid / 64;
            float v[32];
            if (k0 + kk < p.K) gm_group<FMT>(p, wrow0 + k0 + kk, n0 + gi * 32, v);
            else
#pragma unroll
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++) Bs[(gi * 32 + j) * GM_LD + kk] = __float2bfloat16_rn(v[j]);
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < GM_BK / 16; ks++) {
            /* ldmatrix.x4: A's four 8x8 quarters of a 16x16 tile (lane l addresses row l % 16, column
             * half l / 16), B's (n 0-7 | 8-15) x (k 0-7 | 8-15) for two n8 tiles at once. */
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                lt_ldsm_x4(a[mi], As + (wm * 64 + mi * 16 + (lane & 15)) * GM_LD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t r[4];
                lt_ldsm_x4(r,
                           Bs + (wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * GM_LD + ks * 16 +
                               ((lane >> 3) & 1) * 8);
                b[2 * nj][0] = r[0], b[2 * nj][1] = r[1], b[2 * nj + 1][0] = r[2], b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) lt_mma16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
        __syncthreads();
    }

    /* Epilogue: c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at row g + 8; beta 0 does not read y. */
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = wm * 64 + mi * 16 + g + 8 * hr;
            if (r >= rows) continue;
            float *yr = p.y + (row0 + r) * p.N;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int hc = 0; hc < 2; hc++) {
                    const int64_t c = n0 + wn * 32 + ni * 8 + 2 * t4 + hc;
                    if (c >= p.N) continue;
                    const float v = acc[mi][ni][2 * hr + hc];
                    yr[c] = p.beta == 0.0f ? v : __fmaf_rn(p.beta, yr[c], v);
                }
        }
}

template <bool NN> static void gm_launch(lt_ctx *ctx, const gm_params &p, dim3 grid) {
    cudaStream_t s = lt_cuda_stream(ctx);
    if (!lt_dtype_is_quantized(p.dt)) grouped_mm_k<GM_PLAIN, NN><<<grid, GM_THREADS, 0, s>>>(p);
    else if (lt_dq_ext(p.dt)) grouped_mm_k<GM_EXT, NN><<<grid, GM_THREADS, 0, s>>>(p);
    else grouped_mm_k<GM_B32, NN><<<grid, GM_THREADS, 0, s>>>(p);
}

extern "C" void lt_cuda_grouped_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E,
                                       const int32_t *off, const float *x, int64_t nk, float beta, float *y, void *ws) {
    (void)ws;
    const int64_t out = w->shape[0] / E, in = w->shape[1];
    if (nk <= 0 || out <= 0 || in <= 0) return;
    const int nn = mode == LT_MATMUL_NN;
    gm_params p;
    p.w = (const uint8_t *)w->data;
    p.row_bytes = (size_t)lt_dtype_row_bytes(w->dtype, in);
    p.dt = w->dtype;
    p.off = off, p.x = x, p.y = y;
    p.E = (int)E, p.out = out, p.in = in;
    p.K = nn ? out : in, p.N = nn ? in : out;
    p.beta = beta;
    /* The worst case of Σ_e ceil(m_e / BM) row tiles is nk / BM + E; CTAs past the call's last
     * tile exit after reading the offsets. */
    const int64_t ytiles = (nk + GM_BM - 1) / GM_BM + E;
    LT_ASSERT(ytiles <= 65535);
    dim3 grid((unsigned)((p.N + GM_BN - 1) / GM_BN), (unsigned)ytiles);
    if (nn) gm_launch<true>(ctx, p, grid);
    else gm_launch<false>(ctx, p, grid);
    LT_CUDA_LAUNCHED(ctx, "grouped_matmul");
}

extern "C" size_t lt_cuda_grouped_matmul_workspace_bytes(lt_dtype wdtype, int64_t E, int64_t out, int64_t in,
                                                         int64_t nk_max, int threads) {
    (void)wdtype, (void)E, (void)out, (void)in, (void)nk_max, (void)threads;
    return 0;
}
