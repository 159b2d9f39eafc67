/* The wgmma flash attention backward for D = 256 (Gemma 2 and 3) on Hopper (sm_90a).
 *
 * One CTA owns 64 keys of one kv head and walks every query head of its group and every 64-query
 * tile that sees those keys, as the D = 128 main kernel (bwd_wg.cu) does. That kernel gives each
 * warpgroup 64 keys and keeps its dK and dV (64 x D fp32) in registers: at D = 256 that is 256
 * registers a thread for the accumulators alone. Here the two warpgroups split the work along D
 * instead:
 *   1. warpgroup 0 computes Sᵀ = K·Qᵀ and warpgroup 1 dPᵀ = V·dOᵀ (64 keys x 64 queries each, over
 *      all 256 columns), at the same time;
 *   2. each warpgroup hands the other half of its tile through shared memory (fp32, each thread's
 *      accumulator registers at its own index: the two warpgroups' accumulators have the same
 *      layout), and forms Pᵀ and dSᵀ = Pᵀ∘(dPᵀ − delta) for its half of the queries (warpgroup 0
 *      the first 32, warpgroup 1 the last 32), writing both to shared memory in bf16;
 *   3. warpgroup g accumulates columns 128g..128g+127 of dV += Pᵀ·dO and dK += dSᵀ·Q (both operands
 *      from shared memory) and, with DQ, computes the same columns of dQ = dS·K, which it adds to
 *      the fp32 dQ buffer with 2-wide vector atomics, 64 columns at a time. Without DQ the dQ
 *      kernel of bwd_wg.cu (at D = 256) computes dQ on its own, with no atomics.
 * A thread holds 64 fp32 of dK and 64 of dV. Shared memory: K, V (32 KiB each), Q and dO double
 * buffered (128 KiB), the hand-over (16 KiB), Pᵀ and dSᵀ (8 KiB each), and the step's lse,
 * delta and key bounds: 226.5 KiB of Hopper's 227, one CTA per SM. bwd.cu runs delta (or the dQ
 * kernel, which forms it) before, and with DQ the dQ conversion after it. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/bwd_wg.cuh"
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/attention/wgmma.cuh"

#include <math.h>

#include <type_traits>

#define WG256_D 256
#define WG256_BN 64 /* keys per CTA */
#define WG256_BM 64 /* queries per step */
#define WG256_TILE (64 * WG256_D * 2)
#define WG256_SMEM (6 * WG256_TILE + 64 * 64 * 4 + 2 * 64 * 64 * 2 + 6 * WG256_BM * 4 + 1024)

template <bool CAP, bool DQ> static __global__ void __launch_bounds__(256, 1) attn_bwd_wg256_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int D = WG256_D, BN = WG256_BN, BM = WG256_BM, TILE = WG256_TILE;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sK = smem, *sV = sK + TILE, *sQ = sV + TILE, *sO = sQ + 2 * TILE;
    float *sX = (float *)(sO + 2 * TILE); /* dPᵀ from warpgroup 1: [i][thread] */
    unsigned char *sP = (unsigned char *)(sX + 64 * 64), *sDS = sP + 64 * 64 * 2;
    float *sL = (float *)(sDS + 64 * 64 * 2);
    float *sD = sL + 2 * BM;
    int *sLo = (int *)(sD + 2 * BM);

    const int T = p.T, kb = blockIdx.y, hk = blockIdx.x, b = blockIdx.z;
    const int h_first = hk * p.group;
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), t = tid & 127;
    const int warp = t >> 5, lane = tid & 31;
    const lt_attn_kblock blk = lt_attn_kblock_at<BN, BM, false>(p, kb, b);
    const int32_t *lo = blk.lo;
    const int k0 = blk.k0, klast = blk.klast, qb_begin = blk.qb_begin, nqb = blk.nqb;
    const int steps = nqb * p.group;

    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_load_tile<BN, D, 256>(sK, gk, p.kv_st, k0, T, tid);
    lt_wg_load_tile<BN, D, 256>(sV, gv, p.kv_st, k0, T, tid);
    auto load_step = [&](int step, int buf) {
        lt_attn_bwd_load_step<BM, D, 256>(p, T, b, h_first + step / nqb, (qb_begin + step % nqb) * BM, lo,
                                          sQ + buf * TILE, sO + buf * TILE, sL + buf * BM, sD + buf * BM,
                                          sLo + buf * BM, tid);
    };
    if (steps > 0) load_step(0, 0);
    lt_cp_async_commit();

    float dk[2][32], dv[2][32];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) dk[n][i] = dv[n][i] = 0.0f;
    const float scale = p.scale, cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float sl2 = scale * LT_ATTN_LOG2E;
    const uint64_t dKd = lt_wgmma_desc(lt_smem_addr(sK)), dVd = lt_wgmma_desc(lt_smem_addr(sV));
    const uint64_t dPd = lt_wgmma_desc(lt_smem_addr(sP)), dSd = lt_wgmma_desc(lt_smem_addr(sDS));
    const int krow = 16 * warp + (lane >> 2); /* CTA-local key of accumulator row 0 */

    for (int step = 0; step < steps; step++) {
        const int buf = step & 1;
        const int h = h_first + step / nqb, q0 = (qb_begin + step % nqb) * BM;
        lt_cp_async_wait<0>();
        lt_fence_proxy_async();
        __syncthreads(); /* this step's tiles are in; every MMA of the last step has been waited for */
        if (step + 1 < steps) {
            load_step(step + 1, buf ^ 1);
            lt_cp_async_commit();
        }
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;
        const int *cLo = sLo + buf * BM;
        if (k0 > q0 + BM - 1 || klast < cLo[0]) continue; /* CTA-uniform: no query of the step sees a key */
        const uint64_t dQd = lt_wgmma_desc(lt_smem_addr(sQ + buf * TILE));
        const uint64_t dOd = lt_wgmma_desc(lt_smem_addr(sO + buf * TILE));

        /* 1. Sᵀ (warpgroup 0) or dPᵀ (warpgroup 1) over the 256 columns. */
        float x[32];
        {
            const uint64_t da = wg == 0 ? dKd : dVd, db = wg == 0 ? dQd : dOd;
            lt_wgmma_pin(x);
            lt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                lt_wgmma_ss<0, 0>(x, lt_wgmma_desc_at32(da, (kk >> 2) * (BN * 128) + (kk & 3) * 32),
                                  lt_wgmma_desc_at32(db, (kk >> 2) * (BM * 128) + (kk & 3) * 32), kk > 0);
            lt_wgmma_commit();
            lt_wgmma_wait<0>();
            lt_wgmma_pin(x);
        }
        /* Each warpgroup hands the other the half of its tile the other forms: warpgroup 0 its
         * Sᵀ of query columns 32..63 (accumulators 16..31), warpgroup 1 its dPᵀ of columns 0..31
         * (accumulators 0..15), each at its own thread's index (the layouts match). */
        if (wg == 0) {
#pragma unroll
            for (int i = 16; i < 32; i++) sX[i * 128 + t] = x[i];
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) sX[i * 128 + t] = x[i];
        }
        __syncthreads();

        /* 2. Pᵀ and dSᵀ into shared memory (bf16, swizzled), four elements at a time: warpgroup 0
         * query columns 0..31 (Sᵀ in registers, dPᵀ from the hand-over), warpgroup 1 columns
         * 32..63 (Sᵀ from the hand-over, dPᵀ in registers). HALF and MASK are compile-time, so
         * the accumulator indices stay constant. */
        {
            const bool full = (k0 + BN - 1 <= q0) && (q0 + BM - 1 < T) && (k0 >= cLo[BM - 1]);
            auto form = [&](auto mask, auto half) {
                constexpr bool MASK = decltype(mask)::value;
                constexpr int HALF = decltype(half)::value;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * HALF + jj;
                    const int qc = 8 * j + 2 * (lane & 3);
                    const float2 L = *(const float2 *)(cL + qc), Dl = *(const float2 *)(cD + qc);
                    int2 LO = make_int2(0, 0);
                    if (MASK) LO = *(const int2 *)(cLo + qc);
                    float pr[4], ds[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + krow + 8 * (e >> 1), q = q0 + qc + (e & 1);
                        const float lse = (e & 1) ? L.y : L.x, del = (e & 1) ? Dl.y : Dl.x;
                        const float sv = HALF == 0 ? x[4 * j + e] : sX[(4 * j + e) * 128 + t];
                        const float dp = HALF == 0 ? sX[(4 * j + e) * 128 + t] : x[4 * j + e];
                        float dfac = 1.0f;
                        if (CAP) {
                            const float th = tanhf(sv * scale * inv_cap);
                            dfac = 1.0f - th * th;
                            pr[e] = exp2f((cap * th) * LT_ATTN_LOG2E - lse * LT_ATTN_LOG2E);
                        } else {
                            pr[e] = exp2f(fmaf(sv, sl2, -lse * LT_ATTN_LOG2E));
                        }
                        if (MASK && (key > q || key < ((e & 1) ? LO.y : LO.x) || q >= T)) pr[e] = 0.0f;
                        ds[e] = CAP ? pr[e] * (dp - del) * dfac : pr[e] * (dp - del);
                    }
                    *(uint32_t *)(sP + lt_sw128_offset(krow, qc, 64)) = lt_pack_bf16(pr[0], pr[1]);
                    *(uint32_t *)(sP + lt_sw128_offset(krow + 8, qc, 64)) = lt_pack_bf16(pr[2], pr[3]);
                    *(uint32_t *)(sDS + lt_sw128_offset(krow, qc, 64)) = lt_pack_bf16(ds[0], ds[1]);
                    *(uint32_t *)(sDS + lt_sw128_offset(krow + 8, qc, 64)) = lt_pack_bf16(ds[2], ds[3]);
                }
            };
            using lo_half = std::integral_constant<int, 0>;
            using hi_half = std::integral_constant<int, 1>;
            if (wg == 0) {
                if (full) form(std::false_type{}, lo_half{});
                else form(std::true_type{}, lo_half{});
            } else {
                if (full) form(std::false_type{}, hi_half{});
                else form(std::true_type{}, hi_half{});
            }
        }
        lt_fence_proxy_async();
        __syncthreads();

        /* 3. Columns 128g..128g+127: dV += Pᵀ·dO, dK += dSᵀ·Q (queries as K, MN-major), then dQ
         * (DQ) or a wait for those MMAs: the next step rewrites Pᵀ, dSᵀ and this step's Q/dO slot. */
#pragma unroll
        for (int n = 0; n < 2; n++) {
            lt_wgmma_pin(dv[n]);
            lt_wgmma_pin(dk[n]);
        }
        lt_wgmma_fence();
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const int nb = 2 * wg + n;
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                lt_wgmma_ss<0, 1>(dv[n], lt_wgmma_desc_at32(dPd, kk * 32),
                                  lt_wgmma_desc_at32(dOd, nb * (BM * 128) + kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                lt_wgmma_ss<0, 1>(dk[n], lt_wgmma_desc_at32(dSd, kk * 32),
                                  lt_wgmma_desc_at32(dQd, nb * (BM * 128) + kk * 2048), 1);
        }
        lt_wgmma_commit();
        if (!DQ) lt_wgmma_wait<0>();
        const int r0 = q0 + 16 * warp + (lane >> 2), r1 = r0 + 8;
#pragma unroll
        for (int n = 0; n < (DQ ? 2 : 0); n++) {
            const int nb = 2 * wg + n;
            float acc[32];
            lt_wgmma_pin(acc);
            lt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                lt_wgmma_ss<1, 1>(acc, lt_wgmma_desc_at32(dSd, kk * 2048),
                                  lt_wgmma_desc_at32(dKd, nb * (BN * 128) + kk * 2048), kk > 0);
            lt_wgmma_commit();
            lt_wgmma_wait<0>();
            lt_wgmma_pin(acc);
            const int c = 64 * nb + 2 * (lane & 3);
            float *g0 = p.dq_acc + (((int64_t)b * T + r0) * p.H + h) * D + c;
            float *g1 = g0 + (int64_t)8 * p.H * D;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (r0 < T) atomicAdd((float2 *)(g0 + 8 * j), make_float2(acc[4 * j], acc[4 * j + 1]));
                if (r1 < T) atomicAdd((float2 *)(g1 + 8 * j), make_float2(acc[4 * j + 2], acc[4 * j + 3]));
            }
        }
#pragma unroll
        for (int n = 0; n < 2; n++) {
            lt_wgmma_pin(dv[n]);
            lt_wgmma_pin(dk[n]);
        }
    }
    lt_wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < 2; n++) {
        lt_wgmma_pin(dv[n]);
        lt_wgmma_pin(dk[n]);
    }

    /* dK (times the softmax scale) and dV of this thread's two keys, columns of its half. */
    __nv_bfloat16 *gdk = p.dk + b * p.kv_sb + hk * p.kv_sh;
    __nv_bfloat16 *gdv = p.dv + b * p.kv_sb + hk * p.kv_sh;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int key = k0 + krow + 8 * hr;
        if (key >= T) continue;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = 64 * (2 * wg + n) + 8 * j + 2 * (lane & 3);
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

/* Grid (kv heads, key blocks of 64, B); d.delta filled before, and d.dq_acc zeroed unless dQ has
 * its own kernel (d.no_dq). */
lt_status lt_attn_bwd_wg256_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    const dim3 grid((unsigned)d.Hkv, (unsigned)((d.T + WG256_BN - 1) / WG256_BN), (unsigned)B);
    const bool cap = d.softcap > 0.0f;
    auto *k = d.no_dq ? (cap ? attn_bwd_wg256_kernel<true, false> : attn_bwd_wg256_kernel<false, false>)
                      : (cap ? attn_bwd_wg256_kernel<true, true> : attn_bwd_wg256_kernel<false, true>);
    return lt_attn_launch(ctx, k, grid, 256, (size_t)WG256_SMEM, stream,
                          "attention backward (D = 256): shared memory size",
                          "attention backward (D = 256) kernel launch", d);
}
