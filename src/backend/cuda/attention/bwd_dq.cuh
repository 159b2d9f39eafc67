/* The pieces the two wgmma dQ kernels share (bwd_wg.cu's, 64 rows a CTA; bwd_dq256.cu's, 64 rows a
 * warpgroup): each thread's two accumulator rows with their lse, delta and key bound, dS of a
 * 64 x 64 tile as the register A operand of dQ += dS·K, and the store of dQ. A warpgroup owns 64
 * query rows; warp w of it rows 16w..16w+15, a thread rows lane/4 and lane/4 + 8 of those.
 * sm_90a only (LT_WGMMA_OK). Private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_BWD_DQ_CUH
#define LT_ATTN_BWD_DQ_CUH

#include <math.h>

#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/params.h"

/* A thread's two rows of the 64 starting at q0 (query head h, batch row b): the row, its key
 * bound (lo: the batch row's), lse·log2(e) and delta. DELTA: delta = rowsum(dO·O) formed here (the
 * four lanes of an accumulator row each take a quarter of the DV columns, 16-byte loads) and
 * written for the main kernel that runs next; else read. */
struct lt_attn_dq_rows {
    int row[2], rlo[2];
    float L2[2], Dl[2];
};
template <bool DELTA, int DV>
static __device__ __forceinline__ lt_attn_dq_rows lt_attn_dq_rows_at(const lt_attn_dev &p, int b, int h, int q0,
                                                                     const int32_t *lo, int warp, int lane) {
    lt_attn_dq_rows q;
    const int T = p.T;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        q.row[hr] = q0 + 16 * warp + (lane >> 2) + 8 * hr;
        const int t = min(q.row[hr], T - 1);
        q.rlo[hr] = lo[t];
        const int64_t r = ((int64_t)b * p.H + h) * T + t;
        q.L2[hr] = p.lse[r] * LT_ATTN_LOG2E;
        if (DELTA) {
            const __nv_bfloat16 *o = p.o + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
            const __nv_bfloat16 *g = p.dout + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
            float acc = 0.0f;
#pragma unroll
            for (int c = (lane & 3) * (DV / 4); c < (lane & 3) * (DV / 4) + DV / 4; c += 8)
                acc = lt_attn_dot8(acc, o + c, g + c);
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            acc += __shfl_xor_sync(0xffffffffu, acc, 2);
            q.Dl[hr] = acc;
            if ((lane & 3) == 0 && q.row[hr] < T) p.delta[r] = acc;
        } else {
            q.Dl[hr] = p.delta[r];
        }
    }
    return q;
}

/* dS = P∘(dP − delta) of a 64 x 64 tile of keys k0.. from the S and dP accumulators, as the four
 * bf16 A fragments (16 keys each) of dQ += dS·K. P = exp(S·scale − lse), or with a softcap
 * exp(cap·tanh(S·scale/cap) − lse) and dS times its derivative. MASK (compile-time: tested at run
 * time in the unrolled loop, the bounds were paid on every tile): keys past the row or below its
 * bound get P = 0. */
template <bool MASK, bool CAP>
static __device__ __forceinline__ void lt_attn_dq_form_ds(const float (&s)[32], const float (&dp)[32],
                                                          const lt_attn_dq_rows &q, int k0, int lane, float scale,
                                                          float cap, float inv_cap, float sl2, uint32_t (&da)[4][4]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float sv[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int hr = e >> 1, key = k0 + 8 * j + 2 * (lane & 3) + (e & 1);
            float pr, dfac = 1.0f;
            if (CAP) {
                const float th = tanhf(s[4 * j + e] * scale * inv_cap);
                dfac = 1.0f - th * th;
                pr = exp2f((cap * th) * LT_ATTN_LOG2E - q.L2[hr]);
            } else {
                pr = exp2f(fmaf(s[4 * j + e], sl2, -q.L2[hr]));
            }
            if (MASK && (key > q.row[hr] || key < q.rlo[hr])) pr = 0.0f;
            sv[e] = CAP ? pr * (dp[4 * j + e] - q.Dl[hr]) * dfac : pr * (dp[4 * j + e] - q.Dl[hr]);
        }
        da[j >> 1][(j & 1) * 2] = lt_pack_bf16(sv[0], sv[1]);
        da[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(sv[2], sv[3]);
    }
}

/* dQ of the thread's rows (those below T) in bf16 times the softmax scale: NH 64-column blocks of
 * accumulators, columns from DV on not stored. */
template <int NH, int DV>
static __device__ __forceinline__ void lt_attn_dq_store(const lt_attn_dev &p, int b, int h, const lt_attn_dq_rows &q,
                                                        int lane, float scale, const float (&dq)[NH][32]) {
    __nv_bfloat16 *gdq = p.dq + b * p.dq_sb + h * p.dq_sh;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = q.row[hr];
        if (r >= p.T) continue;
        __nv_bfloat16 *dst = gdq + (int64_t)r * p.dq_st;
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (64 * n + 8 * j < DV)
                    *(uint32_t *)(dst + 64 * n + 8 * j + 2 * (lane & 3)) =
                        lt_pack_bf16(dq[n][4 * j + 2 * hr] * scale, dq[n][4 * j + 2 * hr + 1] * scale);
    }
}

#endif
