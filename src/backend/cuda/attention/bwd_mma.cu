/* The mma.sync flash attention backward main kernel for every head dim and GPU, FlashAttention-2's
 * tiling. A CTA owns 128 keys (8 warps; 64 keys at D = 256) and steps over 64 query
 * rows at a time, for every query head of its kv head's group. Sᵀ and dPᵀ are tiled 4 x 2 over the
 * warps (32 keys x 32 queries each; 2 x 4 of 32 x 16 at 64 keys); Pᵀ and dSᵀ go to shared memory as
 * bf16; dV and dK are tiled 4 x 2 (32 keys x D/2 each; 2 x 4 of 32 x D/4 at 64 keys) and dQ 2 x 4
 * (32 queries x D/4; D = 96: 4 x 2 of 16 x 48). Two 16-row
 * tiles per warp let every fragment read from shared memory feed two MMAs (shared-memory bandwidth
 * bounds these kernels). dQ goes into the fp32 buffer by atomics; bwd.cu runs delta before and the
 * conversion after. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/launch.h"

#include <math.h>

template <int D> static __global__ void __launch_bounds__(256) attn_bwd_kernel(lt_attn_dev p) {
    constexpr int NW = LT_ATTN_BWD_MMA_WARPS, BN = lt_attn_bwd_mma_shape<D>::BN, BM = LT_ATTN_BWD_MMA_BM;
    constexpr int LD = D + 8, LDS = BM + 8, KC = D / 16;
    constexpr int KW = BN / 32;              /* warps along keys (32 keys each) */
    constexpr int QW = NW / KW;              /* warps along queries (Sᵀ, dPᵀ) and along D (dV, dK) */
    constexpr int QN = BM / QW;              /* Sᵀ, dPᵀ: queries per warp (32 or 16) */
    constexpr int DH = D / QW;               /* dV, dK: columns per warp */
    constexpr int DQ_MT = D == 96 ? 1 : 2;   /* dQ: 16-row tiles per warp */
    constexpr int DQ_QW = BM / (16 * DQ_MT); /* warps along queries (4 or 2) */
    constexpr int DQ_DW = D / (NW / DQ_QW);  /* columns per warp (64, 48, 32 or 16) */
    static_assert((KW == 4 || KW == 2) && KW * QW == NW && QN % 16 == 0 && DH % 16 == 0 && DQ_DW % 16 == 0,
                  "backward warp tiling");
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sV = sK + BN * LD;
    __nv_bfloat16 *sQ = sV + BN * LD;     /* 2 buffers */
    __nv_bfloat16 *sO = sQ + 2 * BM * LD; /* dO, 2 buffers */
    __nv_bfloat16 *sP = sO + 2 * BM * LD; /* Pᵀ, BN x LDS */
    __nv_bfloat16 *sS = sP + BN * LDS;    /* dSᵀ, BN x LDS */
    float *sL = (float *)(sS + BN * LDS);
    float *sD = sL + 2 * BM;
    int *sLo = (int *)(sD + 2 * BM);

    const int T = p.T, kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const lt_attn_kblock blk = lt_attn_kblock_at<BN, BM, false>(p, kb, b);
    const int32_t *lo = blk.lo;
    const int k0 = blk.k0, klast = blk.klast, qb_begin = blk.qb_begin, nqb = blk.nqb;
    const int steps = nqb * p.group;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_attn_load_rows<D, NW * 32>(sK, gk, p.kv_st, k0, BN, T, tid);
    lt_attn_load_rows<D, NW * 32>(sV, gv, p.kv_st, k0, BN, T, tid);
    auto load_step = [&](int step, int buf) {
        const int h = hk * p.group + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        lt_attn_load_rows<D, NW * 32>(sQ + buf * BM * LD, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, BM, T, tid);
        lt_attn_load_rows<D, NW * 32>(sO + buf * BM * LD, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, BM, T, tid);
        if (tid < BM) {
            int t = q0 + tid;
            int64_t r = ((int64_t)b * p.H + h) * T + (t < T ? t : T - 1);
            sL[buf * BM + tid] = p.lse[r] * LT_ATTN_LOG2E;
            sD[buf * BM + tid] = p.delta[r];
            sLo[buf * BM + tid] = t < T ? lo[t] : INT32_MAX;
        }
    };
    load_step(0, 0);
    lt_cp_async_commit();

    /* Sᵀ/dPᵀ: query share dh; dV/dK: D share dh (KW is 4 or 2: masks and shifts, as unsigned) */
    const int kw = warp & (KW - 1), dh = warp >> (KW == 4 ? 2 : 1);
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
        const bool skip1 = kA > q0 + QN * dh + QN - 1 || kA + 31 < cLo[QN * dh];
        if (skip1) {
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int j = 0; j < QN / 8; j++) {
                    const int r = 32 * kw + 16 * t + (lane >> 2), c = QN * dh + j * 8 + (lane & 3) * 2;
                    *(uint32_t *)(sP + r * LDS + c) = 0u;
                    *(uint32_t *)(sP + (r + 8) * LDS + c) = 0u;
                    *(uint32_t *)(sS + r * LDS + c) = 0u;
                    *(uint32_t *)(sS + (r + 8) * LDS + c) = 0u;
                }
        } else {
            float st[2][QN / 8][4], dp[2][QN / 8][4];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int j = 0; j < QN / 8; j++)
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
                for (int np = 0; np < QN / 16; np++) {
                    const int off =
                        (QN * dh + 16 * np + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8;
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
                for (int j = 0; j < QN / 8; j++) {
                    float pv[4], sv[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qc = QN * dh + j * 8 + (lane & 3) * 2 + (e & 1);
                        const int key = k0 + 32 * kw + 16 * t + (lane >> 2) + (e >> 1) * 8, q = q0 + qc;
                        float x = st[t][j][e] * scale, dfac = 1.0f;
                        if (cap > 0.0f) {
                            float th = tanhf(x * inv_cap);
                            x = cap * th;
                            dfac = 1.0f - th * th;
                        }
                        float pr = exp2f(x * LT_ATTN_LOG2E - cL[qc]);
                        if (!full && (key > q || key < cLo[qc])) pr = 0.0f;
                        pv[e] = pr;
                        sv[e] = pr * (dp[t][j][e] - cD[qc]) * dfac;
                    }
                    const int r = 32 * kw + 16 * t + (lane >> 2), c = QN * dh + j * 8 + (lane & 3) * 2;
                    *(uint32_t *)(sP + r * LDS + c) = lt_pack_bf16(pv[0], pv[1]);
                    *(uint32_t *)(sP + (r + 8) * LDS + c) = lt_pack_bf16(pv[2], pv[3]);
                    *(uint32_t *)(sS + r * LDS + c) = lt_pack_bf16(sv[0], sv[1]);
                    *(uint32_t *)(sS + (r + 8) * LDS + c) = lt_pack_bf16(sv[2], sv[3]);
                }
        }
        __syncthreads();

        /* dV += Pᵀ dO and dK += dSᵀ Q over this warp's 32 keys and its share of D. */
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
                    const int off =
                        (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dh * DH + np * 16 + (lane >> 4) * 8;
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
         * issuing the next fragment loads early, which measured slower (dev/cuda/README.md). */
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
                    lt_ldsm_x4_t(a[t],
                                 sS + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + 16 * DQ_MT * qw2 + 16 * t +
                                     ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int np = 0; np < DQ_DW / 16; np++) {
                    uint32_t r[4];
                    lt_ldsm_x4_t(r,
                                 sK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp2 * DQ_DW + np * 16 +
                                     (lane >> 4) * 8);
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

template <int D> static lt_status bwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    constexpr int LD = D + 8, BN = lt_attn_bwd_mma_shape<D>::BN, BM = LT_ATTN_BWD_MMA_BM;
    const size_t smem = (size_t)(2 * BN + 4 * BM) * LD * sizeof(__nv_bfloat16) +
        (size_t)2 * BN * (BM + 8) * sizeof(__nv_bfloat16) + (size_t)6 * BM * sizeof(float);
    const dim3 grid((unsigned)((d.T + BN - 1) / BN), (unsigned)d.Hkv, (unsigned)B);
    return lt_attn_launch(ctx, attn_bwd_kernel<D>, grid, LT_ATTN_BWD_MMA_WARPS * 32, smem, stream,
                          "attention backward: shared memory size", "attention backward kernel launch", d);
}

lt_status lt_attn_bwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    switch (D) {
    case 64: return bwd_mma_launch<64>(ctx, d, B, stream);
    case 96: return bwd_mma_launch<96>(ctx, d, B, stream);
    case 256: return bwd_mma_launch<256>(ctx, d, B, stream);
    default: return bwd_mma_launch<128>(ctx, d, B, stream);
    }
}
