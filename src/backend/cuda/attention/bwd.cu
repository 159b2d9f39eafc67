/* Flash attention backward on NVIDIA GPUs. On compute capability 9.0 (H100/H200), D = 64 or 128:
 * warpgroup-MMA kernels (wgmma, sm_90a) — delta = rowsum(dO·O); the main kernel, where one CTA owns
 * 128 keys (64 for rows whose queries see few keys) of one kv head and walks every query head of
 * its group (or a share of them, when the row is short) and every 64-query tile that sees those
 * keys, with dK and dV in registers; and dQ either by fp32 vector atomics into a buffer converted
 * afterwards (long causal rows) or by its own kernel that recomputes S and dP per query tile,
 * forms delta on the way and writes dQ once (packed rows, small windows). Long causal rows without
 * packing or window (T a multiple of 64, one CTA per kv head) take the warp-specialised kernel
 * of attention_bwd_ws.cu instead of the main kernel here (TMA producer, mbarrier ring, bulk dQ
 * adds; 1.6x this file's kernel at 8k and 32k). Elsewhere (D = 96, other GPUs): the
 * FlashAttention-2 mma.sync kernel with fp32 dQ atomics. Every buffer is workspace sized by
 * lt_attention_cuda_workspace_bytes from the same plan. */
#include "backend/cuda/attention_bwd_ws.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/wgmma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOG2E_F 1.4426950408889634f

/* acc + Σ a[i]·b[i] over 8 bf16 elements read as one 16-byte load each (16-byte aligned). */
static __device__ __forceinline__ float attn_dot8(float acc, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    const uint4 u = *(const uint4 *)a, v = *(const uint4 *)b;
    const __nv_bfloat162 *u2 = (const __nv_bfloat162 *)&u, *v2 = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 x = __bfloat1622float2(u2[k]), y = __bfloat1622float2(v2[k]);
        acc += x.x * y.x + x.y * y.y;
    }
    return acc;
}

/* delta[b,h,t] = Σ_d dO·O: 16 lanes per (b, t, h) row, 16-byte loads (a memory-bound pass over
 * out and dout; dq_acc is zeroed by cudaMemsetAsync, not here). */
template <int D> static __global__ void attn_bwd_delta(lt_attn_dev p, int B) {
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 4;
    const int sub = threadIdx.x & 15;
    const int64_t n = (int64_t)B * p.T * p.H;
    const bool live = row < n;
    const int64_t rr = live ? row : 0;
    const int h = (int)(rr % p.H), t = (int)((rr / p.H) % p.T), b = (int)(rr / ((int64_t)p.H * p.T));
    const __nv_bfloat16 *o = p.o + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
    const __nv_bfloat16 *g = p.dout + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
    float acc = 0.0f;
#pragma unroll
    for (int d = sub * 8; d < D; d += 128) {
        if (!live) break;
        acc = attn_dot8(acc, o + d, g + d);
    }
#pragma unroll
    for (int s = 8; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (live && sub == 0) p.delta[((int64_t)b * p.H + h) * p.T + t] = acc;
}

template <int D> static __global__ void attn_bwd_convert_dq(lt_attn_dev p, int B) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    int64_t n = (int64_t)B * p.T * p.H * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int64_t r = i / D;
    int h = (int)(r % p.H), t = (int)((r / p.H) % p.T), b = (int)(r / ((int64_t)p.H * p.T));
    float2 v = *(const float2 *)(p.dq_acc + i);
    *(uint32_t *)(p.dq + b * p.dq_sb + (int64_t)t * p.dq_st + h * p.dq_sh + d) =
        lt_pack_bf16(v.x * p.scale, v.y * p.scale);
}

/* dK, dV from the fp32 sums of split CTAs (lt_attn_dev.dkv_acc, contiguous (B, T, Hkv, D) each). */
template <int D> static __global__ void attn_bwd_convert_dkv(lt_attn_dev p, int B) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    const int64_t n = (int64_t)B * p.T * p.Hkv * D;
    if (i >= n) return;
    const int d = (int)(i % D);
    const int64_t r = i / D;
    const int h = (int)(r % p.Hkv), t = (int)((r / p.Hkv) % p.T), b = (int)(r / ((int64_t)p.Hkv * p.T));
    const float2 k = *(const float2 *)(p.dkv_acc + i), v = *(const float2 *)(p.dkv_acc + n + i);
    const int64_t o = b * p.kv_sb + (int64_t)t * p.kv_st + h * p.kv_sh + d;
    *(uint32_t *)(p.dk + o) = lt_pack_bf16(k.x * p.scale, k.y * p.scale);
    *(uint32_t *)(p.dv + o) = lt_pack_bf16(v.x, v.y);
}

/* One past the last query that sees any key of [k0, klast]: lo is non-decreasing, so a binary
 * search for the first query whose lower key bound passes klast. */
static __device__ __forceinline__ int attn_bwd_q_end(const int32_t *lo, int k0, int klast, int T) {
    int a = k0, z = T;
    while (a < z) {
        const int m = (a + z) >> 1;
        if (lo[m] > klast) z = m; else a = m + 1;
    }
    return a;
}

template <int D, int NW>
static __device__ __forceinline__ void bwd_load_rows(__nv_bfloat16 *s, const __nv_bfloat16 *g,
                                                     int64_t st, int t0, int rows, int T, int tid) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int c = tid; c < rows * CH; c += NW * 32) {
        int r = c / CH, cc = c % CH, t = t0 + r;
        const __nv_bfloat16 *src = g + (int64_t)(t < T ? t : T - 1) * st + cc * 8;
        lt_cp_async16(s + r * LD + cc * 8, src, t < T ? 16 : 0);
    }
}

/* The main kernel, FlashAttention-2's tiling (version 3 of dev/cuda/NOTES.md; version 2, where each
 * warp owned 16 keys and held Pᵀ/dSᵀ in registers, ran 10-25% slower). A CTA owns 128 keys (8 warps)
 * and steps over 64 query rows at a time, for every query head of its kv head's group. Sᵀ and dPᵀ are tiled 4 x 2 over the warps (32 keys x 32 queries
 * each); Pᵀ and dSᵀ go to shared memory as bf16; dV and dK are tiled 4 x 2 (32 keys x D/2 each) and
 * dQ 2 x 4 (32 queries x D/4; D = 96: 4 x 2 of 16 x 48). Two 16-row tiles per warp let every
 * fragment read from shared memory feed two MMAs (shared-memory bandwidth bounds these kernels). */
template <int D>
static __global__ void __launch_bounds__(256) attn_bwd_kernel(lt_attn_dev p) {
    constexpr int NW = 8, BN = 128, BM = 64, LD = D + 8, LDS = BM + 8, KC = D / 16;
    constexpr int DH = D / 2;                        /* dV, dK: columns per warp */
    constexpr int DQ_MT = D == 96 ? 1 : 2;           /* dQ: 16-row tiles per warp */
    constexpr int DQ_QW = BM / (16 * DQ_MT);         /* warps along queries (4 or 2) */
    constexpr int DQ_DW = D / (NW / DQ_QW);          /* columns per warp (48, 32 or 16) */
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sV = sK + BN * LD;
    __nv_bfloat16 *sQ = sV + BN * LD;      /* 2 buffers */
    __nv_bfloat16 *sO = sQ + 2 * BM * LD;  /* dO, 2 buffers */
    __nv_bfloat16 *sP = sO + 2 * BM * LD;  /* Pᵀ, BN x LDS */
    __nv_bfloat16 *sS = sP + BN * LDS;     /* dSᵀ, BN x LDS */
    float *sL = (float *)(sS + BN * LDS);
    float *sD = sL + 2 * BM;
    int *sLo = (int *)(sD + 2 * BM);

    const int T = p.T, kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int k0 = kb * BN, klast = min(k0 + BN, T) - 1;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int q_end = attn_bwd_q_end(lo, k0, klast, T);
    const int qb_begin = k0 / BM, nqb = (q_end - 1) / BM - qb_begin + 1;
    const int steps = nqb * p.group;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    bwd_load_rows<D, NW>(sK, gk, p.kv_st, k0, BN, T, tid);
    bwd_load_rows<D, NW>(sV, gv, p.kv_st, k0, BN, T, tid);
    auto load_step = [&](int step, int buf) {
        const int h = hk * p.group + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        bwd_load_rows<D, NW>(sQ + buf * BM * LD, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, BM, T, tid);
        bwd_load_rows<D, NW>(sO + buf * BM * LD, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, BM, T, tid);
        if (tid < BM) {
            int t = q0 + tid;
            int64_t r = ((int64_t)b * p.H + h) * T + (t < T ? t : T - 1);
            sL[buf * BM + tid] = p.lse[r] * LOG2E_F;
            sD[buf * BM + tid] = p.delta[r];
            sLo[buf * BM + tid] = t < T ? lo[t] : INT32_MAX;
        }
    };
    load_step(0, 0);
    lt_cp_async_commit();

    const int kw = warp & 3, dh = warp >> 2;        /* Sᵀ/dPᵀ: qw = dh; dV/dK: D half = dh */
    float dk[2][DH / 8][4], dv[2][DH / 8][4];
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int j = 0; j < DH / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[t][j][e] = dv[t][j][e] = 0.0f;
    const float scale = p.scale, cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;

    for (int step = 0; step < steps; step++) {
        const int buf = step & 1;
        const int h = hk * p.group + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        lt_cp_async_wait<0>();
        __syncthreads();
        if (step + 1 < steps) {
            load_step(step + 1, buf ^ 1);
            lt_cp_async_commit();
        }
        const __nv_bfloat16 *cQ = sQ + buf * BM * LD, *cO = sO + buf * BM * LD;
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;
        const int *cLo = sLo + buf * BM;

        /* Tiles whose keys no query of the tile can see (packed rows, window, the causal
         * diagonal) are skipped warp by warp: lo is non-decreasing, so the first row bounds all. */
        const int kA = k0 + 32 * kw;
        const bool skip1 = kA > q0 + 32 * dh + 31 || kA + 31 < cLo[32 * dh];
        if (skip1) {
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int r = 32 * kw + 16 * t + (lane >> 2), c = 32 * dh + j * 8 + (lane & 3) * 2;
                    *(uint32_t *)(sP + r * LDS + c) = 0u;
                    *(uint32_t *)(sP + (r + 8) * LDS + c) = 0u;
                    *(uint32_t *)(sS + r * LDS + c) = 0u;
                    *(uint32_t *)(sS + (r + 8) * LDS + c) = 0u;
                }
        } else {
            float st[2][4][4], dp[2][4][4];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) st[t][j][e] = dp[t][j][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < KC; kc++) {
                uint32_t ak[2][4], av[2][4];
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int off = (32 * kw + 16 * t + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8;
                    lt_ldsm_x4(ak[t], sK + off);
                    lt_ldsm_x4(av[t], sV + off);
                }
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int off = (32 * dh + 16 * np + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                                    ((lane >> 3) & 1) * 8;
                    uint32_t rq[4], ro[4];
                    lt_ldsm_x4(rq, cQ + off);
                    lt_ldsm_x4(ro, cO + off);
#pragma unroll
                    for (int t = 0; t < 2; t++) {
                        lt_mma16816(st[t][2 * np], ak[t], rq[0], rq[1]);
                        lt_mma16816(st[t][2 * np + 1], ak[t], rq[2], rq[3]);
                        lt_mma16816(dp[t][2 * np], av[t], ro[0], ro[1]);
                        lt_mma16816(dp[t][2 * np + 1], av[t], ro[2], ro[3]);
                    }
                }
            }
            const bool full = (klast <= q0) && (q0 + BM - 1 < T) && (k0 >= cLo[BM - 1]);
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float pv[4], sv[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qc = 32 * dh + j * 8 + (lane & 3) * 2 + (e & 1);
                        const int key = k0 + 32 * kw + 16 * t + (lane >> 2) + (e >> 1) * 8, q = q0 + qc;
                        float x = st[t][j][e] * scale, dfac = 1.0f;
                        if (cap > 0.0f) {
                            float th = tanhf(x * inv_cap);
                            x = cap * th;
                            dfac = 1.0f - th * th;
                        }
                        float pr = exp2f(x * LOG2E_F - cL[qc]);
                        if (!full && (key > q || key < cLo[qc])) pr = 0.0f;
                        pv[e] = pr;
                        sv[e] = pr * (dp[t][j][e] - cD[qc]) * dfac;
                    }
                    const int r = 32 * kw + 16 * t + (lane >> 2), c = 32 * dh + j * 8 + (lane & 3) * 2;
                    *(uint32_t *)(sP + r * LDS + c) = lt_pack_bf16(pv[0], pv[1]);
                    *(uint32_t *)(sP + (r + 8) * LDS + c) = lt_pack_bf16(pv[2], pv[3]);
                    *(uint32_t *)(sS + r * LDS + c) = lt_pack_bf16(sv[0], sv[1]);
                    *(uint32_t *)(sS + (r + 8) * LDS + c) = lt_pack_bf16(sv[2], sv[3]);
                }
        }
        __syncthreads();

        /* dV += Pᵀ dO and dK += dSᵀ Q over this warp's 32 keys and half of D. */
        if (!(kA > q0 + BM - 1 || kA + 31 < cLo[0]))
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++) {
            uint32_t ap[2][4], as[2][4];
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int off = (32 * kw + 16 * t + (lane & 15)) * LDS + kc * 16 + (lane >> 4) * 8;
                lt_ldsm_x4(ap[t], sP + off);
                lt_ldsm_x4(as[t], sS + off);
            }
#pragma unroll
            for (int np = 0; np < DH / 16; np++) {
                const int off = (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dh * DH + np * 16 +
                                (lane >> 4) * 8;
                uint32_t ro[4], rq[4];
                lt_ldsm_x4_t(ro, cO + off);
                lt_ldsm_x4_t(rq, cQ + off);
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    lt_mma16816(dv[t][2 * np], ap[t], ro[0], ro[1]);
                    lt_mma16816(dv[t][2 * np + 1], ap[t], ro[2], ro[3]);
                    lt_mma16816(dk[t][2 * np], as[t], rq[0], rq[1]);
                    lt_mma16816(dk[t][2 * np + 1], as[t], rq[2], rq[3]);
                }
            }
        }

        /* dQ += dS K: A = dS (stored transposed), B = K rows. */
        /* Whole-warp tests only: a branch inside the unrolled loops stops the compiler from
         * issuing the next fragment loads early, which measured slower (dev/cuda/NOTES.md). */
        if (!(k0 > q0 + 16 * DQ_MT * (warp % DQ_QW) + 16 * DQ_MT - 1 || klast < cLo[16 * DQ_MT * (warp % DQ_QW)])) {
            const int qw2 = warp % DQ_QW, dp2 = warp / DQ_QW;
            float acc[DQ_MT][DQ_DW / 8][4];
#pragma unroll
            for (int t = 0; t < DQ_MT; t++)
#pragma unroll
                for (int j = 0; j < DQ_DW / 8; j++) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < BN / 16; kc++) {
                uint32_t a[DQ_MT][4];
#pragma unroll
                for (int t = 0; t < DQ_MT; t++)
                    lt_ldsm_x4_t(a[t], sS + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * LDS +
                                           16 * DQ_MT * qw2 + 16 * t + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int np = 0; np < DQ_DW / 16; np++) {
                    uint32_t r[4];
                    lt_ldsm_x4_t(r, sK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp2 * DQ_DW +
                                        np * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int t = 0; t < DQ_MT; t++) {
                        lt_mma16816(acc[t][2 * np], a[t], r[0], r[1]);
                        lt_mma16816(acc[t][2 * np + 1], a[t], r[2], r[3]);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < DQ_MT; t++) {
                const int r0 = q0 + 16 * DQ_MT * qw2 + 16 * t + (lane >> 2), r1 = r0 + 8;
                const int c = dp2 * DQ_DW + (lane & 3) * 2;
                float *g0 = p.dq_acc + (((int64_t)b * T + r0) * p.H + h) * D + c;
                float *g1 = g0 + (int64_t)8 * p.H * D;
#pragma unroll
                for (int j = 0; j < DQ_DW / 8; j++) {
                    if (r0 < T) {
                        atomicAdd(g0 + j * 8, acc[t][j][0]);
                        atomicAdd(g0 + j * 8 + 1, acc[t][j][1]);
                    }
                    if (r1 < T) {
                        atomicAdd(g1 + j * 8, acc[t][j][2]);
                        atomicAdd(g1 + j * 8 + 1, acc[t][j][3]);
                    }
                }
            }
        }
    }

    __nv_bfloat16 *gdk = p.dk + b * p.kv_sb + hk * p.kv_sh;
    __nv_bfloat16 *gdv = p.dv + b * p.kv_sb + hk * p.kv_sh;
#pragma unroll
    for (int t = 0; t < 2; t++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int key = k0 + 32 * kw + 16 * t + (lane >> 2) + hr * 8;
            if (key >= T) continue;
#pragma unroll
            for (int j = 0; j < DH / 8; j++) {
                const int c = dh * DH + j * 8 + (lane & 3) * 2;
                *(uint32_t *)(gdk + (int64_t)key * p.kv_st + c) =
                    lt_pack_bf16(dk[t][j][2 * hr] * scale, dk[t][j][2 * hr + 1] * scale);
                *(uint32_t *)(gdv + (int64_t)key * p.kv_st + c) = lt_pack_bf16(dv[t][j][2 * hr], dv[t][j][2 * hr + 1]);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Hopper version of the main kernel (dev/cuda/NOTES.md, v5): the same CTA work (128 keys of one kv
 * head, every query head of its group, 64 queries per step) on warpgroup MMAs. Two warpgroups of 4
 * warps; warpgroup g owns keys 64g..64g+63 for Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q,
 * and columns 64g..64g+63 of dQ = dS·K. K, V, Q, dO stay in shared memory in the 128-byte swizzle
 * (wgmma reads them there, so no fragment lives in registers); Pᵀ and dSᵀ go from the score
 * accumulators straight into A fragments in registers; dSᵀ also goes to shared memory once for dQ.
 * dQ is added to the fp32 buffer with 2-wide vector atomics. D = 64 or 128. */
template <int N>
static __device__ __forceinline__ void bwd_cp_async(void *smem, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(lt_smem_addr(smem)), "l"(g), "n"(N));
}

template <int D, bool NODQ, int NWG>
static __global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 2 : 1) attn_bwd_wg_kernel(lt_attn_dev p) {
    /* NWG = 1 (64 keys, two CTAs per SM) has no dQ part: its dS·K would need both column halves
     * of K in one warpgroup. */
    static_assert(NWG == 2 || NODQ, "one warpgroup per CTA only without dQ");
#if LT_WGMMA_OK
    constexpr int BN = 64 * NWG, BM = 64, KS = D / 16, NH = D / 64, NT = 128 * NWG;
    constexpr int TILE_K = BN * D * 2, TILE_Q = BM * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sK = smem, *sV = sK + TILE_K, *sQ = sV + TILE_K, *sO = sQ + 2 * TILE_Q;
    unsigned char *sDS = sO + 2 * TILE_Q; /* dSᵀ: BN keys x BM queries */
    float *sL = (float *)(sDS + BN * BM * 2);
    float *sD = sL + 2 * BM;
    int *sLo = (int *)(sD + 2 * BM);

    /* blockIdx.x: kv head (and split), fastest, so that every head's long first key blocks are
     * scheduled before any short last one (longest-first; kb = 0 sees every query of a causal
     * row). */
    const int T = p.T, kb = blockIdx.y, hk = blockIdx.x / p.nsplit, b = blockIdx.z;
    const int heads = p.group / p.nsplit, h_first = hk * p.group + (blockIdx.x % p.nsplit) * heads;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int k0 = kb * BN, klast = min(k0 + BN, T) - 1;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int q_end = attn_bwd_q_end(lo, k0, klast, T);
    const int qb_begin = k0 / BM, nqb = (q_end - 1) / BM - qb_begin + 1;
    const int steps = nqb * heads;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_load_tile<BN, D, NT>(sK, gk, p.kv_st, k0, T, tid);
    lt_wg_load_tile<BN, D, NT>(sV, gv, p.kv_st, k0, T, tid);
    auto load_step = [&](int step, int buf) {
        const int h = h_first + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        lt_wg_load_tile<BM, D, NT>(sQ + buf * TILE_Q, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, tid);
        lt_wg_load_tile<BM, D, NT>(sO + buf * TILE_Q, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, T, tid);
        if (tid < BM) {
            const int t = min(q0 + tid, T - 1);
            const int64_t r = ((int64_t)b * p.H + h) * T + t;
            bwd_cp_async<4>(sL + buf * BM + tid, p.lse + r);
            bwd_cp_async<4>(sD + buf * BM + tid, p.delta + r);
            bwd_cp_async<4>(sLo + buf * BM + tid, lo + t);
        }
    };
    if (steps > 0) load_step(0, 0);
    lt_cp_async_commit();

    float dk[NH][32], dv[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dk[n][i] = dv[n][i] = 0.0f;
    const float scale = p.scale, cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float sl2 = scale * LOG2E_F;
    const uint32_t aK = lt_smem_addr(sK), aV = lt_smem_addr(sV), aDS = lt_smem_addr(sDS);
    const int kw0 = k0 + 64 * wg;                          /* this warpgroup's first key */
    const int krow = 64 * wg + 16 * warp + (lane >> 2);    /* CTA-local key of accumulator row 0 */

    for (int step = 0; step < steps; step++) {
        const int buf = step & 1;
        const int h = h_first + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        lt_cp_async_wait<0>();
        lt_fence_proxy_async();
        __syncthreads();
        if (step + 1 < steps) {
            load_step(step + 1, buf ^ 1);
            lt_cp_async_commit();
        }
        const uint32_t aQ = lt_smem_addr(sQ + buf * TILE_Q), aO = lt_smem_addr(sO + buf * TILE_Q);
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;
        const int *cLo = sLo + buf * BM;
        /* Warpgroup-uniform skip of key blocks no query of the step can see. */
        const bool skip = kw0 > q0 + BM - 1 || kw0 + 63 < cLo[0];
        uint32_t pa[4][4], da[4][4];
        if (!skip) {
            float s[32], dp[32];
            lt_wgmma_pin(s);
            lt_wgmma_pin(dp);
            lt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                lt_wgmma_ss<0, 0>(s, lt_wgmma_desc(aK + (kk >> 2) * (BN * 128) + wg * 8192 + (kk & 3) * 32),
                                  lt_wgmma_desc(aQ + (kk >> 2) * (BM * 128) + (kk & 3) * 32), kk > 0);
            lt_wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                lt_wgmma_ss<0, 0>(dp, lt_wgmma_desc(aV + (kk >> 2) * (BN * 128) + wg * 8192 + (kk & 3) * 32),
                                  lt_wgmma_desc(aO + (kk >> 2) * (BM * 128) + (kk & 3) * 32), kk > 0);
            lt_wgmma_commit();
            /* P from S while dPᵀ is still being computed (softcap needs both at once: wait). */
            const bool full = (kw0 + 63 <= q0) && (q0 + BM - 1 < T) && (kw0 >= cLo[BM - 1]);
            if (cap > 0.0f) {
                lt_wgmma_wait<0>();
                lt_wgmma_pin(s);
                lt_wgmma_pin(dp);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int qc = 8 * j + 2 * (lane & 3);
                    const float2 L = *(const float2 *)(cL + qc), Dl = *(const float2 *)(cD + qc);
                    const int2 LO = *(const int2 *)(cLo + qc);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + krow + 8 * (e >> 1), q = q0 + qc + (e & 1);
                        const float th = tanhf(s[4 * j + e] * scale * inv_cap);
                        float pr = exp2f((cap * th) * LOG2E_F - ((e & 1) ? L.y : L.x) * LOG2E_F);
                        if (!full && (key > q || key < ((e & 1) ? LO.y : LO.x) || q >= T)) pr = 0.0f;
                        /* dS here; the loop below then takes dp as it is. */
                        dp[4 * j + e] = pr * (dp[4 * j + e] - ((e & 1) ? Dl.y : Dl.x)) * (1.0f - th * th);
                        s[4 * j + e] = pr;
                    }
                }
            } else {
                lt_wgmma_wait<1>();
                lt_wgmma_pin(s);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int qc = 8 * j + 2 * (lane & 3);
                    const float2 L = *(const float2 *)(cL + qc);
                    const int2 LO = *(const int2 *)(cLo + qc);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + krow + 8 * (e >> 1), q = q0 + qc + (e & 1);
                        float pr = exp2f(fmaf(s[4 * j + e], sl2, -((e & 1) ? L.y : L.x) * LOG2E_F));
                        if (!full && (key > q || key < ((e & 1) ? LO.y : LO.x) || q >= T)) pr = 0.0f;
                        s[4 * j + e] = pr;
                    }
                }
                lt_wgmma_wait<0>();
                lt_wgmma_pin(dp);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float2 Dl = *(const float2 *)(cD + 8 * j + 2 * (lane & 3));
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? Dl.y : Dl.x));
                }
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                pa[j >> 1][(j & 1) * 2] = lt_pack_bf16(s[4 * j], s[4 * j + 1]);
                pa[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(s[4 * j + 2], s[4 * j + 3]);
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int qc = 8 * j + 2 * (lane & 3);
                da[j >> 1][(j & 1) * 2] = lt_pack_bf16(dp[4 * j], dp[4 * j + 1]);
                da[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(dp[4 * j + 2], dp[4 * j + 3]);
                *(uint32_t *)(sDS + lt_sw128_offset(krow, qc, BN)) = da[j >> 1][(j & 1) * 2];
                *(uint32_t *)(sDS + lt_sw128_offset(krow + 8, qc, BN)) = da[j >> 1][(j & 1) * 2 + 1];
            }
            /* dV += Pᵀ·dO, dK += dSᵀ·Q: A from registers, B = the query tiles read MN-major. */
#pragma unroll
            for (int n = 0; n < NH; n++) {
                lt_wgmma_pin(dv[n]);
                lt_wgmma_pin(dk[n]);
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                lt_wgmma_pin_u(pa[kk]);
                lt_wgmma_pin_u(da[kk]);
            }
            lt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_wgmma_rs<1>(dv[n], pa[kk], lt_wgmma_desc(aO + n * (BM * 128) + kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_wgmma_rs<1>(dk[n], da[kk], lt_wgmma_desc(aQ + n * (BM * 128) + kk * 2048), 1);
            lt_wgmma_commit();
        } else if (!NODQ) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int qc = 8 * j + 2 * (lane & 3);
                *(uint32_t *)(sDS + lt_sw128_offset(krow, qc, BN)) = 0u;
                *(uint32_t *)(sDS + lt_sw128_offset(krow + 8, qc, BN)) = 0u;
            }
        }
        /* dSᵀ complete for dQ. Without dQ here the barrier is kept too: dropping it let the
         * compiler stretch register lifetimes across steps and spill (ptxas, 88 bytes). */
        lt_fence_proxy_async();
        __syncthreads();

        /* dQ = dS·K over the CTA's 128 keys. D = 128: warpgroup g computes columns 64g..64g+63;
         * D = 64: warpgroup 0 alone (half the atomics of a split over keys). */
        const bool dq_skip =
            (k0 > q0 + BM - 1 || klast < cLo[0]) || (D == 64 && wg == 1) || NODQ;
        if (!dq_skip) {
            float acc[32];
            lt_wgmma_pin(acc);
            lt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                lt_wgmma_ss<1, 1>(acc, lt_wgmma_desc(aDS + kk * 2048),
                                  lt_wgmma_desc(aK + (D == 128 ? wg * (BN * 128) : 0) + kk * 2048), kk > 0);
            lt_wgmma_commit();
            lt_wgmma_wait<0>();
            lt_wgmma_pin(acc);
            /* 8-byte vector atomics: 16-byte red.global.add.v4.f32 after a lane-pair exchange
             * measured slower (4.40 against 4.31 ms at 8k; dev/cuda/NOTES.md, v8). */
            const int r0 = q0 + 16 * warp + (lane >> 2), r1 = r0 + 8;
            const int c = (D == 128 ? 64 * wg : 0) + 2 * (lane & 3);
            float *g0 = p.dq_acc + (((int64_t)b * T + r0) * p.H + h) * D + c;
            float *g1 = g0 + (int64_t)8 * p.H * D;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (r0 < T) atomicAdd((float2 *)(g0 + 8 * j), make_float2(acc[4 * j], acc[4 * j + 1]));
                if (r1 < T) atomicAdd((float2 *)(g1 + 8 * j), make_float2(acc[4 * j + 2], acc[4 * j + 3]));
            }
        } else {
            lt_wgmma_wait<0>();
        }
    }
    lt_wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NH; n++) {
        lt_wgmma_pin(dv[n]);
        lt_wgmma_pin(dk[n]);
    }

    if (p.dkv_acc) {
        /* Split heads: several CTAs add their partial sums (fp32, converted afterwards). */
        const int64_t plane = (int64_t)gridDim.z * T * p.Hkv * D;
        float *ak = p.dkv_acc + (((int64_t)b * T) * p.Hkv + hk) * D, *av = ak + plane;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int key = k0 + krow + 8 * hr;
            if (key >= T) continue;
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int64_t o = (int64_t)key * p.Hkv * D + 64 * n + 8 * j + 2 * (lane & 3);
                    atomicAdd((float2 *)(ak + o), make_float2(dk[n][4 * j + 2 * hr], dk[n][4 * j + 2 * hr + 1]));
                    atomicAdd((float2 *)(av + o), make_float2(dv[n][4 * j + 2 * hr], dv[n][4 * j + 2 * hr + 1]));
                }
        }
        return;
    }
    __nv_bfloat16 *gdk = p.dk + b * p.kv_sb + hk * p.kv_sh;
    __nv_bfloat16 *gdv = p.dv + b * p.kv_sb + hk * p.kv_sh;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int key = k0 + krow + 8 * hr;
        if (key >= T) continue;
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = 64 * n + 8 * j + 2 * (lane & 3);
                *(uint32_t *)(gdk + (int64_t)key * p.kv_st + c) =
                    lt_pack_bf16(dk[n][4 * j + 2 * hr] * scale, dk[n][4 * j + 2 * hr + 1] * scale);
                *(uint32_t *)(gdv + (int64_t)key * p.kv_st + c) =
                    lt_pack_bf16(dv[n][4 * j + 2 * hr], dv[n][4 * j + 2 * hr + 1]);
            }
    }
#else
    (void)p;
    __trap();
#endif
}

/* ---------------------------------------------------------------------------------------------
 * dQ without atomics, for rows whose visible key range is short (packed rows, small windows):
 * one warpgroup owns 64 query rows of one head and walks the 64-key tiles they can see,
 * recomputing S = Q·Kᵀ and dP = dO·Vᵀ (both operands K-major in shared memory), forming dS in
 * registers and accumulating dQ += dS·K (dS as the register A operand, K read MN-major). dQ is
 * written once in bf16: no fp32 buffer, no memset, no conversion pass. The main kernel then skips
 * its dQ part. It costs two extra MMAs per tile, which pays only when tiles are few. */
template <int D, bool DELTA>
static __global__ void __launch_bounds__(128, 2) attn_bwd_dq_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int BM = 64, BN = 64, KS = D / 16, NH = D / 64, TILE = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sO = sQ + TILE, *sK = sO + TILE, *sV = sK + 2 * TILE;

    const int T = p.T;
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = qb * BM, qlast = min(q0 + BM, T) - 1;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int kb_begin = lo[q0] / BN, kb_end = qlast / BN;
    const int lo_last = lo[qlast];

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_load_tile<BM, D, 128>(sQ, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, tid);
    lt_wg_load_tile<BM, D, 128>(sO, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, T, tid);
    lt_wg_load_tile<BN, D, 128>(sK, gk, p.kv_st, kb_begin * BN, T, tid);
    lt_wg_load_tile<BN, D, 128>(sV, gv, p.kv_st, kb_begin * BN, T, tid);
    lt_cp_async_commit();

    int row[2], rlo[2];
    float L2[2], Dl[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        row[hr] = q0 + 16 * warp + (lane >> 2) + 8 * hr;
        const int t = min(row[hr], T - 1);
        rlo[hr] = lo[t];
        const int64_t r = ((int64_t)b * p.H + h) * T + t;
        L2[hr] = p.lse[r] * LOG2E_F;
        if (DELTA) {
            /* delta = rowsum(dO·O) here, for the main kernel that runs next: the four lanes of
             * an accumulator row each take a quarter of D (16-byte loads), then reduce. */
            const __nv_bfloat16 *o = p.o + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
            const __nv_bfloat16 *g = p.dout + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
            float acc = 0.0f;
#pragma unroll
            for (int c = (lane & 3) * (D / 4); c < (lane & 3) * (D / 4) + D / 4; c += 8)
                acc = attn_dot8(acc, o + c, g + c);
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            acc += __shfl_xor_sync(0xffffffffu, acc, 2);
            Dl[hr] = acc;
            if ((lane & 3) == 0 && row[hr] < T) p.delta[r] = acc;
        } else {
            Dl[hr] = p.delta[r];
        }
    }
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LOG2E_F;
    const uint32_t aQ = lt_smem_addr(sQ), aO = lt_smem_addr(sO);
    const uint64_t dQ = lt_wgmma_desc(aQ), dO = lt_wgmma_desc(aO);

    float dq[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dq[n][i] = 0.0f;

    for (int kb = kb_begin; kb <= kb_end; kb++) {
        const int buf = (kb - kb_begin) & 1;
        lt_cp_async_wait<0>();
        lt_fence_proxy_async();
        __syncthreads();
        if (kb < kb_end) {
            lt_wg_load_tile<BN, D, 128>(sK + (buf ^ 1) * TILE, gk, p.kv_st, (kb + 1) * BN, T, tid);
            lt_wg_load_tile<BN, D, 128>(sV + (buf ^ 1) * TILE, gv, p.kv_st, (kb + 1) * BN, T, tid);
            lt_cp_async_commit();
        }
        const uint32_t aK = lt_smem_addr(sK + buf * TILE), aV = lt_smem_addr(sV + buf * TILE);
        const uint64_t dK = lt_wgmma_desc(aK), dV = lt_wgmma_desc(aV);
        const int k0 = kb * BN;
        float s[32], dp[32];
        lt_wgmma_pin(s);
        lt_wgmma_pin(dp);
        lt_wgmma_fence();
        lt_wgmma_kmajor<KS, BM, BN>(s, dQ, dK);
        lt_wgmma_commit();
        lt_wgmma_kmajor<KS, BM, BN>(dp, dO, dV);
        lt_wgmma_commit();
        lt_wgmma_wait<0>();
        lt_wgmma_pin(s);
        lt_wgmma_pin(dp);

        const bool full = (k0 + BN - 1 <= q0) && (k0 >= lo_last);
        uint32_t da[4][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float sv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e >> 1, key = k0 + 8 * j + 2 * (lane & 3) + (e & 1);
                float pr, dfac = 1.0f;
                if (cap > 0.0f) {
                    const float th = tanhf(s[4 * j + e] * scale * inv_cap);
                    dfac = 1.0f - th * th;
                    pr = exp2f((cap * th) * LOG2E_F - L2[hr]);
                } else {
                    pr = exp2f(fmaf(s[4 * j + e], sl2, -L2[hr]));
                }
                if (!full && (key > row[hr] || key < rlo[hr])) pr = 0.0f;
                sv[e] = pr * (dp[4 * j + e] - Dl[hr]) * dfac;
            }
            da[j >> 1][(j & 1) * 2] = lt_pack_bf16(sv[0], sv[1]);
            da[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(sv[2], sv[3]);
        }
        lt_wgmma_rs_wait<NH, BN / 16, BN>(dq, da, dK);
    }

    __nv_bfloat16 *gdq = p.dq + b * p.dq_sb + h * p.dq_sh;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = row[hr];
        if (r >= T) continue;
        __nv_bfloat16 *dst = gdq + (int64_t)r * p.dq_st;
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                *(uint32_t *)(dst + 64 * n + 8 * j + 2 * (lane & 3)) =
                    lt_pack_bf16(dq[n][4 * j + 2 * hr] * scale, dq[n][4 * j + 2 * hr + 1] * scale);
    }
#else
    (void)p;
    __trap();
#endif
}

/* The dQ-only kernel of sparse rows (attn_bwd_dq_kernel): grid (H, query blocks, B). */
template <int D, bool DELTA> static lt_status attn_bwd_dq_launch(lt_ctx *ctx, const lt_attn_dev &d, int B) {
    const size_t smem = (size_t)6 * 64 * D * 2 + 1024;
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_bwd_dq_kernel<D, DELTA>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "attention backward: shared memory size"));
    dim3 grid((unsigned)d.H, (unsigned)((d.T + 63) / 64), (unsigned)B);
    attn_bwd_dq_kernel<D, DELTA><<<grid, 128, smem, lt_cuda_stream()>>>(d);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dq kernel launch");
}

template <int D, bool NODQ, int NWG>
static lt_status attn_bwd_wg_main_launch(lt_ctx *ctx, const lt_attn_dev &d, int B) {
    constexpr int BN = 64 * NWG, BM = 64;
    const size_t smem = (size_t)(2 * BN + 4 * BM) * D * 2 + (size_t)BN * BM * 2 + 6 * BM * 4 + 1024;
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_bwd_wg_kernel<D, NODQ, NWG>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "attention backward: shared memory size"));
    dim3 grid((unsigned)(d.Hkv * d.nsplit), (unsigned)((d.T + BN - 1) / BN), (unsigned)B);
    attn_bwd_wg_kernel<D, NODQ, NWG><<<grid, 128 * NWG, smem, lt_cuda_stream()>>>(d);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward kernel launch");
}

/* The wgmma backward: delta (its own pass, or inside the dQ kernel when that runs first), the main
 * kernel (64 or 128 keys per CTA), then the conversions of whatever went through fp32 sums. */
template <int D>
static lt_status attn_bwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, const lt_attn_bwd_plan &pl,
                                    int ws) {
    const int64_t rows = (int64_t)B * d.T * d.H;
    if (ws) {
        attn_bwd_delta<D><<<(unsigned)((rows * 16 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
        LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward: delta kernel"));
        return lt_attn_bwd_ws_launch(ctx, d, B, D);
    }
    if (d.no_dq && pl.delta_dq) {
        LT_TRY((attn_bwd_dq_launch<D, true>(ctx, d, B)));
    } else {
        attn_bwd_delta<D><<<(unsigned)((rows * 16 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
        LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward: delta kernel"));
    }
    const lt_status st = !d.no_dq      ? attn_bwd_wg_main_launch<D, false, 2>(ctx, d, B)
                         : pl.bn == 64 ? attn_bwd_wg_main_launch<D, true, 1>(ctx, d, B)
                                       : attn_bwd_wg_main_launch<D, true, 2>(ctx, d, B);
    LT_TRY(st);
    if (d.dkv_acc) {
        const int64_t n3 = (int64_t)B * d.T * d.Hkv * D / 2;
        attn_bwd_convert_dkv<D><<<(unsigned)((n3 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
        LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dk/dv conversion kernel"));
    }
    if (d.no_dq) return pl.delta_dq ? LT_OK : attn_bwd_dq_launch<D, false>(ctx, d, B);
    const int64_t n2 = rows * D / 2;
    attn_bwd_convert_dq<D><<<(unsigned)((n2 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dq conversion kernel");
}

template <int D> static lt_status attn_bwd_launch(lt_ctx *ctx, const lt_attn_dev &d, int B) {
    constexpr int LD = D + 8, BN = 128, BM = 64;
    const size_t smem = (size_t)(2 * BN + 4 * BM) * LD * sizeof(__nv_bfloat16) +
                        (size_t)2 * BN * (BM + 8) * sizeof(__nv_bfloat16) + (size_t)6 * BM * sizeof(float);
    const int64_t rows = (int64_t)B * d.T * d.H;
    attn_bwd_delta<D><<<(unsigned)((rows * 16 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
    LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward: delta kernel"));
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_bwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)smem),
                         "attention backward: shared memory size"));
    dim3 grid((unsigned)((d.T + BN - 1) / BN), (unsigned)d.Hkv, (unsigned)B);
    attn_bwd_kernel<D><<<grid, 256, smem, lt_cuda_stream()>>>(d);
    LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward kernel launch"));
    const int64_t n2 = rows * D / 2;
    attn_bwd_convert_dq<D><<<(unsigned)((n2 + 255) / 256), 256, 0, lt_cuda_stream()>>>(d, B);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dq conversion kernel");
}

extern "C" lt_status lt_attention_cuda_backward(lt_ctx *ctx, const lt_attention_params *p,
                                                lt_attention_args *a) {
    LT_TRY(lt_attn_cuda_supported(ctx, p, p->Hkv)); /* the key/value heads span a grid axis */
    if (p->T == 0 || p->B == 0) return LT_OK;
    size_t ws_bytes = lt_attention_cuda_workspace_bytes(p, 1, 0);
    void *ws = a->workspace;
    if (!ws) {
        ws = lt_alloc(ctx, LT_DEVICE_CUDA, ws_bytes, "attention backward workspace");
        if (!ws) return lt_ctx_status(ctx);
    }
    lt_attn_dev d;
    size_t used = 0;
    lt_status st = lt_attn_cuda_prepare(ctx, p, a, ws, &d, &used);
    const lt_attn_bwd_plan pl = lt_attn_cuda_bwd_plan(p);
    /* The warp-specialised kernel (attention_bwd_ws.cu) where it applies, unless
     * LONGTUNE_ATTN_BWD=wg keeps the previous kernels (for measurements). */
    const char *which = getenv("LONGTUNE_ATTN_BWD");
    const int use_ws = lt_attn_bwd_ws_eligible(p, &pl, a->lse) && !(which && !strcmp(which, "wg"));
    if (st == LT_OK) {
        /* Workspace after the key bounds: delta, then the fp32 dQ sums (unless dQ has its own
         * kernel), then the fp32 dK/dV sums of split CTAs. */
        char *w = (char *)ws + used;
        const size_t acc_bytes = (size_t)p->B * (size_t)p->T * (size_t)p->H * (size_t)p->D * 4;
        d.delta = (float *)w;
        w += lt_cuda_align((size_t)p->B * (size_t)p->H * (size_t)p->T * 4);
        d.nsplit = 1;
        d.no_dq = pl.dq_sep;
        if (!pl.dq_sep) {
            d.dq_acc = (float *)w;
            w += lt_cuda_align(acc_bytes);
            st = lt_cuda_check(ctx, cudaMemsetAsync(d.dq_acc, 0, acc_bytes, lt_cuda_stream()), "attention backward: memset");
        }
        if (st == LT_OK && pl.split > 1) {
            const size_t kv_bytes = (size_t)2 * (size_t)p->B * (size_t)p->T * (size_t)p->Hkv * (size_t)p->D * 4;
            d.nsplit = pl.split;
            d.dkv_acc = (float *)w;
            st = lt_cuda_check(ctx, cudaMemsetAsync(d.dkv_acc, 0, kv_bytes, lt_cuda_stream()), "attention backward: memset");
        }
    }
    if (st == LT_OK) {
        switch (p->D) {
        case 64:
            st = pl.wg ? attn_bwd_wg_launch<64>(ctx, d, (int)p->B, pl, use_ws) : attn_bwd_launch<64>(ctx, d, (int)p->B);
            break;
        case 96: st = attn_bwd_launch<96>(ctx, d, (int)p->B); break;
        default:
            st = pl.wg ? attn_bwd_wg_launch<128>(ctx, d, (int)p->B, pl, use_ws) : attn_bwd_launch<128>(ctx, d, (int)p->B);
            break;
        }
    }
    if (!a->workspace) lt_free(ctx, LT_DEVICE_CUDA, ws, ws_bytes);
    return st;
}
