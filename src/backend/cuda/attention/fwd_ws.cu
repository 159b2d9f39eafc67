/* Warp-specialised flash attention forward for Hopper (sm_90a), D = 64, 128 or 256 (96 padded to
 * 128), for long rows: one producer warp streams K and V tiles of BN keys (128; 64 at D = 256, lt_attn_fwd_ws_bn) into
 * an NS-stage shared-memory ring with TMA and mbarriers, two consumer warpgroups own 64 query rows
 * each (128 per CTA). The consumers take turns issuing their MMAs (ping-pong on named barriers, so
 * one's softmax runs under the other's MMAs) and each overlaps its own softmax of tile n with the
 * P·V of tile n - 1. Causal, window and
 * packed-row bounds arrive as the per-token key bounds of prepare.cu; tiles no row of the CTA can
 * see are never loaded. Short packed sequences and small windows stay with the one-warpgroup
 * kernel of fwd_wg.cu (its 64-row CTAs skip more); lt_attn_fwd_choose decides. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/hopper.cuh"
#include "backend/cuda/attention/launch.h"

#include <math.h>

namespace {

struct ws_maps {
    CUtensorMap q, k, v;
};

#if LT_WGMMA_OK
/* S (64 x BN scores of one consumer, in registers: s[4j + e] is row 16·warp + lane/4 + 8·(e/2),
 * key 8j + 2·(lane%4) + e%2) -> probabilities exp2(s·k - m) with the bounds applied, m the running
 * row max in log2 units (k = scale·log2 e, so scaling and the shift are one FMA; with softcap the
 * capped logits are formed first and k = 1); sets the factor al that rescales the rows' old sums
 * and output, and updates m and l. CAP (softcap) and MASK (a tile some row sees
 * only in part) are template parameters: as runtime tests inside the unrolled element loop the
 * compiler if-converted them, so every tile paid the tanh and the bounds (twice the instructions). */
template <int BN, bool CAP, bool MASK>
static __device__ __forceinline__ void ws_softmax(float s[BN / 2], float m[2], float l[2], float al[2], int k0,
                                                  const int row[2], const int rlo[2], int lane, float sl2, float scale,
                                                  float cap, float inv_cap) {
    const float k = CAP ? 1.0f : sl2;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = s[4 * j + e];
            if (CAP) x = cap * tanhf(x * scale * inv_cap) * LT_ATTN_LOG2E;
            if (MASK) {
                const int key = k0 + 8 * j + 2 * (lane & 3) + (e & 1);
                if (key > row[e >> 1] || key < rlo[e >> 1]) x = -INFINITY;
            }
            s[4 * j + e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float mn = fmaxf(m[hr], mx[hr] * k);
        /* A row that has seen only masked keys keeps max -inf; subtract 0 instead (no NaN). */
        const float mu = mn == -INFINITY ? 0.0f : mn;
        al[hr] = exp2f(m[hr] - mu);
        m[hr] = mn;
        float rs = 0.0f;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            s[4 * j + 2 * hr] = exp2f(fmaf(s[4 * j + 2 * hr], k, -mu));
            s[4 * j + 2 * hr + 1] = exp2f(fmaf(s[4 * j + 2 * hr + 1], k, -mu));
            rs += s[4 * j + 2 * hr] + s[4 * j + 2 * hr + 1];
        }
        l[hr] = l[hr] * al[hr] + rs;
    }
}

/* S += Q·Kᵀ over 16 of D for a tile of BN keys: one m64n128k16 or one m64n64k16, both operands
 * K-major in the 128-byte swizzle. */
template <int BN>
static __device__ __forceinline__ void ws_wgmma_s(float s[BN / 2], uint64_t dq, uint64_t dk, int acc) {
    if constexpr (BN == 128) lt_wgmma_ss_n128(s, dq, dk, acc);
    else lt_wgmma_ss<0, 0>(s, dq, dk, acc);
}

/* The tile's softmax, with the bounds only where some row of this consumer sees part of it. */
template <int BN, bool CAP>
static __device__ __forceinline__ void ws_softmax_tile(float s[BN / 2], float m[2], float l[2], float al[2], int k0,
                                                       bool full, const int row[2], const int rlo[2], int lane,
                                                       float sl2, float scale, float cap, float inv_cap) {
    if (full) ws_softmax<BN, CAP, false>(s, m, l, al, k0, row, rlo, lane, sl2, scale, cap, inv_cap);
    else ws_softmax<BN, CAP, true>(s, m, l, al, k0, row, rlo, lane, sl2, scale, cap, inv_cap);
}

#endif

/* Grid (H, ceil(T / 128), B), 384 threads: warpgroup 0 produces, 1 and 2 consume. DV < D: the head
 * dim DV padded to D (D = 96 on the D = 128 kernel): the tensor maps are DV wide, so the TMA unit
 * fills the boxes' columns DV..D-1 with zeros (they add nothing to S), and O's columns from DV on
 * are not stored. */
template <int D, int NS, bool CAP, int DV = D>
static __global__ void __launch_bounds__(384, 1)
    attn_fwd_ws_kernel(const __grid_constant__ ws_maps maps, const lt_attn_dev p, const int pp) {
#if LT_WGMMA_OK
    constexpr int BM = LT_ATTN_FWD_WS_BM, BN = lt_attn_fwd_ws_bn(D), NH = D / 64, KS = D / 16;
    constexpr int TQ = 64 * D * 2, TKV = BN * D * 2; /* bytes of one consumer's Q tile, one K or V tile */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sK = sQ + 2 * TQ, *sV = sK + NS * TKV;
    uint64_t *bars = (uint64_t *)(sV + NS * TKV);
    uint64_t *barQ = bars, *fullK = bars + 1, *fullV = fullK + NS, *emptyK = fullV + NS, *emptyV = emptyK + NS;

    const int T = p.T;
    const int qb = gridDim.y - 1 - blockIdx.y; /* the longest causal rows first */
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    /* The warpgroup index through a shuffle, so the compiler knows it is warp-uniform and keeps the
     * descriptor arithmetic that depends on it in uniform registers. */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const lt_attn_qblock blk = lt_attn_qblock_at<BM, BN>(p, qb, b);
    const int32_t *lo = blk.lo;
    const int q0 = blk.q0, kb_begin = blk.kb_begin, ntiles = blk.kb_end - kb_begin + 1;

    if (tid == 0) {
        lt_mbar_init(barQ, 1);
        for (int s = 0; s < NS; s++) {
            lt_mbar_init(&fullK[s], 1);
            lt_mbar_init(&fullV[s], 1);
            lt_mbar_init(&emptyK[s], 8); /* lane 0 of each consumer warp */
            lt_mbar_init(&emptyV[s], 8);
        }
        lt_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer: one thread issues every copy; the rest of the warpgroup leaves. */
        lt_setmaxnreg_dec<LT_ATTN_FWD_WS_REG_PRODUCER>();
        if (tid == 0) {
            lt_tma_prefetch_map(&maps.q);
            lt_tma_prefetch_map(&maps.k);
            lt_tma_prefetch_map(&maps.v);
            lt_mbar_arrive_expect_tx(barQ, 2 * TQ);
#pragma unroll
            for (int w = 0; w < 2; w++)
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_tma_load_4d(sQ + w * TQ + n * 64 * 128, &maps.q, barQ, 64 * n, q0 + 64 * w, h, b);
            for (int i = 0; i < ntiles; i++) {
                const int s = i % NS, ph = (i / NS) & 1, k0 = (kb_begin + i) * BN;
                lt_mbar_wait(&emptyK[s], ph ^ 1);
                lt_mbar_arrive_expect_tx(&fullK[s], TKV);
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_tma_load_4d(sK + s * TKV + n * BN * 128, &maps.k, &fullK[s], 64 * n, k0, hk, b);
                lt_mbar_wait(&emptyV[s], ph ^ 1);
                lt_mbar_arrive_expect_tx(&fullV[s], TKV);
#pragma unroll
                for (int n = 0; n < NH; n++)
                    lt_tma_load_4d(sV + s * TKV + n * BN * 128, &maps.v, &fullV[s], 64 * n, k0, hk, b);
            }
        }
        return;
    }

    lt_setmaxnreg_inc<LT_ATTN_FWD_WS_REG_CONSUMER>();
    const int w = wg - 1, ct = tid & 127, warp = ct >> 5, lane = tid & 31;
    const int q0w = q0 + 64 * w;
    int row[2], rlo[2];
    row[0] = q0w + 16 * warp + (lane >> 2);
    row[1] = row[0] + 8;
    rlo[0] = lo[min(row[0], T - 1)];
    rlo[1] = lo[min(row[1], T - 1)];
    const int lo_last = lo[min(q0w + 63, T - 1)];
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LT_ATTN_LOG2E;
    unsigned char *sQw = sQ + w * TQ;
    const uint64_t dQ = lt_wgmma_desc(lt_smem_addr(sQw));
    const uint64_t dK0 = lt_wgmma_desc(lt_smem_addr(sK)), dV0 = lt_wgmma_desc(lt_smem_addr(sV));
    const int bar_mine = 1 + w, bar_other = 2 - w;

    float o[NH][32];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[n][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, al[2];
    float s[BN / 2];
    uint32_t pa[BN / 16][4];

    /* S = Q·K_i^T for tile i, issued and committed (not waited). */
#define WS_ISSUE_S(stage)                                                                                          \
    do {                                                                                                           \
        lt_pin_f<BN / 2>(s);                                                                                       \
        lt_wgmma_fence();                                                                                          \
        _Pragma("unroll") for (int kk = 0; kk < KS; kk++)                                                          \
            ws_wgmma_s<BN>(s, lt_wgmma_desc_at32(dQ, (kk >> 2) * (64 * 128) + (kk & 3) * 32),                      \
                           lt_wgmma_desc_at32(dK0, (stage)*TKV + (kk >> 2) * (BN * 128) + (kk & 3) * 32), kk > 0); \
        lt_wgmma_commit();                                                                                         \
    } while (0)
    /* O += P·V for the tile in `stage`, issued and committed. */
#define WS_ISSUE_PV(stage)                                                                                      \
    do {                                                                                                        \
        _Pragma("unroll") for (int n = 0; n < NH; n++) lt_pin_f<32>(o[n]);                                      \
        lt_pin_u<BN / 4>(&pa[0][0]);                                                                            \
        lt_wgmma_fence();                                                                                       \
        _Pragma("unroll") for (int kk = 0; kk < BN / 16; kk++) _Pragma("unroll") for (int n = 0; n < NH; n++)   \
            lt_wgmma_rs<1>(o[n], pa[kk], lt_wgmma_desc_at32(dV0, (stage)*TKV + n * (BN * 128) + kk * 2048), 1); \
        lt_wgmma_commit();                                                                                      \
    } while (0)
#define WS_PACK_P()                                                                 \
    do {                                                                            \
        _Pragma("unroll") for (int j = 0; j < BN / 8; j++) {                        \
            pa[j >> 1][(j & 1) * 2] = lt_pack_bf16(s[4 * j], s[4 * j + 1]);         \
            pa[j >> 1][(j & 1) * 2 + 1] = lt_pack_bf16(s[4 * j + 2], s[4 * j + 3]); \
        }                                                                           \
    } while (0)

    /* The second consumer lets the first issue first. */
    if (pp && w == 1) lt_bar_arrive(bar_other, 256);
    lt_mbar_wait(barQ, 0);

    /* Tile 0: scores only. */
    lt_mbar_wait(&fullK[0], 0);
    if (pp) lt_bar_sync(bar_mine, 256);
    WS_ISSUE_S(0);
    if (pp) lt_bar_arrive(bar_other, 256);
    lt_wgmma_wait<0>();
    lt_pin_f<BN / 2>(s);
    if (lane == 0) lt_mbar_arrive(&emptyK[0]);
    {
        const int k0 = kb_begin * BN;
        ws_softmax_tile<BN, CAP>(s, m, l, al, k0, (k0 + BN - 1 <= q0w) && (k0 >= lo_last), row, rlo, lane, sl2, scale,
                                 cap, inv_cap);
    }
    WS_PACK_P();

    for (int i = 1; i < ntiles; i++) {
        const int st = i % NS, ph = (i / NS) & 1, sp = (i - 1) % NS, pph = ((i - 1) / NS) & 1;
        lt_mbar_wait(&fullK[st], ph);
        if (pp) lt_bar_sync(bar_mine, 256);
        WS_ISSUE_S(st);
        lt_mbar_wait(&fullV[sp], pph);
        WS_ISSUE_PV(sp);
        if (pp) lt_bar_arrive(bar_other, 256);
        lt_wgmma_wait<1>();
        lt_pin_f<BN / 2>(s);
        if (lane == 0) lt_mbar_arrive(&emptyK[st]);
        const int k0 = (kb_begin + i) * BN;
        ws_softmax_tile<BN, CAP>(s, m, l, al, k0, (k0 + BN - 1 <= q0w) && (k0 >= lo_last), row, rlo, lane, sl2, scale,
                                 cap, inv_cap);
        lt_wgmma_wait<0>();
        /* P's registers are read by the MMA until here: pinning them keeps the next P out of them. */
        lt_pin_u<BN / 4>(&pa[0][0]);
#pragma unroll
        for (int n = 0; n < NH; n++) lt_pin_f<32>(o[n]);
        if (lane == 0) lt_mbar_arrive(&emptyV[sp]);
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                o[n][4 * j] *= al[0];
                o[n][4 * j + 1] *= al[0];
                o[n][4 * j + 2] *= al[1];
                o[n][4 * j + 3] *= al[1];
            }
        WS_PACK_P();
    }
    {
        const int sp = (ntiles - 1) % NS, pph = ((ntiles - 1) / NS) & 1;
        lt_mbar_wait(&fullV[sp], pph);
        if (pp) lt_bar_sync(bar_mine, 256);
        WS_ISSUE_PV(sp);
        /* The first consumer's last turn hands over; the second's would have no taker. */
        if (pp && w == 0) lt_bar_arrive(bar_other, 256);
        lt_wgmma_wait<0>();
        lt_pin_u<BN / 4>(&pa[0][0]);
#pragma unroll
        for (int n = 0; n < NH; n++) lt_pin_f<32>(o[n]);
        if (lane == 0) lt_mbar_arrive(&emptyV[sp]);
    }
#undef WS_ISSUE_S
#undef WS_ISSUE_PV
#undef WS_PACK_P

    /* Epilogue: normalised bf16 output staged in this consumer's Q tile (its last reader, the final
     * S MMA, has completed), then written out in 16-byte row pieces. */
    float il[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lt = l[hr];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        il[hr] = 1.0f / lt;
        const int r = row[hr];
        if (r < T && (lane & 3) == 0) p.lse[((int64_t)b * p.H + h) * T + r] = (m[hr] + log2f(lt)) * LT_ATTN_LN2;
    }
    const int rr = 16 * warp + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++)
                *(uint32_t *)(sQw + lt_sw128_offset(rr + 8 * hr, 64 * n + 8 * j + c, 64)) =
                    lt_pack_bf16(o[n][4 * j + 2 * hr] * il[hr], o[n][4 * j + 2 * hr + 1] * il[hr]);
    lt_bar_sync(3 + w, 128);
    __nv_bfloat16 *go = p.o + b * p.o_sb + h * p.o_sh;
    constexpr int CH = D / 8;
#pragma unroll
    for (int it = 0; it < 64 * CH / 128; it++) {
        const int i = ct + it * 128, r = i / CH, cc = (i % CH) * 8, t = q0w + r;
        if (t < T && (DV == D || cc < DV))
            *(uint4 *)(go + (int64_t)t * p.o_st + cc) = *(const uint4 *)(sQw + lt_sw128_offset(r, cc, 64));
    }
#else
    (void)maps;
    (void)p;
    (void)pp;
    __trap();
#endif
}

template <int D, int NS, bool CAP, int DV = D>
static lt_status ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int ping, cudaStream_t stream) {
    constexpr int BN = lt_attn_fwd_ws_bn(D), TQ = 64 * D * 2, TKV = BN * D * 2;
    const size_t smem = 1024 + 2 * (size_t)TQ + 2 * (size_t)NS * TKV + (1 + 4 * NS) * 8;
    static const char what[] = "attention forward (TMA)";
    ws_maps maps;
    const int64_t T = d.T;
    LT_TRY(lt_tma_map_bf16(ctx, what, &maps.q, d.q, B, T, d.H, DV, d.q_sb, d.q_st, d.q_sh, 64));
    LT_TRY(lt_tma_map_bf16(ctx, what, &maps.k, d.k, B, T, d.Hkv, DV, d.kv_sb, d.kv_st, d.kv_sh, BN));
    LT_TRY(lt_tma_map_bf16(ctx, what, &maps.v, d.v, B, T, d.Hkv, DV, d.kv_sb, d.kv_st, d.kv_sh, BN));
    const dim3 grid((unsigned)d.H, (unsigned)((T + LT_ATTN_FWD_WS_BM - 1) / LT_ATTN_FWD_WS_BM), (unsigned)B);
    return lt_attn_launch(ctx, attn_fwd_ws_kernel<D, NS, CAP, DV>, grid, 384, smem, stream,
                          "attention forward (TMA): shared memory size", "attention forward (TMA) kernel launch", maps,
                          d, ping);
}

/* Softcap is a template parameter of the kernel (ws_softmax). */
template <int D, int NS, int DV = D>
static lt_status ws_launch_cap(lt_ctx *ctx, const lt_attn_dev &d, int B, int ping, cudaStream_t stream) {
    return d.softcap > 0.0f ? ws_launch<D, NS, true, DV>(ctx, d, B, ping, stream)
                            : ws_launch<D, NS, false, DV>(ctx, d, B, ping, stream);
}

} // namespace

lt_status lt_attn_fwd_ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int stages, int pingpong,
                                cudaStream_t stream) {
    if (D == 64)
        return stages == 3 ? ws_launch_cap<64, 3>(ctx, d, B, pingpong, stream)
                           : ws_launch_cap<64, 2>(ctx, d, B, pingpong, stream);
    if (D == 256) return ws_launch_cap<256, 2>(ctx, d, B, pingpong, stream); /* 3 stages exceed shared memory */
    if (D == 96) /* the D = 128 kernel on tensor maps 96 wide: the TMA unit zero-fills columns 96..127 */
        return stages == 3 ? ws_launch_cap<128, 3, 96>(ctx, d, B, pingpong, stream)
                           : ws_launch_cap<128, 2, 96>(ctx, d, B, pingpong, stream);
    return stages == 3 ? ws_launch_cap<128, 3>(ctx, d, B, pingpong, stream)
                       : ws_launch_cap<128, 2>(ctx, d, B, pingpong, stream);
}
