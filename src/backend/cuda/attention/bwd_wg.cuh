/* The pieces of a wgmma backward step shared by the wgmma main kernel (bwd_wg.cu), the
 * warp-specialised kernel (bwd_ws.cu) and, for the step loader, the D = 256 kernel (bwd_wg256.cu).
 * Both run one CTA per BN keys of one kv head with warpgroup g owning keys 64g..64g+63, K and V in
 * shared memory (BN rows, 128-byte swizzle), and 64-query steps whose Q and dO tiles (64 rows) sit
 * in shared memory too; accumulator row 0 of a thread is CTA-local key krow = 64g + 16·warp +
 * lane/4. sm_90a only (LT_WGMMA_OK). Private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_BWD_WG_CUH
#define LT_ATTN_BWD_WG_CUH

#include "backend/cuda/attention/params.h"
#include "backend/cuda/attention/wgmma.cuh"

/* N bytes from global to shared memory, cp.async (the caller commits). */
template <int N> static __device__ __forceinline__ void lt_attn_cp_async(void *smem, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(lt_smem_addr(smem)), "l"(g), "n"(N));
}

/* One 64-query step of a backward CTA into its slots (the caller commits): the Q and dO tiles of
 * query head h from row q0 of T (128-byte swizzle, NT threads) and, by the first BM threads, the
 * rows' lse, delta and key bounds (lo: the batch row's). */
template <int BM, int D, int NT, int DV = D>
static __device__ __forceinline__ void lt_attn_bwd_load_step(const lt_attn_dev &p, int T, int b, int h, int q0,
                                                             const int32_t *lo, unsigned char *sQ, unsigned char *sO,
                                                             float *sL, float *sD, int *sLo, int tid) {
    lt_wg_load_tile<BM, D, NT, DV>(sQ, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, tid);
    lt_wg_load_tile<BM, D, NT, DV>(sO, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, T, tid);
    if (tid < BM) {
        const int t = min(q0 + tid, T - 1);
        const int64_t r = ((int64_t)b * p.H + h) * T + t;
        lt_attn_cp_async<4>(sL + tid, p.lse + r);
        lt_attn_cp_async<4>(sD + tid, p.delta + r);
        lt_attn_cp_async<4>(sLo + tid, lo + t);
    }
}

/* Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ over this warpgroup's 64 keys, issued as two committed groups (not
 * waited for). aK, aV: the BN-key tiles; aQ, aO: the 64-query tiles (shared addresses). */
template <int KS, int BN, int BM>
static __device__ __forceinline__ void lt_attn_bwd_issue_sdp(float (&s)[32], float (&dp)[32], uint32_t aK, uint32_t aV,
                                                             uint32_t aQ, uint32_t aO, int g) {
    /* One descriptor per tile, moved by constant 32-bit adds per MMA (not rebuilt from the address). */
    const uint64_t dK = lt_wgmma_desc(aK + g * 8192), dQ = lt_wgmma_desc(aQ);
    const uint64_t dV = lt_wgmma_desc(aV + g * 8192), dO = lt_wgmma_desc(aO);
    lt_wgmma_pin(s);
    lt_wgmma_pin(dp);
    lt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
        lt_wgmma_ss<0, 0>(s, lt_wgmma_desc_at32(dK, (kk >> 2) * (BN * 128) + (kk & 3) * 32),
                          lt_wgmma_desc_at32(dQ, (kk >> 2) * (BM * 128) + (kk & 3) * 32), kk > 0);
    lt_wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
        lt_wgmma_ss<0, 0>(dp, lt_wgmma_desc_at32(dV, (kk >> 2) * (BN * 128) + (kk & 3) * 32),
                          lt_wgmma_desc_at32(dO, (kk >> 2) * (BM * 128) + (kk & 3) * 32), kk > 0);
    lt_wgmma_commit();
}

/* Pᵀ (fp32 accumulator layout, keys = rows) to the bf16 A fragments of dV += Pᵀ·dO. */
static __device__ __forceinline__ void lt_attn_bwd_pack_p(uint32_t (&pa)[4][4], const float (&s)[32]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        pa[j >> 1][(j & 1) * 2] = lt_pack_bf16(s[4 * j], s[4 * j + 1]);
        pa[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(s[4 * j + 2], s[4 * j + 3]);
    }
}

/* dSᵀ (fp32 accumulator layout) to bf16 A fragments and into the shared dSᵀ tile (BN keys x 64
 * queries, swizzled) that dQ = dS·K reads. */
template <int BN>
static __device__ __forceinline__ void lt_attn_bwd_store_ds(uint32_t (&da)[4][4], const float (&dp)[32],
                                                            unsigned char *sDS, int krow, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int qc = 8 * j + 2 * (lane & 3);
        da[j >> 1][(j & 1) * 2] = lt_pack_bf16(dp[4 * j], dp[4 * j + 1]);
        da[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(dp[4 * j + 2], dp[4 * j + 3]);
        *(uint32_t *)(sDS + lt_sw128_offset(krow, qc, BN)) = da[j >> 1][(j & 1) * 2];
        *(uint32_t *)(sDS + lt_sw128_offset(krow + 8, qc, BN)) = da[j >> 1][(j & 1) * 2 + 1];
    }
}

/* This thread's rows of the dSᵀ tile set to zero (a warpgroup whose keys the step cannot see). */
template <int BN> static __device__ __forceinline__ void lt_attn_bwd_zero_ds(unsigned char *sDS, int krow, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int qc = 8 * j + 2 * (lane & 3);
        *(uint32_t *)(sDS + lt_sw128_offset(krow, qc, BN)) = 0u;
        *(uint32_t *)(sDS + lt_sw128_offset(krow + 8, qc, BN)) = 0u;
    }
}

/* acc = dS·K for 64 queries over the CTA's BN keys, columns 64g..64g+63 (D = 128) or 0..63
 * (D = 64): both operands MN-major (dSᵀ from shared memory, K), issued and committed. */
template <int D, int BN>
static __device__ __forceinline__ void lt_attn_bwd_issue_dq(float (&acc)[32], uint32_t aDS, uint32_t aK, int g) {
    const uint64_t dS = lt_wgmma_desc(aDS), dK = lt_wgmma_desc(aK + (D == 128 ? g * (BN * 128) : 0));
    lt_wgmma_pin(acc);
    lt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        lt_wgmma_ss<1, 1>(acc, lt_wgmma_desc_at32(dS, kk * 2048), lt_wgmma_desc_at32(dK, kk * 2048), kk > 0);
    lt_wgmma_commit();
}

/* dK (times the softmax scale) and dV of this thread's two keys, bf16, into the caller's tensors;
 * columns from DV on (a padded head dim) are not stored. */
template <int NH, int DV = 64 * NH>
static __device__ __forceinline__ void lt_attn_bwd_store_dkv(const lt_attn_dev &p, const float (&dk)[NH][32],
                                                             const float (&dv)[NH][32], int b, int hk, int k0, int krow,
                                                             int lane, float scale) {
    __nv_bfloat16 *gdk = p.dk + b * p.kv_sb + hk * p.kv_sh;
    __nv_bfloat16 *gdv = p.dv + b * p.kv_sb + hk * p.kv_sh;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int key = k0 + krow + 8 * hr;
        if (key >= p.T) continue;
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (64 * n + 8 * j >= DV) continue;
                const int c = 64 * n + 8 * j + 2 * (lane & 3);
                *(uint32_t *)(gdk + (int64_t)key * p.kv_st + c) =
                    lt_pack_bf16(dk[n][4 * j + 2 * hr] * scale, dk[n][4 * j + 2 * hr + 1] * scale);
                *(uint32_t *)(gdv + (int64_t)key * p.kv_st + c) =
                    lt_pack_bf16(dv[n][4 * j + 2 * hr], dv[n][4 * j + 2 * hr + 1]);
            }
    }
}

#endif
