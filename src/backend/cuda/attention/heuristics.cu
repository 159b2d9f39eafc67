/* The variant choices of the CUDA attention kernels (heuristics.h), the override that tests and
 * benchmarks set (tuning.h), and the device properties the choices read. Thresholds and what was
 * measured to set them: tuning.h. */
#include "backend/cuda/attention/heuristics.h"
#include "backend/cuda/attention/hopper.cuh"

#include <cuda_runtime.h>

static lt_attn_cuda_tuning g_force; /* all zero: the heuristics alone */

extern "C" void lt_attn_cuda_tuning_set(const lt_attn_cuda_tuning *t) {
    static const lt_attn_cuda_tuning none = {0, 0, 0, 0, 0, 0, 0};
    g_force = t ? *t : none;
}

extern "C" lt_attn_cuda_tuning lt_attn_cuda_tuning_get(void) { return g_force; }

#define LT_ATTN_MAX_DEVICES 64

const lt_attn_device *lt_attn_cuda_device(void) {
    static lt_attn_device props[LT_ATTN_MAX_DEVICES];
    static int known[LT_ATTN_MAX_DEVICES];
    static lt_attn_device fallback = {LT_ATTN_SM_COUNT_FALLBACK, 0, 0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= LT_ATTN_MAX_DEVICES) {
        (void)cudaGetLastError();
        fallback.tma = lt_tma_encoder() != NULL;
        return &fallback;
    }
    if (!known[dev]) {
        lt_attn_device d = {LT_ATTN_SM_COUNT_FALLBACK, 0, 0};
        int major = 0, minor = 0, sms = 0;
        d.wgmma = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
            minor == 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
            d.sm_count = sms;
        (void)cudaGetLastError();
        d.tma = lt_tma_encoder() != NULL;
        props[dev] = d;
        known[dev] = 1;
    }
    return &props[dev];
}

int lt_attn_sparse(const lt_attention_params *p) {
    return (p->seq_offsets && p->S > 0 && p->T / p->S <= LT_ATTN_SPARSE_MEAN_SEQ) ||
        (p->window > 0 && p->window <= LT_ATTN_SPARSE_WINDOW);
}

lt_attn_fwd_kind lt_attn_fwd_choose(const lt_attention_params *p, const lt_attn_device *dev,
                                    const lt_attn_cuda_tuning *force) {
    lt_attn_fwd_kind want = LT_ATTN_FWD_WG1;
    if (!lt_attn_sparse(p)) {
        const int64_t blocks = p->B * p->H * ((p->T + LT_ATTN_FWD_WS_BM - 1) / LT_ATTN_FWD_WS_BM);
        want = LT_ATTN_FWD_WS_MIN_SM_DEN * blocks >= LT_ATTN_FWD_WS_MIN_SM_NUM * (int64_t)dev->sm_count
            ? LT_ATTN_FWD_WS3
            : LT_ATTN_FWD_WG2;
    }
    if (force && force->fwd > LT_ATTN_FWD_AUTO && force->fwd < LT_ATTN_FWD_KINDS_) want = (lt_attn_fwd_kind)force->fwd;
    if ((want == LT_ATTN_FWD_WS2 || want == LT_ATTN_FWD_WS3) && !dev->tma) want = LT_ATTN_FWD_WG2;
    /* D = 256 has the wgmma forward with one K/V slot and the TMA forward with two stages only
     * (tuning.h: LT_ATTN_FWD_WG_HEAD_DIM). */
    if (p->D == 256 && want == LT_ATTN_FWD_WG2) want = LT_ATTN_FWD_WG1;
    if (p->D == 256 && want == LT_ATTN_FWD_WS3) want = LT_ATTN_FWD_WS2;
    /* The wgmma kernels put the query blocks in gridDim.y. */
    if (want != LT_ATTN_FWD_MMA &&
        (!dev->wgmma || (p->T + LT_ATTN_FWD_WG_BM - 1) / LT_ATTN_FWD_WG_BM > LT_ATTN_GRID_YZ_MAX))
        want = LT_ATTN_FWD_MMA;
    return want;
}

lt_attn_bwd_plan lt_attn_bwd_choose(const lt_attention_params *p, const lt_attn_device *dev,
                                    const lt_attn_cuda_tuning *force) {
    static const lt_attn_cuda_tuning none = {0, 0, 0, 0, 0, 0, 0};
    if (!force) force = &none;
    lt_attn_bwd_plan pl = {1, 1, 0, 128, 0, force->bwd != LT_ATTN_BWD_WG};
    if (force->bwd == LT_ATTN_BWD_MMA) pl.wg = 0;
    /* The wgmma kernels: D = 64 or 128, D = 96 on the D = 128 kernels padded, and D = 256
     * (bwd_wg256.cu: one CTA per 64 keys of a kv head, no split, never the warp-specialised
     * kernel); sm_90a code, key blocks in gridDim.y. */
    const int d256 = p->D == 256;
    if (d256) pl.bn = 64, pl.ws_ok = 0;
    if (!(d256 || LT_ATTN_WGMMA_HEAD_DIM(p->D) || LT_ATTN_WG_PADDED_HEAD_DIM(p->D)) || !dev->wgmma ||
        (p->T + 63) / 64 > LT_ATTN_GRID_YZ_MAX)
        pl.wg = 0;
    if (!pl.wg) return pl;
    /* dQ by the dQ kernel (which then also forms delta) on sparse rows, and on every row at D = 256
     * (LT_ATTN_BWD256_DQ_SEP); else by the main kernel's atomics. */
    pl.dq_sep = (d256 && LT_ATTN_BWD256_DQ_SEP) || lt_attn_sparse(p);
    if (force->dq == LT_ATTN_DQ_ATOMIC) pl.dq_sep = 0;
    if (force->dq == LT_ATTN_DQ_SEP) pl.dq_sep = 1;
    pl.delta_dq = pl.dq_sep && !force->delta_sep;
    if (d256) return pl;
    pl.bn = pl.dq_sep && force->bwd_bn != 128 ? 64 : 128;
    const int64_t group = p->H / p->Hkv;
    const int64_t ctas = p->B * p->Hkv * ((p->T + pl.bn - 1) / pl.bn);
    const int64_t per_sm = pl.bn == 64 ? 2 : 1;
    while (pl.split < LT_ATTN_BWD_SPLIT_MAX && group % (2 * pl.split) == 0 &&
           ctas * pl.split < (int64_t)LT_ATTN_BWD_SPLIT_WAVES * dev->sm_count * per_sm)
        pl.split *= 2;
    if (force->split >= 1 && force->split <= group && group % force->split == 0) pl.split = force->split;
    return pl;
}

/* Everything lt_attn_bwd_ws_eligible asks but the lse's alignment. */
static int bwd_ws_shape(const lt_attention_params *p, const lt_attn_bwd_plan *pl) {
    if (!pl->ws_ok || !pl->wg || pl->dq_sep || pl->split != 1) return 0;
    if (!LT_ATTN_WGMMA_HEAD_DIM(p->D) && !LT_ATTN_WG_PADDED_HEAD_DIM(p->D)) return 0;
    return !(p->seq_offsets || p->window > 0 || p->T % LT_ATTN_BWD_WS_BM != 0 || p->T < LT_ATTN_BWD_WS_BN);
}

int lt_attn_bwd_ws_eligible(const lt_attention_params *p, const lt_attn_bwd_plan *pl, const float *lse) {
    return bwd_ws_shape(p, pl) && (uintptr_t)lse % 16 == 0;
}

int lt_attn_dq_acc_cols(const lt_attention_params *p, const lt_attn_bwd_plan *pl) {
    return LT_ATTN_WG_PADDED_HEAD_DIM(p->D) && bwd_ws_shape(p, pl) ? 128 : (int)p->D;
}
