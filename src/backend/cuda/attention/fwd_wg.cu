/* The wgmma flash attention forward for Hopper (sm_90a; dev/cuda/README.md), D = 64, 128 or 256
 * (and 96 on the D = 128 kernel, padded):
 * one warpgroup per CTA owns 64 query rows (warp w rows 16w..16w+15), S = Q·Kᵀ and O += P·V on
 * warpgroup MMAs with Q, K and V in shared memory in the 128-byte swizzle (no fragments in
 * registers but P, taken straight from the S accumulator). Tiles of 64 keys, double-buffered with
 * cp.async; two CTAs share an SM, so one's softmax overlaps the other's MMAs (WG2); with one K/V
 * slot three CTAs share an SM (WG1, for rows that see few tiles). At D = 256 (32 KiB tiles, O in 128
 * registers a thread) only WG1 is built, two CTAs an SM, with K and V loaded as separate groups:
 * the next tile's K as soon as S is done, its V as soon as P·V is (1.46-1.50 -> 1.37-1.40 ms at
 * T = 8192, H = 16, Hkv = 8 on an H100, two builds alternated in one call). The same schedule in
 * the D = 64 / 128 one-slot kernel (packed rows) gave 0.120 against 0.122-0.123 ms on the packed
 * row's forward, within the spread between runs, and is not taken. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/attention/wgmma.cuh"

#include <math.h>

/* CTAs an SM holds (the register budget __launch_bounds__ gives each thread follows from it). */
template <int D, int NB> static constexpr int fwd_wg_ctas() { return D == 256 ? 2 : NB == 1 ? 3 : 2; }

#if LT_WGMMA_OK
/* Scores of one 64-key tile in log2 units (softcap first when CAP), keys outside a row's bounds
 * at -inf when MASK, and the rows' maxima. CAP and MASK are template parameters: tested at run
 * time inside the unrolled loop, both were if-converted and paid on every tile. RT tests both at
 * run time (cap > 0, !full) as D = 256 does: at its 255 registers a thread, the compile-time
 * forms spill. */
template <bool CAP, bool MASK, bool RT>
static __device__ __forceinline__ void fwd_wg_scores(float s[32], float mx[2], int k0, bool full, const int row[2],
                                                     const int rlo[2], int lane, float sl2, float scale, float cap,
                                                     float inv_cap) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x;
            if (RT ? cap > 0.0f : CAP) x = cap * tanhf(s[4 * j + e] * scale * inv_cap) * LT_ATTN_LOG2E;
            else x = s[4 * j + e] * sl2;
            if (RT ? !full : MASK) {
                const int key = k0 + 8 * j + 2 * (lane & 3) + (e & 1);
                if (key > row[e >> 1] || key < rlo[e >> 1]) x = -INFINITY;
            }
            s[4 * j + e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
}
#endif

/* DV < D: the head dim DV padded to D (D = 96 on the D = 128 kernel): the tiles' columns DV..D-1
 * are zeroed once and never loaded, so they add nothing to S, and O's columns from DV on are not
 * stored. */
template <int D, int NB, bool CAP, int DV = D>
static __global__ void __launch_bounds__(128, (fwd_wg_ctas<D, NB>())) attn_fwd_wg_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int BM = LT_ATTN_FWD_WG_BM, BN = LT_ATTN_FWD_WG_BN, KS = D / 16, NH = D / 64, TILE = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sK = sQ + TILE, *sV = sK + NB * TILE;

    const int T = p.T;
    /* Heads vary fastest and query blocks run from the last (longest causal rows) down, so every
     * head's long blocks are scheduled before any short one. */
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const lt_attn_qblock blk = lt_attn_qblock_at<BM, BN>(p, qb, b);
    const int32_t *lo = blk.lo;
    const int q0 = blk.q0, kb_begin = blk.kb_begin, kb_end = blk.kb_end, lo_last = blk.lo_last;

    const __nv_bfloat16 *gq = p.q + b * p.q_sb + h * p.q_sh;
    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    /* KV_SPLIT (D = 256, one slot): K and V load as separate groups, each as soon as the last
     * tile's MMAs are done with its slot, so the next K streams in under this tile's softmax and
     * P·V, and the next V under the next S. */
    constexpr bool KV_SPLIT = NB == 1 && D == 256;
    lt_wg_zero_pad<BM, D, 128, DV>(sQ, tid);
#pragma unroll
    for (int i = 0; i < NB; i++) {
        lt_wg_zero_pad<BN, D, 128, DV>(sK + i * TILE, tid);
        lt_wg_zero_pad<BN, D, 128, DV>(sV + i * TILE, tid);
    }
    lt_wg_load_tile<BM, D, 128, DV>(sQ, gq, p.q_st, q0, T, tid);
    lt_wg_load_tile<BN, D, 128, DV>(sK, gk, p.kv_st, kb_begin * BN, T, tid);
    if (KV_SPLIT) lt_cp_async_commit();
    lt_wg_load_tile<BN, D, 128, DV>(sV, gv, p.kv_st, kb_begin * BN, T, tid);
    lt_cp_async_commit();

    int row[2], rlo[2];
    row[0] = q0 + 16 * warp + (lane >> 2);
    row[1] = row[0] + 8;
    rlo[0] = lo[min(row[0], T - 1)];
    rlo[1] = lo[min(row[1], T - 1)];
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LT_ATTN_LOG2E;
    const uint32_t aQ = lt_smem_addr(sQ);
    const uint64_t dQ = lt_wgmma_desc(aQ);

    float o[NH][32];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[n][i] = 0.0f;

    float s[32];
    for (int kb = kb_begin; kb <= kb_end; kb++) {
        const int buf = NB == 2 ? (kb - kb_begin) & 1 : 0;
        const int k0 = kb * BN;
        const uint32_t aV = lt_smem_addr(sV + buf * TILE);
        const uint64_t dV = lt_wgmma_desc(aV);
        if (KV_SPLIT) {
            lt_cp_async_wait<1>(); /* K of this tile (its V may still be in flight) */
            lt_fence_proxy_async();
            __syncthreads();
        } else if (NB == 1) {
            /* One K/V slot (three CTAs per SM): load this tile once every warp is done with the
             * last one. */
            if (kb > kb_begin) {
                __syncthreads();
                lt_wg_load_tile<BN, D, 128, DV>(sK, gk, p.kv_st, k0, T, tid);
                lt_wg_load_tile<BN, D, 128, DV>(sV, gv, p.kv_st, k0, T, tid);
                lt_cp_async_commit();
            }
            lt_cp_async_wait<0>();
            lt_fence_proxy_async();
            __syncthreads();
        } else {
            lt_cp_async_wait<0>();
            lt_fence_proxy_async();
            __syncthreads();
            if (kb < kb_end) {
                lt_wg_load_tile<BN, D, 128, DV>(sK + (buf ^ 1) * TILE, gk, p.kv_st, (kb + 1) * BN, T, tid);
                lt_wg_load_tile<BN, D, 128, DV>(sV + (buf ^ 1) * TILE, gv, p.kv_st, (kb + 1) * BN, T, tid);
                lt_cp_async_commit();
            }
        }
        lt_wgmma_pin(s);
        lt_wgmma_fence();
        lt_wgmma_kmajor<KS, BM, BN>(s, dQ, lt_wgmma_desc(lt_smem_addr(sK + buf * TILE)));
        lt_wgmma_commit();
        lt_wgmma_wait<0>();
        lt_wgmma_pin(s);
        if (KV_SPLIT && kb < kb_end) {
            __syncthreads(); /* every warp's S is done with the K slot */
            lt_wg_load_tile<BN, D, 128, DV>(sK, gk, p.kv_st, k0 + BN, T, tid);
            lt_cp_async_commit();
        }

        const bool full = (k0 + BN - 1 <= q0) && (k0 >= lo_last);
        float mx[2] = {-INFINITY, -INFINITY};
        if (D == 256) fwd_wg_scores<CAP, true, true>(s, mx, k0, full, row, rlo, lane, sl2, scale, cap, inv_cap);
        else if (full) fwd_wg_scores<CAP, false, false>(s, mx, k0, full, row, rlo, lane, sl2, scale, cap, inv_cap);
        else fwd_wg_scores<CAP, true, false>(s, mx, k0, full, row, rlo, lane, sl2, scale, cap, inv_cap);
        uint32_t pa[4][4];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
            const float mn = fmaxf(m[hr], mx[hr]);
            /* A row that has seen only masked keys keeps max -inf; subtract 0 instead (no NaN). */
            const float mu = mn == -INFINITY ? 0.0f : mn;
            const float al = exp2f(m[hr] - mu);
            m[hr] = mn;
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                s[4 * j + 2 * hr] = exp2f(s[4 * j + 2 * hr] - mu);
                s[4 * j + 2 * hr + 1] = exp2f(s[4 * j + 2 * hr + 1] - mu);
                rs += s[4 * j + 2 * hr] + s[4 * j + 2 * hr + 1];
            }
            l[hr] = l[hr] * al + rs;
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    o[n][4 * j + 2 * hr] *= al;
                    o[n][4 * j + 2 * hr + 1] *= al;
                }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            pa[j >> 1][(j & 1) * 2] = lt_pack_bf16(s[4 * j], s[4 * j + 1]);
            pa[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(s[4 * j + 2], s[4 * j + 3]);
        }
        if (KV_SPLIT) {
            if (kb < kb_end) lt_cp_async_wait<1>(); /* this tile's V; the next K may be in flight */
            else lt_cp_async_wait<0>();
            lt_fence_proxy_async();
            __syncthreads();
        }
        lt_wgmma_rs_wait<NH, BN / 16, BN>(o, pa, dV);
        if (KV_SPLIT && kb < kb_end) {
            __syncthreads(); /* every warp's P·V is done with the V slot */
            lt_wg_load_tile<BN, D, 128, DV>(sV, gv, p.kv_st, k0 + BN, T, tid);
            lt_cp_async_commit();
        }
    }

    __nv_bfloat16 *go = p.o + b * p.o_sb + h * p.o_sh;
    const int c = 2 * (lane & 3);
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lt = l[hr];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        const float il = 1.0f / lt;
        const int r = row[hr];
        if (r < T) {
            __nv_bfloat16 *dst = go + (int64_t)r * p.o_st;
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (64 * n + 8 * j < DV)
                        *(uint32_t *)(dst + 64 * n + 8 * j + c) =
                            lt_pack_bf16(o[n][4 * j + 2 * hr] * il, o[n][4 * j + 2 * hr + 1] * il);
            if ((lane & 3) == 0) p.lse[((int64_t)b * p.H + h) * T + r] = (m[hr] + log2f(lt)) * LT_ATTN_LN2;
        }
    }
#else
    (void)p;
    __trap();
#endif
}

template <int D, int NB, int DV = D>
static lt_status fwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream) {
    const size_t smem = (size_t)(1 + 2 * NB) * 64 * D * 2 + 1024;
    const dim3 grid((unsigned)d.H, (unsigned)((d.T + LT_ATTN_FWD_WG_BM - 1) / LT_ATTN_FWD_WG_BM), (unsigned)B);
    return lt_attn_launch(ctx,
                          d.softcap > 0.0f ? attn_fwd_wg_kernel<D, NB, true, DV> : attn_fwd_wg_kernel<D, NB, false, DV>,
                          grid, 128, smem, stream, "attention forward: shared memory size",
                          "attention forward kernel launch", d);
}

lt_status lt_attn_fwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int slots, cudaStream_t stream) {
    if (D == 64) return slots == 1 ? fwd_wg_launch<64, 1>(ctx, d, B, stream) : fwd_wg_launch<64, 2>(ctx, d, B, stream);
    if (D == 256) return fwd_wg_launch<256, 1>(ctx, d, B, stream); /* WG1 only (tuning.h) */
    if (D == 96) /* the D = 128 kernels with columns 96..127 zero (tuning.h: LT_ATTN_WG_PADDED_HEAD_DIM) */
        return slots == 1 ? fwd_wg_launch<128, 1, 96>(ctx, d, B, stream) : fwd_wg_launch<128, 2, 96>(ctx, d, B, stream);
    return slots == 1 ? fwd_wg_launch<128, 1>(ctx, d, B, stream) : fwd_wg_launch<128, 2>(ctx, d, B, stream);
}
