/* The mma.sync flash attention forward (FlashAttention-2's tiling) for every head dim and GPU.
 * Warp w owns query rows [16w, 16w+16) of the CTA's BM rows; Q stays in
 * registers as A fragments, K and V tiles stream through shared memory (two buffers, the next tile
 * loading while this one is used), the scores never leave registers: the accumulator fragment of
 * S is re-packed as the A fragment of P·V. Rows are padded by 8 elements so that ldmatrix's eight
 * row addresses fall in distinct banks. Walks only the key tiles its rows can see (causal, window
 * and packed rows skip tiles). */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/launch.h"

#include <math.h>

/* MT = 16-row tiles per warp: with MT = 2 each K/V fragment read from shared memory feeds two
 * MMAs, halving the ldmatrix traffic per FLOP (shared-memory bandwidth, not the tensor cores, bounds
 * the MT = 1 kernel). QREG keeps Q's fragments in registers instead of re-reading them. */
template <int D, int NW, int MT, bool QREG>
static __global__ void __launch_bounds__(NW * 32) attn_fwd_kernel(lt_attn_dev p) {
    constexpr int BM = 16 * MT * NW, BN = LT_ATTN_FWD_MMA_BN, LD = D + 8, KC = D / 16, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sK = sQ + BM * LD;
    __nv_bfloat16 *sV = sK + 2 * BN * LD;

    const int T = p.T;
    const int qb = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const lt_attn_qblock blk = lt_attn_qblock_at<BM, BN>(p, qb, b);
    const int32_t *lo = blk.lo;
    const int q0 = blk.q0, kb_begin = blk.kb_begin, kb_end = blk.kb_end, lo_last = blk.lo_last;

    const __nv_bfloat16 *gq = p.q + b * p.q_sb + h * p.q_sh;
    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;

    lt_attn_load_rows<D, NW * 32>(sQ, gq, p.q_st, q0, BM, T, tid);
    lt_attn_load_rows<D, NW * 32>(sK, gk, p.kv_st, kb_begin * BN, BN, T, tid);
    lt_attn_load_rows<D, NW * 32>(sV, gv, p.kv_st, kb_begin * BN, BN, T, tid);
    lt_cp_async_commit();

    /* Rows of this thread in m-tile t: wr + 16t + lane/4 and that + 8. */
    const int wr = warp * 16 * MT;
    int row[MT][2], rlo[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        row[t][0] = q0 + wr + 16 * t + (lane >> 2);
        row[t][1] = row[t][0] + 8;
        rlo[t][0] = lo[min(row[t][0], T - 1)];
        rlo[t][1] = lo[min(row[t][1], T - 1)];
    }
    const int wlo = lo[min(q0 + wr, T - 1)];
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;

    uint32_t qf[QREG ? MT : 1][QREG ? KC : 1][4];
    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
#pragma unroll
        for (int j = 0; j < DT; j++) o[t][j][0] = o[t][j][1] = o[t][j][2] = o[t][j][3] = 0.0f;
        m[t][0] = m[t][1] = -INFINITY;
        l[t][0] = l[t][1] = 0.0f;
    }

    for (int kb = kb_begin; kb <= kb_end; kb++) {
        const int buf = (kb - kb_begin) & 1;
        lt_cp_async_wait<0>();
        __syncthreads();
        if (QREG && kb == kb_begin) {
#pragma unroll
            for (int t = 0; t < (QREG ? MT : 0); t++)
#pragma unroll
                for (int kc = 0; kc < KC; kc++)
                    lt_ldsm_x4(qf[QREG ? t : 0][QREG ? kc : 0],
                               sQ + (wr + 16 * t + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
        }
        if (kb < kb_end) {
            lt_attn_load_rows<D, NW * 32>(sK + (buf ^ 1) * BN * LD, gk, p.kv_st, (kb + 1) * BN, BN, T, tid);
            lt_attn_load_rows<D, NW * 32>(sV + (buf ^ 1) * BN * LD, gv, p.kv_st, (kb + 1) * BN, BN, T, tid);
            lt_cp_async_commit();
        }
        const __nv_bfloat16 *cK = sK + buf * BN * LD, *cV = sV + buf * BN * LD;
        /* A tile none of this warp's rows can see (packed rows, window) is skipped: lo is
         * non-decreasing, so the warp's first row bounds them all. The test must be the same in
         * every lane (mma.sync needs the whole warp). */
        if (kb * BN > q0 + wr + 16 * MT - 1 || kb * BN + BN - 1 < wlo) continue;

        float s[MT][NT][4];
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int j = 0; j < NT; j++) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; e++) qa[t][e] = qf[QREG ? t : 0][QREG ? kc : 0][e];
                } else {
                    lt_ldsm_x4(qa[t], sQ + (wr + 16 * t + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                lt_ldsm_x4(r, cK + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    lt_mma16816(s[t][2 * np], qa[t], r[0], r[1]);
                    lt_mma16816(s[t][2 * np + 1], qa[t], r[2], r[3]);
                }
            }
        }

        const int k0 = kb * BN;
        const bool full = (k0 + BN - 1 <= q0) && (k0 >= lo_last);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[t][j][e] * scale;
                    if (cap > 0.0f) x = cap * tanhf(x * inv_cap);
                    x *= LT_ATTN_LOG2E;
                    if (!full) {
                        int key = k0 + j * 8 + (lane & 3) * 2 + (e & 1);
                        if (key > row[t][e >> 1] || key < rlo[t][e >> 1]) x = -INFINITY;
                    }
                    s[t][j][e] = x;
                }
                mx0 = fmaxf(mx0, fmaxf(s[t][j][0], s[t][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[t][j][2], s[t][j][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m[t][0], mx0), mn1 = fmaxf(m[t][1], mx1);
            /* A row that has seen only masked keys keeps max -inf; subtract 0 instead (no NaN). */
            const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
            const float al0 = exp2f(m[t][0] - mu0), al1 = exp2f(m[t][1] - mu1);
            m[t][0] = mn0;
            m[t][1] = mn1;
            float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                s[t][j][0] = exp2f(s[t][j][0] - mu0);
                s[t][j][1] = exp2f(s[t][j][1] - mu0);
                s[t][j][2] = exp2f(s[t][j][2] - mu1);
                s[t][j][3] = exp2f(s[t][j][3] - mu1);
                rs0 += s[t][j][0] + s[t][j][1];
                rs1 += s[t][j][2] + s[t][j][3];
            }
            l[t][0] = l[t][0] * al0 + rs0;
            l[t][1] = l[t][1] * al1 + rs1;
#pragma unroll
            for (int j = 0; j < DT; j++) {
                o[t][j][0] *= al0;
                o[t][j][1] *= al0;
                o[t][j][2] *= al1;
                o[t][j][3] *= al1;
            }
        }
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                a[t][0] = lt_pack_bf16(s[t][2 * kc][0], s[t][2 * kc][1]);
                a[t][1] = lt_pack_bf16(s[t][2 * kc][2], s[t][2 * kc][3]);
                a[t][2] = lt_pack_bf16(s[t][2 * kc + 1][0], s[t][2 * kc + 1][1]);
                a[t][3] = lt_pack_bf16(s[t][2 * kc + 1][2], s[t][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t r[4];
                lt_ldsm_x4_t(r, cV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    lt_mma16816(o[t][2 * dp], a[t], r[0], r[1]);
                    lt_mma16816(o[t][2 * dp + 1], a[t], r[2], r[3]);
                }
            }
        }
    }

    __nv_bfloat16 *go = p.o + b * p.o_sb + h * p.o_sh;
    const int c = (lane & 3) * 2;
#pragma unroll
    for (int t = 0; t < MT; t++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float lt = l[t][hr];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const float il = 1.0f / lt;
            const int r = row[t][hr];
            if (r < T) {
                __nv_bfloat16 *dst = go + (int64_t)r * p.o_st;
#pragma unroll
                for (int j = 0; j < DT; j++)
                    *(uint32_t *)(dst + j * 8 + c) = lt_pack_bf16(o[t][j][2 * hr] * il, o[t][j][2 * hr + 1] * il);
                if ((lane & 3) == 0) p.lse[((int64_t)b * p.H + h) * T + r] = (m[t][hr] + log2f(lt)) * LT_ATTN_LN2;
            }
        }
    }
}

template <int D> static lt_status fwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    typedef lt_attn_fwd_mma_shape<D> S;
    constexpr int BM = 16 * S::MT * S::NW, LD = D + 8;
    const size_t smem = (size_t)(BM + 4 * LT_ATTN_FWD_MMA_BN) * LD * sizeof(__nv_bfloat16);
    const dim3 grid((unsigned)((d.T + BM - 1) / BM), (unsigned)d.H, (unsigned)B);
    return lt_attn_launch(ctx, attn_fwd_kernel<D, S::NW, S::MT, S::QREG>, grid, S::NW * 32, smem, stream,
                          "attention forward: shared memory size", "attention forward kernel launch", d);
}

lt_status lt_attn_fwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    switch (D) {
    case 64: return fwd_mma_launch<64>(ctx, d, B, stream);
    case 96: return fwd_mma_launch<96>(ctx, d, B, stream);
    case 256: return fwd_mma_launch<256>(ctx, d, B, stream);
    default: return fwd_mma_launch<128>(ctx, d, B, stream);
    }
}
