/* Warp-specialised flash attention backward for long causal rows on Hopper (sm_90a), D = 64 or
 * 128 (96 padded to 128): one CTA owns 128 keys of one kv head and walks every query head of its
 * group and every 64-query tile that sees those keys. A producer warp streams Q, dO (TMA, 128-byte
 * swizzle), the log-sum-exp and delta rows (bulk copies) into a two-stage shared-memory ring guarded
 * by mbarriers; a second warp adds each step's dQ tile (fp32, shared memory) into the global
 * accumulator with one bulk reduction; two consumer warpgroups (64 keys each, registers raised by
 * setmaxnreg) compute Sᵀ, dPᵀ, dV, dK and dQ with wgmma. Only rows without packing or window,
 * T a multiple of 64, one CTA per kv head (no split; lt_attn_bwd_ws_eligible): bwd.cu keeps the
 * other kernels for everything else. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/bwd_wg.cuh"
#include "backend/cuda/attention/hopper.cuh"
#include "backend/cuda/attention/launch.h"
#include <type_traits>

/* Shared-memory plan (bytes from a 1024-aligned base): K and V (128 keys), two stages of Q and dO
 * (64 queries), two dSᵀ buffers (so one named barrier per step suffices: a warpgroup writes dSᵀ of
 * step s only after both passed step s-1's barrier, which follows their dQ reads of step s-2), one
 * fp32 dQ tile, two stages of lse and delta, then the barriers. */
/* ST stages of Q/dO (tuning.h: LT_ATTN_BWD_WS_STAGES). */
template <int D, int ST> struct ws_plan {
    static constexpr int BN = LT_ATTN_BWD_WS_BN, BM = LT_ATTN_BWD_WS_BM;
    static constexpr int TILE_K = BN * D * 2, TILE_Q = BM * D * 2, TILE_DS = BN * BM * 2, TILE_DQ = BM * D * 4;
    static constexpr int OFF_K = 0, OFF_V = OFF_K + TILE_K, OFF_Q = OFF_V + TILE_K, OFF_O = OFF_Q + ST * TILE_Q;
    static constexpr int OFF_DS = OFF_O + ST * TILE_Q, OFF_DQ = OFF_DS + 2 * TILE_DS, OFF_L = OFF_DQ + TILE_DQ;
    static constexpr int OFF_DL = OFF_L + ST * BM * 4, OFF_BAR = OFF_DL + ST * BM * 4;
    static constexpr int BYTES = OFF_BAR + (3 + 2 * ST) * 8 + 1024; /* + alignment slack */
};

/* The fp32 dQ accumulator of this kernel is kept per 64-query tile of one (b, h) in the order the
 * consumer threads hold it: float4 slot (g·8 + j)·128 + t of the tile is accumulator values
 * 4j..4j+3 of thread t of consumer warpgroup g (columns 64g..), so the shared-memory tile is
 * written without bank conflicts and reduced into global memory by one contiguous bulk add. The
 * tile of (b, h, query block qb) starts at float ((b·H + h)·T + 64·qb)·D. */
template <int D, int DV = D> static __global__ void attn_bwd_ws_convert_dq(lt_attn_dev p, int B) {
    const int64_t slot = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* one float4 each */
    const int64_t n = (int64_t)B * p.H * p.T * D / 4;
    if (slot >= n) return;
    constexpr int PER_TILE = 64 * D / 4;
    const int64_t tile = slot / PER_TILE;
    const int s = (int)(slot % PER_TILE), g = s / 1024, j = (s / 128) % 8, t = s % 128;
    const int w = t >> 5, l = t & 31;
    const int row = 16 * w + (l >> 2), col = 64 * g + 8 * j + 2 * (l & 3);
    const int64_t qb_count = p.T / 64;
    const int qb = (int)(tile % qb_count);
    const int64_t bh = tile / qb_count;
    const int h = (int)(bh % p.H), b = (int)(bh / p.H);
    if (DV < D && col >= DV) return; /* a padded head dim's zero columns */
    const float4 v = *(const float4 *)(p.dq_acc + slot * 4);
    __nv_bfloat16 *dst = p.dq + b * p.dq_sb + (int64_t)(64 * qb + row) * p.dq_st + h * p.dq_sh + col;
    *(uint32_t *)dst = lt_pack_bf16(v.x * p.scale, v.y * p.scale);
    *(uint32_t *)(dst + 8 * p.dq_st) = lt_pack_bf16(v.z * p.scale, v.w * p.scale);
}

#if LT_WGMMA_OK /* the helpers only the sm_90a kernel body uses */
/* acc[n] += A·B[:, 64n..] for the four 16-key fragments of A in registers and B MN-major (64
 * query rows, column block n at n·64·128 bytes): dV += Pᵀ·dO and dK += dSᵀ·Q, issued and
 * committed as one group, not waited for. */
template <int NH>
static __device__ __forceinline__ void ws_issue_rs(float (&acc)[NH][32], uint32_t (&a)[4][4], uint32_t b_addr) {
    const uint64_t db = lt_wgmma_desc(b_addr);
#pragma unroll
    for (int n = 0; n < NH; n++) lt_wgmma_pin(acc[n]);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) lt_wgmma_pin_u(a[kk]);
    lt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int n = 0; n < NH; n++)
            lt_wgmma_rs<1>(acc[n], a[kk], lt_wgmma_desc_at32(db, n * (64 * 128) + kk * 2048), 1);
    lt_wgmma_commit();
}

#endif

/* DV < D: the head dim DV padded to D (D = 96 on the D = 128 kernel): the tensor maps are DV wide,
 * so the TMA unit fills the tiles' columns DV..D-1 with zeros; dK and dV from column DV on are not
 * stored, and the fp32 dQ tiles keep their D-wide layout (attn_bwd_ws_convert_dq skips the rest). */
template <int D, bool CAP, int DV = D>
static __global__ void __launch_bounds__(384, 1)
    attn_bwd_ws_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmO,
                       const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                       const lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int ST = LT_ATTN_BWD_WS_STAGES;
    typedef ws_plan<D, ST> P;
    constexpr int BN = P::BN, BM = P::BM, KS = D / 16, NH = D / 64;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sK = smem + P::OFF_K, *sV = smem + P::OFF_V, *sQ = smem + P::OFF_Q, *sO = smem + P::OFF_O;
    unsigned char *sDS = smem + P::OFF_DS;
    float *sDQ = (float *)(smem + P::OFF_DQ), *sL = (float *)(smem + P::OFF_L), *sDl = (float *)(smem + P::OFF_DL);
    uint64_t *bars = (uint64_t *)(smem + P::OFF_BAR);
    uint64_t *kv_full = bars, *dq_full = bars + 1, *dq_empty = bars + 2, *q_full = bars + 3, *q_empty = bars + 3 + ST;

    const int T = p.T, hk = blockIdx.x, kb = blockIdx.y, b = blockIdx.z;
    /* The warpgroup index through a shuffle: the compiler then knows it is warp-uniform. */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), warp = (tid >> 5) & 3, lane = tid & 31;
    /* Causal rows without packing: every query from k0 on sees some key of the block. */
    const lt_attn_kblock blk = lt_attn_kblock_at<BN, BM, true>(p, kb, b);
    const int k0 = blk.k0, qb_begin = blk.qb_begin, nqb = blk.nqb, steps = nqb * p.group;

    if (tid == 0) {
        lt_mbar_init(kv_full, 1);
        for (int i = 0; i < ST; i++) {
            lt_mbar_init(&q_full[i], 1);
            lt_mbar_init(&q_empty[i], 256);
        }
        lt_mbar_init(dq_full, 256);
        lt_mbar_init(dq_empty, 1);
        lt_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer warpgroup: few registers; warp 0 loads, warp 1 reduces dQ, the rest leave. */
        lt_setmaxnreg_dec<LT_ATTN_BWD_WS_REG_PRODUCER>();
        if (warp == 0 && lane == 0) {
            lt_tma_prefetch_map(&tmQ);
            lt_tma_prefetch_map(&tmO);
            lt_mbar_arrive_expect_tx(kv_full, 2 * P::TILE_K);
#pragma unroll
            for (int c = 0; c < NH; c++) {
                lt_tma_load_4d(sK + c * BN * 128, &tmK, kv_full, 64 * c, k0, hk, b);
                lt_tma_load_4d(sV + c * BN * 128, &tmV, kv_full, 64 * c, k0, hk, b);
            }
            for (int step = 0, st = 0, ph = 0; step < steps; step++) {
                const int h = hk * p.group + step / nqb, q0 = (qb_begin + step % nqb) * BM;
                lt_mbar_wait(&q_empty[st], (uint32_t)ph ^ 1u);
                lt_mbar_arrive_expect_tx(&q_full[st], 2 * P::TILE_Q + 2 * BM * 4);
#pragma unroll
                for (int c = 0; c < NH; c++) {
                    lt_tma_load_4d(sQ + st * P::TILE_Q + c * BM * 128, &tmQ, &q_full[st], 64 * c, q0, h, b);
                    lt_tma_load_4d(sO + st * P::TILE_Q + c * BM * 128, &tmO, &q_full[st], 64 * c, q0, h, b);
                }
                const int64_t r = ((int64_t)b * p.H + h) * T + q0;
                lt_bulk_load(sL + st * BM, p.lse + r, BM * 4, &q_full[st]);
                lt_bulk_load(sDl + st * BM, p.delta + r, BM * 4, &q_full[st]);
                if (++st == ST) st = 0, ph ^= 1;
            }
        } else if (warp == 1 && lane == 0) {
            for (int step = 0; step < steps; step++) {
                const int h = hk * p.group + step / nqb, q0 = (qb_begin + step % nqb) * BM;
                lt_mbar_wait(dq_full, step & 1);
                lt_bulk_reduce_add_f32(p.dq_acc + (((int64_t)b * p.H + h) * T + q0) * D, sDQ, P::TILE_DQ);
                lt_bulk_commit();
                lt_bulk_wait_read0();
                lt_mbar_arrive(dq_empty);
            }
            lt_bulk_wait0();
        }
        return;
    }

    lt_setmaxnreg_inc<LT_ATTN_BWD_WS_REG_CONSUMER>();
    const int g = wg - 1, ct = tid & 127;              /* consumer warpgroup, thread in it */
    const int kw0 = k0 + 64 * g;                       /* this warpgroup's first key */
    const int krow = 64 * g + 16 * warp + (lane >> 2); /* CTA-local key of accumulator row 0 */
    const float scale = p.scale, cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float sl2 = scale * LT_ATTN_LOG2E;
    const uint32_t aK = lt_smem_addr(sK), aV = lt_smem_addr(sV);

    float dk[NH][32], dv[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dk[n][i] = dv[n][i] = 0.0f;
    lt_mbar_wait(kv_full, 0);

    for (int step = 0, st = 0, ph = 0; step < steps; step++) {
        const int q0 = (qb_begin + step % nqb) * BM;
        const uint32_t aQ = lt_smem_addr(sQ + st * P::TILE_Q), aO = lt_smem_addr(sO + st * P::TILE_Q);
        const uint32_t aDS = lt_smem_addr(sDS + (step & 1) * P::TILE_DS);
        unsigned char *cDS = sDS + (step & 1) * P::TILE_DS;
        const float *cL = sL + st * BM, *cD = sDl + st * BM;
        lt_mbar_wait(&q_full[st], (uint32_t)ph);

        const bool skip = kw0 > q0 + BM - 1;
        uint32_t pa[4][4], da[4][4];
        if (!skip) {
            float s[32], dp[32];
            lt_attn_bwd_issue_sdp<KS, BN, BM>(s, dp, aK, aV, aQ, aO, g);
            const bool full = kw0 + 63 <= q0;
            /* S and dPᵀ at once (softcap's dS takes tanh' of the score), P and dS, then dV and dK as
             * two groups (tuning.h: issuing dV before dPᵀ is waited for measured slower). */
            lt_wgmma_wait<0>();
            lt_wgmma_pin(s);
            lt_wgmma_pin(dp);
            /* The causal bound only on the diagonal steps (compile-time MASK: a run-time test in the
             * unrolled loop was if-converted onto every step). */
            auto form_p_ds = [&](auto mask) {
                constexpr bool MASK = decltype(mask)::value;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int qc = 8 * j + 2 * (lane & 3);
                    const float2 L = *(const float2 *)(cL + qc), Dl = *(const float2 *)(cD + qc);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + krow + 8 * (e >> 1), q = q0 + qc + (e & 1);
                        float pr, dfac = 1.0f;
                        if (CAP) {
                            const float th = tanhf(s[4 * j + e] * scale * inv_cap);
                            dfac = 1.0f - th * th;
                            pr = exp2f((cap * th) * LT_ATTN_LOG2E - ((e & 1) ? L.y : L.x) * LT_ATTN_LOG2E);
                        } else {
                            pr = exp2f(fmaf(s[4 * j + e], sl2, -((e & 1) ? L.y : L.x) * LT_ATTN_LOG2E));
                        }
                        if (MASK && key > q) pr = 0.0f;
                        dp[4 * j + e] = CAP ? pr * (dp[4 * j + e] - ((e & 1) ? Dl.y : Dl.x)) * dfac
                                            : pr * (dp[4 * j + e] - ((e & 1) ? Dl.y : Dl.x));
                        s[4 * j + e] = pr;
                    }
                }
            };
            if (full) form_p_ds(std::false_type{});
            else form_p_ds(std::true_type{});
            lt_attn_bwd_pack_p(pa, s);
            lt_attn_bwd_store_ds<BN>(da, dp, cDS, krow, lane);
            ws_issue_rs<NH>(dv, pa, aO);
            ws_issue_rs<NH>(dk, da, aQ);
        } else {
            lt_attn_bwd_zero_ds<BN>(cDS, krow, lane);
        }
        /* dSᵀ of both warpgroups complete for dQ. */
        lt_fence_proxy_async();
        lt_bar_sync(1, 256);

        /* dQ = dS·K over the CTA's 128 keys: D = 128, warpgroup g computes columns 64g..64g+63;
         * D = 64, warpgroup 0 alone. */
        const bool dq_mine = D == 128 || g == 0;
        float acc[32];
        if (dq_mine) lt_attn_bwd_issue_dq<D, BN>(acc, aDS, aK, g);
        lt_wgmma_wait<0>();
        if (dq_mine) lt_wgmma_pin(acc);
        if (!skip)
#pragma unroll
            for (int n = 0; n < NH; n++) {
                lt_wgmma_pin(dv[n]);
                lt_wgmma_pin(dk[n]);
            }
        /* Q, dO, lse and delta of this stage are read: hand the stage back to the producer. */
        lt_mbar_arrive(&q_empty[st]);
        lt_mbar_wait(dq_empty, (step & 1) ^ 1);
        if (dq_mine) {
            float4 *dst = (float4 *)sDQ + (g * 8) * 128 + ct;
#pragma unroll
            for (int j = 0; j < 8; j++)
                dst[j * 128] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        }
        lt_fence_proxy_async();
        lt_mbar_arrive(dq_full);
        if (++st == ST) st = 0, ph ^= 1;
    }

    lt_attn_bwd_store_dkv<NH, DV>(p, dk, dv, b, hk, k0, krow, lane, scale);
#else
    (void)tmQ;
    (void)tmO;
    (void)tmK;
    (void)tmV;
    (void)p;
    __trap();
#endif
}

template <int D, bool CAP, int DV = D>
static lt_status ws_launch_one(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    static const char what[] = "attention backward (ws)";
    constexpr int BN = LT_ATTN_BWD_WS_BN, BM = LT_ATTN_BWD_WS_BM;
    CUtensorMap mq, mo, mk, mv;
    LT_TRY(lt_tma_map_bf16(ctx, what, &mq, d.q, B, d.T, d.H, DV, d.q_sb, d.q_st, d.q_sh, BM));
    LT_TRY(lt_tma_map_bf16(ctx, what, &mo, d.dout, B, d.T, d.H, DV, d.o_sb, d.o_st, d.o_sh, BM));
    LT_TRY(lt_tma_map_bf16(ctx, what, &mk, d.k, B, d.T, d.Hkv, DV, d.kv_sb, d.kv_st, d.kv_sh, BN));
    LT_TRY(lt_tma_map_bf16(ctx, what, &mv, d.v, B, d.T, d.Hkv, DV, d.kv_sb, d.kv_st, d.kv_sh, BN));
    const int smem = ws_plan<D, LT_ATTN_BWD_WS_STAGES>::BYTES;
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_bwd_ws_kernel<D, CAP, DV>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                         "attention backward (ws): shared memory size"));
    dim3 grid((unsigned)d.Hkv, (unsigned)((d.T + BN - 1) / BN), (unsigned)B);
    attn_bwd_ws_kernel<D, CAP, DV><<<grid, 384, (size_t)smem, stream>>>(mq, mo, mk, mv, d);
    LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention backward (ws) kernel launch"));
    const int64_t n4 = (int64_t)B * d.H * d.T * D / 4;
    attn_bwd_ws_convert_dq<D, DV><<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(d, B);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward (ws): dq conversion kernel");
}

/* Softcap is a template parameter (the tanh and its derivative stay out of the common kernel). */
template <int D, int DV = D> static lt_status ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    return d.softcap > 0.0f ? ws_launch_one<D, true, DV>(ctx, d, B, stream)
                            : ws_launch_one<D, false, DV>(ctx, d, B, stream);
}

lt_status lt_attn_bwd_ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    if (D == 64) return ws_launch<64>(ctx, d, B, stream);
    if (D == 96) return ws_launch<128, 96>(ctx, d, B, stream); /* fp32 dQ tiles 128 wide: lt_attn_dq_acc_cols */
    return ws_launch<128>(ctx, d, B, stream);
}
