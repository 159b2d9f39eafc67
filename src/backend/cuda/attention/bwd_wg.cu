/* The wgmma flash attention backward for Hopper (sm_90a): the main kernel (D = 64 or 128; 96 padded
 * to 128) and the dQ kernel (the same; D = 256 has its own, bwd_dq256.cu); bwd.cu sequences them
 * with delta and the conversions of fp32 sums.
 *
 * The main kernel (dev/cuda/README.md) does the mma.sync kernel's CTA work (128 keys of one kv
 * head, every query head of its group, 64 queries per step) on warpgroup MMAs. Two warpgroups of 4
 * warps; warpgroup g owns keys 64g..64g+63 for Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q,
 * and columns 64g..64g+63 of dQ = dS·K. K, V, Q, dO stay in shared memory in the 128-byte swizzle
 * (wgmma reads them there, so no fragment lives in registers); Pᵀ and dSᵀ go from the score
 * accumulators straight into A fragments in registers; dSᵀ also goes to shared memory once for dQ.
 * dQ is added to the fp32 buffer with 2-wide vector atomics. D = 64 or 128. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/bwd_dq.cuh"
#include "backend/cuda/attention/bwd_wg.cuh"
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/attention/wgmma.cuh"

#include <math.h>

#include <type_traits>

/* DV < D: the head dim DV padded to D (D = 96 on the D = 128 kernel): the K, V, Q and dO tiles'
 * columns DV..D-1 are zeroed once and never loaded; dQ, dK and dV from column DV on are neither
 * added nor stored, and the fp32 sums are laid out DV wide. */
template <int D, bool NODQ, int NWG, bool CAP, int DV = D>
static __global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 2 : 1) attn_bwd_wg_kernel(lt_attn_dev p) {
    /* NWG = 1 (64 keys, two CTAs per SM) has no dQ part: its dS·K would need both column halves
     * of K in one warpgroup. */
    static_assert(NWG == 2 || NODQ, "one warpgroup per CTA only without dQ");
#if LT_WGMMA_OK
    constexpr int BN = 64 * NWG, BM = LT_ATTN_BWD_WG_BM, KS = D / 16, NH = D / 64, NT = 128 * NWG;
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
    /* The warpgroup index through a shuffle: the compiler then knows it is warp-uniform. */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), warp = (tid >> 5) & 3, lane = tid & 31;
    const lt_attn_kblock blk = lt_attn_kblock_at<BN, BM, false>(p, kb, b);
    const int32_t *lo = blk.lo;
    const int k0 = blk.k0, klast = blk.klast, qb_begin = blk.qb_begin, nqb = blk.nqb;
    const int steps = nqb * heads;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_zero_pad<BN, D, NT, DV>(sK, tid);
    lt_wg_zero_pad<BN, D, NT, DV>(sV, tid);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lt_wg_zero_pad<BM, D, NT, DV>(sQ + i * TILE_Q, tid);
        lt_wg_zero_pad<BM, D, NT, DV>(sO + i * TILE_Q, tid);
    }
    lt_wg_load_tile<BN, D, NT, DV>(sK, gk, p.kv_st, k0, T, tid);
    lt_wg_load_tile<BN, D, NT, DV>(sV, gv, p.kv_st, k0, T, tid);
    auto load_step = [&](int step, int buf) {
        lt_attn_bwd_load_step<BM, D, NT, DV>(p, T, b, h_first + step / nqb, (qb_begin + step % nqb) * BM, lo,
                                             sQ + buf * TILE_Q, sO + buf * TILE_Q, sL + buf * BM, sD + buf * BM,
                                             sLo + buf * BM, tid);
    };
    if (steps > 0) load_step(0, 0);
    lt_cp_async_commit();

    float dk[NH][32], dv[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dk[n][i] = dv[n][i] = 0.0f;
    const float scale = p.scale, cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float sl2 = scale * LT_ATTN_LOG2E;
    const uint32_t aK = lt_smem_addr(sK), aV = lt_smem_addr(sV), aDS = lt_smem_addr(sDS);
    const int kw0 = k0 + 64 * wg;                       /* this warpgroup's first key */
    const int krow = 64 * wg + 16 * warp + (lane >> 2); /* CTA-local key of accumulator row 0 */

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
            lt_attn_bwd_issue_sdp<KS, BN, BM>(s, dp, aK, aV, aQ, aO, wg);
            /* P from S while dPᵀ is still being computed (softcap needs both at once: wait). */
            const bool full = (kw0 + 63 <= q0) && (q0 + BM - 1 < T) && (kw0 >= cLo[BM - 1]);
            if (CAP && cap > 0.0f) { /* the run-time test kept: without it D = 128 with dQ spilled 12 bytes */
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
                        float pr = exp2f((cap * th) * LT_ATTN_LOG2E - ((e & 1) ? L.y : L.x) * LT_ATTN_LOG2E);
                        if (!full && (key > q || key < ((e & 1) ? LO.y : LO.x) || q >= T)) pr = 0.0f;
                        /* dS here; the loop below then takes dp as it is. */
                        dp[4 * j + e] = pr * (dp[4 * j + e] - ((e & 1) ? Dl.y : Dl.x)) * (1.0f - th * th);
                        s[4 * j + e] = pr;
                    }
                }
            } else {
                lt_wgmma_wait<1>();
                lt_wgmma_pin(s);
                /* The bounds only on steps some query sees in part (compile-time MASK: tested at
                 * run time inside the unrolled loop, the test was if-converted onto every step). */
                auto form_p = [&](auto mask) {
                    constexpr bool MASK = decltype(mask)::value;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int qc = 8 * j + 2 * (lane & 3);
                        const float2 L = *(const float2 *)(cL + qc);
                        int2 LO = make_int2(0, 0);
                        if (MASK) LO = *(const int2 *)(cLo + qc);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = k0 + krow + 8 * (e >> 1), q = q0 + qc + (e & 1);
                            float pr = exp2f(fmaf(s[4 * j + e], sl2, -((e & 1) ? L.y : L.x) * LT_ATTN_LOG2E));
                            if (MASK && (key > q || key < ((e & 1) ? LO.y : LO.x) || q >= T)) pr = 0.0f;
                            s[4 * j + e] = pr;
                        }
                    }
                };
                if (full) form_p(std::false_type{});
                else form_p(std::true_type{});
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
            lt_attn_bwd_pack_p(pa, s);
            lt_attn_bwd_store_ds<BN>(da, dp, sDS, krow, lane);
            /* dV += Pᵀ·dO, dK += dSᵀ·Q: A from registers, B = the query tiles read MN-major. */
            const uint64_t dOb = lt_wgmma_desc(aO), dQb = lt_wgmma_desc(aQ);
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
                    lt_wgmma_rs<1>(dv[n], pa[kk], lt_wgmma_desc_at32(dOb, n * (BM * 128) + kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_wgmma_rs<1>(dk[n], da[kk], lt_wgmma_desc_at32(dQb, n * (BM * 128) + kk * 2048), 1);
            lt_wgmma_commit();
        } else if (!NODQ) {
            lt_attn_bwd_zero_ds<BN>(sDS, krow, lane);
        }
        /* dSᵀ complete for dQ. Without dQ here the barrier is kept too: dropping it let the
         * compiler stretch register lifetimes across steps and spill (ptxas, 88 bytes). */
        lt_fence_proxy_async();
        __syncthreads();

        /* dQ = dS·K over the CTA's 128 keys. D = 128: warpgroup g computes columns 64g..64g+63;
         * D = 64: warpgroup 0 alone (half the atomics of a split over keys). */
        const bool dq_skip = (k0 > q0 + BM - 1 || klast < cLo[0]) || (D == 64 && wg == 1) || NODQ;
        if (!dq_skip) {
            float acc[32];
            lt_attn_bwd_issue_dq<D, BN>(acc, aDS, aK, wg);
            lt_wgmma_wait<0>();
            lt_wgmma_pin(acc);
            /* 8-byte vector atomics: 16-byte red.global.add.v4.f32 after a lane-pair exchange
             * measured slower (4.40 against 4.31 ms at 8k; dev/cuda/README.md). */
            const int r0 = q0 + 16 * warp + (lane >> 2), r1 = r0 + 8;
            const int c0 = D == 128 ? 64 * wg : 0, c = c0 + 2 * (lane & 3);
            float *g0 = p.dq_acc + (((int64_t)b * T + r0) * p.H + h) * DV + c;
            float *g1 = g0 + (int64_t)8 * p.H * DV;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (DV < D && c0 + 8 * j >= DV) break; /* warpgroup-uniform */
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
        const int64_t plane = (int64_t)gridDim.z * T * p.Hkv * DV;
        float *ak = p.dkv_acc + (((int64_t)b * T) * p.Hkv + hk) * DV, *av = ak + plane;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int key = k0 + krow + 8 * hr;
            if (key >= T) continue;
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (64 * n + 8 * j >= DV) continue;
                    const int64_t o = (int64_t)key * p.Hkv * DV + 64 * n + 8 * j + 2 * (lane & 3);
                    atomicAdd((float2 *)(ak + o), make_float2(dk[n][4 * j + 2 * hr], dk[n][4 * j + 2 * hr + 1]));
                    atomicAdd((float2 *)(av + o), make_float2(dv[n][4 * j + 2 * hr], dv[n][4 * j + 2 * hr + 1]));
                }
        }
        return;
    }
    lt_attn_bwd_store_dkv<NH, DV>(p, dk, dv, b, hk, k0, krow, lane, scale);
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
 * its dQ part. It costs two extra MMAs per tile, which pays at D = 64 and 128 only when tiles are
 * few. D = 256 runs the two-warpgroup kernel of bwd_dq256.cu instead, on every row. */
template <int D, bool DELTA, bool CAP, int DV = D>
static __global__ void __launch_bounds__(128, 2) attn_bwd_dq_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int BM = LT_ATTN_BWD_DQ_BM, BN = LT_ATTN_BWD_DQ_BN, KS = D / 16, NH = D / 64, TILE = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sO = sQ + TILE, *sK = sO + TILE, *sV = sK + 2 * TILE;

    const int T = p.T;
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const lt_attn_qblock blk = lt_attn_qblock_at<BM, BN>(p, qb, b);
    const int32_t *lo = blk.lo;
    const int q0 = blk.q0, kb_begin = blk.kb_begin, kb_end = blk.kb_end, lo_last = blk.lo_last;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_zero_pad<BM, D, 128, DV>(sQ, tid);
    lt_wg_zero_pad<BM, D, 128, DV>(sO, tid);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lt_wg_zero_pad<BN, D, 128, DV>(sK + i * TILE, tid);
        lt_wg_zero_pad<BN, D, 128, DV>(sV + i * TILE, tid);
    }
    lt_wg_load_tile<BM, D, 128, DV>(sQ, p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, tid);
    lt_wg_load_tile<BM, D, 128, DV>(sO, p.dout + b * p.o_sb + h * p.o_sh, p.o_st, q0, T, tid);
    lt_wg_load_tile<BN, D, 128, DV>(sK, gk, p.kv_st, kb_begin * BN, T, tid);
    lt_wg_load_tile<BN, D, 128, DV>(sV, gv, p.kv_st, kb_begin * BN, T, tid);
    lt_cp_async_commit();

    const lt_attn_dq_rows rows = lt_attn_dq_rows_at<DELTA, DV>(p, b, h, q0, lo, warp, lane);
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LT_ATTN_LOG2E;
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
            lt_wg_load_tile<BN, D, 128, DV>(sK + (buf ^ 1) * TILE, gk, p.kv_st, (kb + 1) * BN, T, tid);
            lt_wg_load_tile<BN, D, 128, DV>(sV + (buf ^ 1) * TILE, gv, p.kv_st, (kb + 1) * BN, T, tid);
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
        if (full) lt_attn_dq_form_ds<false, CAP>(s, dp, rows, k0, lane, scale, cap, inv_cap, sl2, da);
        else lt_attn_dq_form_ds<true, CAP>(s, dp, rows, k0, lane, scale, cap, inv_cap, sl2, da);
        lt_wgmma_rs_wait<NH, BN / 16, BN>(dq, da, dK);
    }

    lt_attn_dq_store<NH, DV>(p, b, h, rows, lane, scale, dq);
#else
    (void)p;
    __trap();
#endif
}

template <int D, bool DELTA, int DV = D>
static lt_status bwd_dq_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    const size_t smem = (size_t)6 * 64 * D * 2 + 1024;
    const dim3 grid((unsigned)d.H, (unsigned)((d.T + LT_ATTN_BWD_DQ_BM - 1) / LT_ATTN_BWD_DQ_BM), (unsigned)B);
    return lt_attn_launch(ctx,
                          d.softcap > 0.0f ? attn_bwd_dq_kernel<D, DELTA, true, DV>
                                           : attn_bwd_dq_kernel<D, DELTA, false, DV>,
                          grid, 128, smem, stream, "attention backward: shared memory size",
                          "attention backward: dq kernel launch", d);
}

/* The dQ-only kernel of sparse rows (attn_bwd_dq_kernel): grid (H, query blocks, B). */
lt_status lt_attn_bwd_dq_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int delta, cudaStream_t stream) {
    if (D == 64)
        return delta ? bwd_dq_launch<64, true>(ctx, d, B, stream) : bwd_dq_launch<64, false>(ctx, d, B, stream);
    if (D == 256) return lt_attn_bwd_dq256_launch(ctx, d, B, delta, stream); /* bwd_dq256.cu */
    if (D == 96) /* the D = 128 kernel with columns 96..127 zero */
        return delta ? bwd_dq_launch<128, true, 96>(ctx, d, B, stream)
                     : bwd_dq_launch<128, false, 96>(ctx, d, B, stream);
    return delta ? bwd_dq_launch<128, true>(ctx, d, B, stream) : bwd_dq_launch<128, false>(ctx, d, B, stream);
}

template <int D, bool NODQ, int NWG, int DV = D>
static lt_status bwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    constexpr int BN = 64 * NWG, BM = LT_ATTN_BWD_WG_BM;
    const size_t smem = (size_t)(2 * BN + 4 * BM) * D * 2 + (size_t)BN * BM * 2 + 6 * BM * 4 + 1024;
    const dim3 grid((unsigned)(d.Hkv * d.nsplit), (unsigned)((d.T + BN - 1) / BN), (unsigned)B);
    return lt_attn_launch(ctx,
                          d.softcap > 0.0f ? attn_bwd_wg_kernel<D, NODQ, NWG, true, DV>
                                           : attn_bwd_wg_kernel<D, NODQ, NWG, false, DV>,
                          grid, 128 * NWG, smem, stream, "attention backward: shared memory size",
                          "attention backward kernel launch", d);
}

lt_status lt_attn_bwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int bn, cudaStream_t stream) {
    if (D == 256) return lt_attn_bwd_wg256_launch(ctx, d, B, stream);
    if (D == 64)
        return !d.no_dq ? bwd_wg_launch<64, false, 2>(ctx, d, B, stream)
            : bn == 64  ? bwd_wg_launch<64, true, 1>(ctx, d, B, stream)
                        : bwd_wg_launch<64, true, 2>(ctx, d, B, stream);
    if (D == 96) /* the D = 128 kernel with columns 96..127 zero */
        return !d.no_dq ? bwd_wg_launch<128, false, 2, 96>(ctx, d, B, stream)
            : bn == 64  ? bwd_wg_launch<128, true, 1, 96>(ctx, d, B, stream)
                        : bwd_wg_launch<128, true, 2, 96>(ctx, d, B, stream);
    return !d.no_dq ? bwd_wg_launch<128, false, 2>(ctx, d, B, stream)
        : bn == 64  ? bwd_wg_launch<128, true, 1>(ctx, d, B, stream)
                    : bwd_wg_launch<128, true, 2>(ctx, d, B, stream);
}
