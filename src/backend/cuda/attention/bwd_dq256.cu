/* The dQ kernel of the D = 256 backward on Hopper (sm_90a), run before bwd_wg256.cu's main kernel.
 *
 * dQ = dS·K, where dS = P∘(dP − delta), P = exp(S − lse), S = Q·Kᵀ and dP = dO·Vᵀ are recomputed
 * per tile. One CTA owns 128 query rows of one head, 64 per warpgroup, and walks the 64-key tiles
 * either warpgroup sees; both warpgroups multiply against the same K and V tiles in shared memory.
 * The one-warpgroup dQ kernel of bwd_wg.cu (64 rows a CTA, one CTA an SM at D = 256) read every K
 * and V tile once per 64 rows: 64 KiB of K and V for 6.3 MFLOP, which the L2 could not feed as
 * fast as the tensor cores took it, and its four warps could not hide a tile's loads behind the
 * softmax. Here each tile's 64 KiB serve 128 rows, and eight warps share the SM.
 *
 * Per tile and warpgroup (when the tile holds keys its rows see): S and dP (64 x 64 each, K-major
 * operands, K = 256) on the tensor cores; dS in registers (bounds tested only on tiles some row
 * sees in part); dQ[64 x 256] += dS·K with dS as the register A operand and K read MN-major.
 * Shared memory: Q and dO of the 128 rows (128 KiB), K double buffered and V single (96 KiB):
 * K(i+1) loads from the top of tile i, V(i+1) once both warpgroups' dP of tile i has completed.
 * dQ (128 fp32 registers a thread) is written once in bf16, times the softmax scale. With DELTA
 * each warpgroup first forms delta = rowsum(dO·O) of its rows for the main kernel that follows. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/bwd_dq.cuh"
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/attention/wgmma.cuh"

#define DQ256_D 256
#define DQ256_BM 128 /* query rows per CTA, 64 per warpgroup */
#define DQ256_BN 64  /* keys per tile */
#define DQ256_ROWS (DQ256_BM * DQ256_D * 2)
#define DQ256_KT (DQ256_BN * DQ256_D * 2)
#define DQ256_SMEM (2 * DQ256_ROWS + 3 * DQ256_KT + 1024)

template <bool DELTA, bool CAP> static __global__ void __launch_bounds__(256, 1) attn_bwd_dq256_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int D = DQ256_D, BM = DQ256_BM, BN = DQ256_BN, KS = D / 16, NH = D / 64, KT = DQ256_KT;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sO = sQ + DQ256_ROWS, *sK = sO + DQ256_ROWS, *sV = sK + 2 * KT;

    const int T = p.T;
    const int qb = gridDim.y - 1 - blockIdx.y; /* the longest rows first */
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), t = tid & 127;
    const int warp = t >> 5, lane = tid & 31;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int q0 = qb * BM;

    /* Key tiles of each warpgroup's rows, [tb, te] (empty for rows past T). lo is non-decreasing,
     * so warpgroup 1's range starts and ends no earlier than warpgroup 0's: the CTA walks
     * warpgroup 0's tiles, then those of warpgroup 1 past them, skipping any gap between. */
    int tb[2], te[2];
#pragma unroll
    for (int g = 0; g < 2; g++) {
        const int g0 = q0 + 64 * g, gl = min(g0 + 63, T - 1);
        tb[g] = g0 < T ? lo[g0] / BN : 0;
        te[g] = g0 < T ? gl / BN : -1;
    }
    const int n0 = te[0] - tb[0] + 1, s1 = max(te[0] + 1, tb[1]);
    const int ntiles = n0 + max(te[1] - s1 + 1, 0);
    auto tile_kb = [&](int i) { return i < n0 ? tb[0] + i : s1 + (i - n0); };
    const int wq0 = q0 + 64 * wg, wb = tb[wg], we = te[wg];
    const int wlo_last = lo[min(wq0 + 63, T - 1)];

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_load_tile<BM, D, 256>(sQ, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, tid);
    lt_wg_load_tile<BM, D, 256>(sO, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, T, tid);
    lt_wg_load_tile<BN, D, 256>(sK, gk, p.kv_st, tile_kb(0) * BN, T, tid);
    lt_wg_load_tile<BN, D, 256>(sV, gv, p.kv_st, tile_kb(0) * BN, T, tid);
    lt_cp_async_commit();

    const lt_attn_dq_rows rows = lt_attn_dq_rows_at<DELTA, D>(p, b, h, wq0, lo, warp, lane);
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LT_ATTN_LOG2E;
    /* this warpgroup's 64 rows start 64 rows into each 128-row column block of the Q and dO tiles */
    const uint64_t dQd = lt_wgmma_desc(lt_smem_addr(sQ) + 64 * 128 * wg);
    const uint64_t dOd = lt_wgmma_desc(lt_smem_addr(sO) + 64 * 128 * wg);
    const uint64_t dVd = lt_wgmma_desc(lt_smem_addr(sV));

    float dq[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dq[n][i] = 0.0f;

    for (int i = 0; i < ntiles; i++) {
        const int kb = tile_kb(i), buf = i & 1, k0 = kb * BN;
        lt_cp_async_wait<0>();
        lt_fence_proxy_async();
        __syncthreads(); /* K(i) and V(i) are in; both warpgroups' MMAs of tile i - 1 are done */
        if (i + 1 < ntiles) {
            lt_wg_load_tile<BN, D, 256>(sK + (buf ^ 1) * KT, gk, p.kv_st, tile_kb(i + 1) * BN, T, tid);
            lt_cp_async_commit();
        }
        const bool act = kb >= wb && kb <= we; /* warpgroup-uniform: some row of this warpgroup sees the tile */
        const uint64_t dKd = lt_wgmma_desc(lt_smem_addr(sK + buf * KT));
        float s[32], dp[32];
        if (act) {
            lt_wgmma_pin(s);
            lt_wgmma_pin(dp);
            lt_wgmma_fence();
            lt_wgmma_kmajor<KS, BM, BN>(s, dQd, dKd);
            lt_wgmma_commit();
            lt_wgmma_kmajor<KS, BM, BN>(dp, dOd, dVd);
            lt_wgmma_commit();
            lt_wgmma_wait<0>();
            lt_wgmma_pin(s);
            lt_wgmma_pin(dp);
        }
        __syncthreads(); /* V(i) has been read by both warpgroups */
        if (i + 1 < ntiles) {
            lt_wg_load_tile<BN, D, 256>(sV, gv, p.kv_st, tile_kb(i + 1) * BN, T, tid);
            lt_cp_async_commit();
        }
        if (!act) continue;

        const bool full = (k0 + BN - 1 <= wq0) && (k0 >= wlo_last);
        uint32_t da[4][4];
        if (full) lt_attn_dq_form_ds<false, CAP>(s, dp, rows, k0, lane, scale, cap, inv_cap, sl2, da);
        else lt_attn_dq_form_ds<true, CAP>(s, dp, rows, k0, lane, scale, cap, inv_cap, sl2, da);
        lt_wgmma_rs_wait<NH, BN / 16, BN>(dq, da, dKd);
    }

    lt_attn_dq_store<NH, D>(p, b, h, rows, lane, scale, dq);
#else
    (void)p;
    __trap();
#endif
}

/* Grid (H, query blocks of 128, B); 256 threads, 225 KiB of shared memory. */
lt_status lt_attn_bwd_dq256_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int delta, cudaStream_t stream) {
    const dim3 grid((unsigned)d.H, (unsigned)((d.T + DQ256_BM - 1) / DQ256_BM), (unsigned)B);
    const bool cap = d.softcap > 0.0f;
    auto *k = delta ? (cap ? attn_bwd_dq256_kernel<true, true> : attn_bwd_dq256_kernel<true, false>)
                    : (cap ? attn_bwd_dq256_kernel<false, true> : attn_bwd_dq256_kernel<false, false>);
    return lt_attn_launch(ctx, k, grid, 256, (size_t)DQ256_SMEM, stream,
                          "attention backward (D = 256): dq shared memory size",
                          "attention backward (D = 256): dq kernel launch", d);
}
