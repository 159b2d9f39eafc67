/* The block prologue every attention kernel starts from: which query rows or keys a CTA owns and
 * which tiles of the other side its rows can see, from the per-token key bounds lo (prepare.cu:
 * causal, sliding window and packed rows folded into one non-decreasing lower bound per token);
 * plus the row loader of the padded (non-swizzled) tiles of the mma.sync kernels and the row
 * helpers the delta passes share. Private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_BLOCK_CUH
#define LT_ATTN_BLOCK_CUH

#include <stdint.h>

#include "backend/cuda/attention/params.h"
#include "backend/cuda/cuda_common.cuh"

#define LT_ATTN_LOG2E 1.4426950408889634f
#define LT_ATTN_LN2 0.6931471805599453f

/* A block of BM query rows of batch row b (the forward kernels, the dQ kernel): rows q0..qlast,
 * key tiles of BN keys kb_begin..kb_end (the causal bound ends them, lo begins them), and the key
 * bound of the last row, from which up a key tile below the diagonal needs no mask. */
struct lt_attn_qblock {
    const int32_t *lo; /* (T): this batch row's key bounds */
    int q0, qlast, kb_begin, kb_end, lo_last;
};
template <int BM, int BN>
static __device__ __forceinline__ lt_attn_qblock lt_attn_qblock_at(const lt_attn_dev &p, int qb, int b) {
    lt_attn_qblock k;
    k.lo = p.lo + (int64_t)b * p.T;
    k.q0 = qb * BM;
    k.qlast = min(k.q0 + BM, p.T) - 1;
    k.kb_begin = k.lo[k.q0] / BN;
    k.kb_end = k.qlast / BN;
    k.lo_last = k.lo[k.qlast];
    return k;
}

/* One past the last query that sees any key of [k0, klast]: lo is non-decreasing, so a binary
 * search for the first query whose lower key bound passes klast. */
static __device__ __forceinline__ int lt_attn_q_end(const int32_t *lo, int k0, int klast, int T) {
    int a = k0, z = T;
    while (a < z) {
        const int m = (a + z) >> 1;
        if (lo[m] > klast) z = m;
        else a = m + 1;
    }
    return a;
}

/* A block of BN keys of batch row b (the backward kernels): keys k0..klast and the BM-query tiles
 * qb_begin .. qb_begin + nqb - 1 that see any of them. DENSE: causal rows without packing or window
 * and T a multiple of BM, where every query from k0 on sees the block (no search). */
struct lt_attn_kblock {
    const int32_t *lo; /* (T): this batch row's key bounds */
    int k0, klast, qb_begin, nqb;
};
template <int BN, int BM, bool DENSE>
static __device__ __forceinline__ lt_attn_kblock lt_attn_kblock_at(const lt_attn_dev &p, int kb, int b) {
    lt_attn_kblock k;
    k.lo = p.lo + (int64_t)b * p.T;
    k.k0 = kb * BN;
    k.klast = min(k.k0 + BN, p.T) - 1;
    k.qb_begin = k.k0 / BM;
    if (DENSE) {
        k.nqb = p.T / BM - k.qb_begin;
    } else {
        const int q_end = lt_attn_q_end(k.lo, k.k0, k.klast, p.T);
        k.nqb = (q_end - 1) / BM - k.qb_begin + 1;
    }
    return k;
}

/* Rows t0..t0+rows-1 (D bf16 each, row stride st elements) of a global tensor into a shared tile
 * of rows padded to D + 8 elements (so that ldmatrix's eight row addresses fall in distinct banks)
 * with cp.async over NT threads; rows past T are zero-filled (their source clamped in bounds). */
template <int D, int NT>
static __device__ __forceinline__ void lt_attn_load_rows(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t st, int t0,
                                                         int rows, int T, int tid) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int c = tid; c < rows * CH; c += NT) {
        int r = c / CH, cc = c % CH, t = t0 + r;
        const __nv_bfloat16 *src = g + (int64_t)(t < T ? t : T - 1) * st + cc * 8;
        lt_cp_async16(s + r * LD + cc * 8, src, t < T ? 16 : 0);
    }
}

/* acc + Σ a[i]·b[i] over 8 bf16 elements read as one 16-byte load each (16-byte aligned). */
static __device__ __forceinline__ float lt_attn_dot8(float acc, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    const uint4 u = *(const uint4 *)a, v = *(const uint4 *)b;
    const __nv_bfloat162 *u2 = (const __nv_bfloat162 *)&u, *v2 = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 x = __bfloat1622float2(u2[k]), y = __bfloat1622float2(v2[k]);
        acc += x.x * y.x + x.y * y.y;
    }
    return acc;
}

#endif
