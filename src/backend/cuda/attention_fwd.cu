/* Flash attention forward on NVIDIA GPUs, plus the preparation shared with the backward: per-token
 * key bounds from packed-row offsets and sliding window, the workspace layout and the backward's
 * plan. On compute capability 9.0, D = 64 or 128: long rows go to the warp-specialised TMA kernel
 * of attention_fwd_ws.cu; rows that see few keys to one warpgroup per CTA owning 64 query rows, S
 * and O on wgmma (sm_90a) with Q, K, V in swizzled shared memory. Elsewhere (D = 96, other GPUs):
 * the FlashAttention-2 mma.sync kernel (ldmatrix, cp.async double buffering). All walk only the key
 * tiles their rows can see (tile skipping for causal, window and packed rows). */
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attnf_pipeline.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/wgmma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tuning constants: BN = 64 keys per tile; the query rows per CTA (warps x 16 x MT) are picked per
 * head dim in the table at lt_attention_cuda_forward. */
#define FWD_BN 64
#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

/* ---------------------------------------------------------------------------------------------
 * Key bounds: lo[b*T + t] = first key token t may attend to (start of its packed sequence, raised
 * by the sliding window). Non-decreasing in t within a row, which is what tile skipping uses. */
/* Sequence offsets passed by value (a kernel parameter, so no host-to-device copy precedes the
 * launch): packed rows of up to LT_ATTN_OFFS_INLINE - 1 sequences in all, which covers training
 * batches of short sequences, where the copy's latency is a visible share of the call. */
#define LT_ATTN_OFFS_INLINE 960
struct lt_attn_offs_inline {
    int32_t o[LT_ATTN_OFFS_INLINE];
};

static __device__ __forceinline__ int32_t attn_lo_of(const int32_t *o, int64_t S, int t, int64_t window) {
    int64_t start = 0;
    if (o) {
        int64_t a = 0, z = S; /* largest s in [0, S) with o[s] <= t */
        while (a < z) {
            int64_t m = (a + z + 1) / 2;
            if (o[m] <= t) a = m; else z = m - 1;
        }
        if (a >= S) a = S - 1;
        start = o[a];
    }
    if (window > 0 && (int64_t)t - window + 1 > start) start = (int64_t)t - window + 1;
    return (int32_t)start;
}

static __global__ void attn_build_lo(const int32_t *off, int64_t S, int T, int B, int64_t window,
                                     int32_t *lo) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * T) return;
    const int b = (int)(idx / T), t = (int)(idx % T);
    lo[idx] = attn_lo_of(off ? off + (int64_t)b * (S + 1) : NULL, S, t, window);
}

static __global__ void attn_build_lo_inline(lt_attn_offs_inline off, int64_t S, int T, int B,
                                            int64_t window, int32_t *lo) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * T) return;
    const int b = (int)(idx / T), t = (int)(idx % T);
    lo[idx] = attn_lo_of(off.o + (int64_t)b * (S + 1), S, t, window);
}

/* Longer host offsets travel in pieces of up to LT_ATTN_OFFS_INLINE entries, one launch each: the
 * piece o[i0..i1] of row b covers tokens [o[i0], o[i1]) (from 0 for the first piece, to T for the
 * last), whose sequences all start inside the piece. No copy, no host wait, graph-capturable. */
static __global__ void attn_build_lo_piece(lt_attn_offs_inline off, int n, int b, int t_begin, int t_end, int T,
                                           int64_t window, int32_t *lo) {
    const int t = t_begin + (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= t_end) return;
    lo[(int64_t)b * T + t] = attn_lo_of(off.o, n - 1, t, window);
}

static int attn_have_wgmma(void) {
    static int have = -1;
    if (have < 0) {
        int dev = 0, major = 0, minor = 0;
        have = cudaGetDevice(&dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
               major == 9 && minor == 0;
        (void)cudaGetLastError();
    }
    return have;
}

int lt_attn_cuda_sparse(const lt_attention_params *p) {
    return (p->seq_offsets && p->S > 0 && p->T / p->S <= 1024) || (p->window > 0 && p->window <= 512);
}

lt_attn_bwd_plan lt_attn_cuda_bwd_plan(const lt_attention_params *p) {
    lt_attn_bwd_plan pl = {0, 1, 0, 128, 0};
    const char *v = getenv("LONGTUNE_ATTN_BWD");
    pl.wg = 1;
    if (v && !strcmp(v, "mma")) pl.wg = 0;
    /* The wgmma kernels: D = 64 or 128, sm_90a code, key blocks in gridDim.y (<= 65535). */
    if ((p->D != 64 && p->D != 128) || !attn_have_wgmma() || (p->T + 63) / 64 > 65535) pl.wg = 0;
    if (!pl.wg) return pl;
    /* Short visible ranges: sequences of at most 1024 tokens on average, or a window of at most
     * 512 keys. Recomputing S and dP for dQ then costs less than the fp32 dQ buffer's memset,
     * atomics and conversion (dev/cuda/NOTES.md). */
    pl.dq_sep = lt_attn_cuda_sparse(p);
    const char *q = getenv("LONGTUNE_ATTN_DQ");
    if (q && !strcmp(q, "atomic")) pl.dq_sep = 0;
    if (q && !strcmp(q, "sep")) pl.dq_sep = 1;
    /* Without dQ in the main kernel, 64 keys per CTA: a 64-key block sees fewer query tiles of a
     * short sequence than a 128-key one, and two CTAs share an SM (dev/cuda/NOTES.md, v8). */
    const char *bn = getenv("LONGTUNE_ATTN_BWD_BN");
    pl.bn = pl.dq_sep && !(bn && !strcmp(bn, "128")) ? 64 : 128;
    const char *dl = getenv("LONGTUNE_ATTN_DELTA");
    pl.delta_dq = pl.dq_sep && !(dl && !strcmp(dl, "sep"));
    const int64_t group = p->H / p->Hkv;
    const int64_t ctas = p->B * p->Hkv * ((p->T + pl.bn - 1) / pl.bn);
    const int64_t per_sm = pl.bn == 64 ? 2 : 1;
    /* Fewer CTAs than two waves of the H200's 132 SMs: the first key blocks of a causal row carry
     * most of the work, so one wave of them leaves SMs idle. */
    while (pl.split < 4 && group % (2 * pl.split) == 0 && ctas * pl.split < 264 * per_sm) pl.split *= 2;
    const char *e = getenv("LONGTUNE_ATTN_SPLIT");
    if (e) {
        int n = atoi(e);
        if (n >= 1 && n <= group && group % n == 0) pl.split = n;
    }
    return pl;
}

extern "C" size_t lt_attention_cuda_workspace_bytes(const lt_attention_params *p, int backward,
                                                    int threads) {
    (void)threads;
    size_t n = lt_cuda_align((size_t)p->B * (size_t)p->T * 4);
    if (backward) {
        const lt_attn_bwd_plan pl = lt_attn_cuda_bwd_plan(p);
        n += lt_cuda_align((size_t)p->B * (size_t)p->H * (size_t)p->T * 4);
        if (!pl.dq_sep) n += lt_cuda_align((size_t)p->B * (size_t)p->T * (size_t)p->H * (size_t)p->D * 4);
        if (pl.split > 1)
            n += lt_cuda_align((size_t)2 * (size_t)p->B * (size_t)p->T * (size_t)p->Hkv * (size_t)p->D * 4);
    }
    return n;
}

static int64_t stride_or(int64_t s, int64_t dflt) { return s ? s : dflt; }

lt_status lt_attn_cuda_supported(lt_ctx *ctx, const lt_attention_params *p, int64_t grid_heads) {
    if (p->dtype != LT_DTYPE_BF16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): dtype %s; only bf16 is implemented",
                        lt_dtype_name(p->dtype));
    if (p->D != 64 && p->D != 96 && p->D != 128)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "attention (CUDA): head dim %lld; implemented: 64, 96, 128", (long long)p->D);
    if (p->impl == LT_ATTENTION_NAIVE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): the naive oracle is CPU-only");
    if (p->T > INT32_MAX / 2 || p->B > 65535 || grid_heads > 65535)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): B, H or T beyond the grid limits");
    return LT_OK;
}

lt_status lt_attn_cuda_prepare(lt_ctx *ctx, const lt_attention_params *p,
                                          const lt_attention_args *a, void *workspace,
                                          lt_attn_dev *d, size_t *used) {
    const int64_t T = p->T, H = p->H, Hkv = p->Hkv, D = p->D;
    memset(d, 0, sizeof *d);
    d->q = (const __nv_bfloat16 *)a->q;
    d->k = (const __nv_bfloat16 *)a->k;
    d->v = (const __nv_bfloat16 *)a->v;
    d->o = (__nv_bfloat16 *)a->out;
    d->lse = a->lse;
    d->dout = (const __nv_bfloat16 *)a->dout;
    d->dq = (__nv_bfloat16 *)a->dq;
    d->dk = (__nv_bfloat16 *)a->dk;
    d->dv = (__nv_bfloat16 *)a->dv;
    d->q_sb = stride_or(p->q_layout.batch, T * H * D);
    d->q_st = stride_or(p->q_layout.token, H * D);
    d->q_sh = stride_or(p->q_layout.head, D);
    d->kv_sb = stride_or(p->kv_layout.batch, T * Hkv * D);
    d->kv_st = stride_or(p->kv_layout.token, Hkv * D);
    d->kv_sh = stride_or(p->kv_layout.head, D);
    d->o_sb = stride_or(p->o_layout.batch, T * H * D);
    d->o_st = stride_or(p->o_layout.token, H * D);
    d->o_sh = stride_or(p->o_layout.head, D);
    /* dq shares the query layout (lt_attention_args: "dq: out (B, T, H, D), q_layout"). */
    d->dq_sb = d->q_sb;
    d->dq_st = d->q_st;
    d->dq_sh = d->q_sh;
    d->T = (int)T;
    d->H = (int)H;
    d->Hkv = (int)Hkv;
    d->group = (int)(H / Hkv);
    d->scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)D);
    d->softcap = p->softcap;

    /* cp.async moves 16-byte pieces: every row start must be 16-byte aligned. */
    const int64_t strides[9] = {d->q_sb, d->q_st, d->q_sh, d->kv_sb, d->kv_st,
                                d->kv_sh, d->o_sb, d->o_st, d->o_sh};
    for (int i = 0; i < 9; i++)
        if (strides[i] % 8)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "attention (CUDA): strides must be multiples of 8 elements (16 bytes)");
    const void *ptrs[8] = {a->q, a->k, a->v, a->out, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 8; i++)
        if ((uintptr_t)ptrs[i] % 16)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "attention (CUDA): tensors must be 16-byte aligned");

    char *ws = (char *)workspace;
    size_t off = 0;
    int32_t *lo = (int32_t *)(ws + off);
    off += lt_cuda_align((size_t)p->B * (size_t)T * 4);
    const int32_t *dev_off = NULL;
    int64_t n = p->B * T;
    const unsigned nb_lo = (unsigned)((n + 255) / 256);
    int inl = 0;
    if (p->seq_offsets) {
        /* Offsets may live on the host (the boundary validated them there) or on the device. Host
         * offsets travel as kernel parameters: all rows in one launch when they fit, else in
         * pieces (attn_build_lo_piece), so the step never waits on a host-to-device copy. */
        cudaPointerAttributes attr;
        cudaError_t e = cudaPointerGetAttributes(&attr, p->seq_offsets);
        if (e != cudaSuccess) (void)cudaGetLastError();
        size_t nb = (size_t)p->B * (size_t)(p->S + 1) * 4;
        if (e == cudaSuccess &&
            (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)) {
            dev_off = p->seq_offsets;
        } else if (nb <= sizeof(lt_attn_offs_inline)) {
            lt_attn_offs_inline in;
            memcpy(in.o, p->seq_offsets, nb);
            attn_build_lo_inline<<<nb_lo, 256, 0, lt_cuda_stream(ctx)>>>(in, p->S, (int)T, (int)p->B, p->window, lo);
            inl = 1;
        } else {
            for (int64_t b = 0; b < p->B; b++) {
                const int32_t *o = p->seq_offsets + b * (p->S + 1);
                for (int64_t i0 = 0; i0 < p->S;) {
                    const int64_t i1 = i0 + LT_ATTN_OFFS_INLINE - 1 < p->S ? i0 + LT_ATTN_OFFS_INLINE - 1 : p->S;
                    const int t0 = i0 == 0 ? 0 : o[i0], t1 = i1 == p->S ? (int)T : o[i1];
                    if (t1 > t0) {
                        lt_attn_offs_inline in;
                        memcpy(in.o, o + i0, (size_t)(i1 - i0 + 1) * 4);
                        attn_build_lo_piece<<<(unsigned)((t1 - t0 + 255) / 256), 256, 0, lt_cuda_stream(ctx)>>>(
                            in, (int)(i1 - i0 + 1), (int)b, t0, t1, (int)T, p->window, lo);
                    }
                    i0 = i1;
                }
            }
            inl = 1;
        }
    }
    if (!inl) attn_build_lo<<<nb_lo, 256, 0, lt_cuda_stream(ctx)>>>(dev_off, p->S, (int)T, (int)p->B, p->window, lo);
    LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "attention (CUDA): key bounds kernel"));
    d->lo = lo;
    *used = off;
    return LT_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The forward kernel. Warp w owns query rows [16w, 16w+16) of the CTA's BM rows; Q stays in
 * registers as A fragments, K and V tiles stream through shared memory (two buffers, the next tile
 * loading while this one is used), the scores never leave registers: the accumulator fragment of
 * S is re-packed as the A fragment of P·V. Rows are padded by 8 elements so that ldmatrix's eight
 * row addresses fall in distinct banks. */
template <int D>
static __device__ __forceinline__ void attn_load_rows(__nv_bfloat16 *s, const __nv_bfloat16 *g,
                                                      int64_t st, int t0, int rows, int T, int tid,
                                                      int nthreads) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int c = tid; c < rows * CH; c += nthreads) {
        int r = c / CH, cc = c % CH, t = t0 + r;
        const __nv_bfloat16 *src = g + (int64_t)(t < T ? t : T - 1) * st + cc * 8;
        lt_cp_async16(s + r * LD + cc * 8, src, t < T ? 16 : 0);
    }
}

/* MT = 16-row tiles per warp: with MT = 2 each K/V fragment read from shared memory feeds two
 * MMAs, halving the ldmatrix traffic per FLOP (shared-memory bandwidth, not the tensor cores, bounds
 * the MT = 1 kernel). QREG keeps Q's fragments in registers instead of re-reading them. */
template <int D, int NW, int MT, bool QREG>
static __global__ void __launch_bounds__(NW * 32) attn_fwd_kernel(lt_attn_dev p) {
    constexpr int BM = 16 * MT * NW, BN = FWD_BN, LD = D + 8, KC = D / 16, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sK = sQ + BM * LD;
    __nv_bfloat16 *sV = sK + 2 * BN * LD;

    const int T = p.T;
    const int qb = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = qb * BM, qlast = min(q0 + BM, T) - 1;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int kb_begin = lo[q0] / BN, kb_end = qlast / BN;
    const int lo_last = lo[qlast];

    const __nv_bfloat16 *gq = p.q + b * p.q_sb + h * p.q_sh;
    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;

    attn_load_rows<D>(sQ, gq, p.q_st, q0, BM, T, tid, NW * 32);
    attn_load_rows<D>(sK, gk, p.kv_st, kb_begin * BN, BN, T, tid, NW * 32);
    attn_load_rows<D>(sV, gv, p.kv_st, kb_begin * BN, BN, T, tid, NW * 32);
    lt_cp_async_commit();

    /* Rows of this thread in m-tile t: wr + 16t + lane/4 and that + 8. */
    const int wr = warp * 16 * MT;
    int row[MT][2], rlo[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        row[t][0] = q0 + wr + 16 * t + (lane >> 2);
        row[t][1] = row[t][0] + 8;
        rlo[t][0] = lo[min(row[t][0], T - 1)];
        rlo[t][1] = lo[min(row[t][1], T - 1)];
    }
    const int wlo = lo[min(q0 + wr, T - 1)];
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;

    uint32_t qf[QREG ? MT : 1][QREG ? KC : 1][4];
    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int t = 0; t < MT; t++) {
#pragma unroll
        for (int j = 0; j < DT; j++) o[t][j][0] = o[t][j][1] = o[t][j][2] = o[t][j][3] = 0.0f;
        m[t][0] = m[t][1] = -INFINITY;
        l[t][0] = l[t][1] = 0.0f;
    }

    for (int kb = kb_begin; kb <= kb_end; kb++) {
        const int buf = (kb - kb_begin) & 1;
        lt_cp_async_wait<0>();
        __syncthreads();
        if (QREG && kb == kb_begin) {
#pragma unroll
            for (int t = 0; t < (QREG ? MT : 0); t++)
#pragma unroll
                for (int kc = 0; kc < KC; kc++)
                    lt_ldsm_x4(qf[QREG ? t : 0][QREG ? kc : 0],
                               sQ + (wr + 16 * t + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
        }
        if (kb < kb_end) {
            attn_load_rows<D>(sK + (buf ^ 1) * BN * LD, gk, p.kv_st, (kb + 1) * BN, BN, T, tid,
                              NW * 32);
            attn_load_rows<D>(sV + (buf ^ 1) * BN * LD, gv, p.kv_st, (kb + 1) * BN, BN, T, tid,
                              NW * 32);
            lt_cp_async_commit();
        }
        const __nv_bfloat16 *cK = sK + buf * BN * LD, *cV = sV + buf * BN * LD;
        /* A tile none of this warp's rows can see (packed rows, window) is skipped: lo is
         * non-decreasing, so the warp's first row bounds them all. The test must be the same in
         * every lane (mma.sync needs the whole warp). */
        if (kb * BN > q0 + wr + 16 * MT - 1 || kb * BN + BN - 1 < wlo) continue;

        float s[MT][NT][4];
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int j = 0; j < NT; j++) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; e++) qa[t][e] = qf[QREG ? t : 0][QREG ? kc : 0][e];
                } else {
                    lt_ldsm_x4(qa[t], sQ + (wr + 16 * t + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                lt_ldsm_x4(r, cK + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                                  ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    lt_mma16816(s[t][2 * np], qa[t], r[0], r[1]);
                    lt_mma16816(s[t][2 * np + 1], qa[t], r[2], r[3]);
                }
            }
        }

        const int k0 = kb * BN;
        const bool full = (k0 + BN - 1 <= q0) && (k0 >= lo_last);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[t][j][e] * scale;
                    if (cap > 0.0f) x = cap * tanhf(x * inv_cap);
                    x *= LOG2E_F;
                    if (!full) {
                        int key = k0 + j * 8 + (lane & 3) * 2 + (e & 1);
                        if (key > row[t][e >> 1] || key < rlo[t][e >> 1]) x = -INFINITY;
                    }
                    s[t][j][e] = x;
                }
                mx0 = fmaxf(mx0, fmaxf(s[t][j][0], s[t][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[t][j][2], s[t][j][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m[t][0], mx0), mn1 = fmaxf(m[t][1], mx1);
            /* A row that has seen only masked keys keeps max -inf; subtract 0 instead (no NaN). */
            const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
            const float al0 = exp2f(m[t][0] - mu0), al1 = exp2f(m[t][1] - mu1);
            m[t][0] = mn0;
            m[t][1] = mn1;
            float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                s[t][j][0] = exp2f(s[t][j][0] - mu0);
                s[t][j][1] = exp2f(s[t][j][1] - mu0);
                s[t][j][2] = exp2f(s[t][j][2] - mu1);
                s[t][j][3] = exp2f(s[t][j][3] - mu1);
                rs0 += s[t][j][0] + s[t][j][1];
                rs1 += s[t][j][2] + s[t][j][3];
            }
            l[t][0] = l[t][0] * al0 + rs0;
            l[t][1] = l[t][1] * al1 + rs1;
#pragma unroll
            for (int j = 0; j < DT; j++) {
                o[t][j][0] *= al0;
                o[t][j][1] *= al0;
                o[t][j][2] *= al1;
                o[t][j][3] *= al1;
            }
        }
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                a[t][0] = lt_pack_bf16(s[t][2 * kc][0], s[t][2 * kc][1]);
                a[t][1] = lt_pack_bf16(s[t][2 * kc][2], s[t][2 * kc][3]);
                a[t][2] = lt_pack_bf16(s[t][2 * kc + 1][0], s[t][2 * kc + 1][1]);
                a[t][3] = lt_pack_bf16(s[t][2 * kc + 1][2], s[t][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t r[4];
                lt_ldsm_x4_t(r, cV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                    (lane >> 4) * 8);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    lt_mma16816(o[t][2 * dp], a[t], r[0], r[1]);
                    lt_mma16816(o[t][2 * dp + 1], a[t], r[2], r[3]);
                }
            }
        }
    }

    __nv_bfloat16 *go = p.o + b * p.o_sb + h * p.o_sh;
    const int c = (lane & 3) * 2;
#pragma unroll
    for (int t = 0; t < MT; t++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float lt = l[t][hr];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const float il = 1.0f / lt;
            const int r = row[t][hr];
            if (r < T) {
                __nv_bfloat16 *dst = go + (int64_t)r * p.o_st;
#pragma unroll
                for (int j = 0; j < DT; j++)
                    *(uint32_t *)(dst + j * 8 + c) =
                        lt_pack_bf16(o[t][j][2 * hr] * il, o[t][j][2 * hr + 1] * il);
                if ((lane & 3) == 0)
                    p.lse[((int64_t)b * p.H + h) * T + r] = (m[t][hr] + log2f(lt)) * LN2_F;
            }
        }
    }
}

template <int D, int NW, int MT, bool QREG>
static lt_status attn_fwd_launch(lt_ctx *ctx, const lt_attn_dev &d, int B) {
    constexpr int BM = 16 * MT * NW, LD = D + 8;
    const size_t smem = (size_t)(BM + 4 * FWD_BN) * LD * sizeof(__nv_bfloat16);
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_fwd_kernel<D, NW, MT, QREG>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "attention forward: shared memory size"));
    dim3 grid((unsigned)((d.T + BM - 1) / BM), (unsigned)d.H, (unsigned)B);
    attn_fwd_kernel<D, NW, MT, QREG><<<grid, NW * 32, smem, lt_cuda_stream(ctx)>>>(d);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention forward kernel launch");
}

/* ---------------------------------------------------------------------------------------------
 * Hopper forward (dev/cuda/NOTES.md, v5): one warpgroup per CTA owns 64 query rows (warp w rows
 * 16w..16w+15), S = Q·Kᵀ and O += P·V on warpgroup MMAs with Q, K and V in shared memory in the
 * 128-byte swizzle (no fragments in registers but P, taken straight from the S accumulator). Tiles
 * of 64 keys, double-buffered with cp.async; two CTAs share an SM, so one's softmax overlaps the
 * other's MMAs. D = 64 or 128. */
template <int D, int NB>
static __global__ void __launch_bounds__(128, NB == 1 ? 3 : 2) attn_fwd_wg_kernel(lt_attn_dev p) {
#if LT_WGMMA_OK
    constexpr int BM = 64, BN = 64, KS = D / 16, NH = D / 64, TILE = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (lt_smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *sQ = smem, *sK = sQ + TILE, *sV = sK + NB * TILE;

    const int T = p.T;
    /* Heads vary fastest and query blocks run from the last (longest causal rows) down, so every
     * head's long blocks are scheduled before any short one. */
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, b = blockIdx.z, hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = qb * BM, qlast = min(q0 + BM, T) - 1;
    const int32_t *lo = p.lo + (int64_t)b * T;
    const int kb_begin = lo[q0] / BN, kb_end = qlast / BN;
    const int lo_last = lo[qlast];

    const __nv_bfloat16 *gq = p.q + b * p.q_sb + h * p.q_sh;
    const __nv_bfloat16 *gk = p.k + b * p.kv_sb + hk * p.kv_sh;
    const __nv_bfloat16 *gv = p.v + b * p.kv_sb + hk * p.kv_sh;
    lt_wg_load_tile<BM, D, 128>(sQ, gq, p.q_st, q0, T, tid);
    lt_wg_load_tile<BN, D, 128>(sK, gk, p.kv_st, kb_begin * BN, T, tid);
    lt_wg_load_tile<BN, D, 128>(sV, gv, p.kv_st, kb_begin * BN, T, tid);
    lt_cp_async_commit();

    int row[2], rlo[2];
    row[0] = q0 + 16 * warp + (lane >> 2);
    row[1] = row[0] + 8;
    rlo[0] = lo[min(row[0], T - 1)];
    rlo[1] = lo[min(row[1], T - 1)];
    const float scale = p.scale, cap = p.softcap;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f, sl2 = scale * LOG2E_F;
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
        if (NB == 1) {
            /* One K/V slot (three CTAs per SM): load this tile once every warp is done with the
             * last one. */
            if (kb > kb_begin) {
                __syncthreads();
                lt_wg_load_tile<BN, D, 128>(sK, gk, p.kv_st, k0, T, tid);
                lt_wg_load_tile<BN, D, 128>(sV, gv, p.kv_st, k0, T, tid);
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
                lt_wg_load_tile<BN, D, 128>(sK + (buf ^ 1) * TILE, gk, p.kv_st, (kb + 1) * BN, T, tid);
                lt_wg_load_tile<BN, D, 128>(sV + (buf ^ 1) * TILE, gv, p.kv_st, (kb + 1) * BN, T, tid);
                lt_cp_async_commit();
            }
        }
        lt_wgmma_pin(s);
        lt_wgmma_fence();
        lt_wgmma_kmajor<KS, BM, BN>(s, dQ, lt_wgmma_desc(lt_smem_addr(sK + buf * TILE)));
        lt_wgmma_commit();
        lt_wgmma_wait<0>();
        lt_wgmma_pin(s);

        const bool full = (k0 + BN - 1 <= q0) && (k0 >= lo_last);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x;
                if (cap > 0.0f) x = cap * tanhf(s[4 * j + e] * scale * inv_cap) * LOG2E_F;
                else x = s[4 * j + e] * sl2;
                if (!full) {
                    const int key = k0 + 8 * j + 2 * (lane & 3) + (e & 1);
                    if (key > row[e >> 1] || key < rlo[e >> 1]) x = -INFINITY;
                }
                s[4 * j + e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
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
        lt_wgmma_rs_wait<NH, BN / 16, BN>(o, pa, dV);
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
                    *(uint32_t *)(dst + 64 * n + 8 * j + c) =
                        lt_pack_bf16(o[n][4 * j + 2 * hr] * il, o[n][4 * j + 2 * hr + 1] * il);
            if ((lane & 3) == 0) p.lse[((int64_t)b * p.H + h) * T + r] = (m[hr] + log2f(lt)) * LN2_F;
        }
    }
#else
    (void)p;
    __trap();
#endif
}


static int attn_sm_count(void) {
    static int n = -1;
    if (n < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n = 132;
        (void)cudaGetLastError();
    }
    return n;
}

/* Forward kernel for D = 64 / 128: 0 = mma.sync (any GPU), 1 = wgmma with double-buffered K/V
 * tiles (two CTAs per SM), 2 = wgmma with one K/V slot (three CTAs per SM; for rows that see few
 * tiles, where the overlap of CTAs pays more than prefetching), 3 / 4 = the warp-specialised TMA
 * kernel of attention_fwd_ws.cu with 2 / 3 K/V stages (one 128-row CTA per SM). The wgmma kernels
 * need compute capability 9.0 (sm_90a code) and put the query blocks in gridDim.y (<= 65535).
 * Default (dev/cuda/NOTES.md, session 4, forward-only times per shape on the H200): rows that see
 * few keys (lt_attn_cuda_sparse) take 2; the others take 4 when its 128-row blocks number at least
 * 3/4 of the SMs (measured: ahead of 1 from 128 blocks up, T = 512 x 32 heads; behind by 4 % at
 * 72, T = 1024 x 9 heads), else 1.
 * LONGTUNE_ATTN_FWD=mma|wg|wg1|ws|ws3 overrides the choice for measurements. */
static int attn_fwd_variant(const lt_attention_params *p) {
    const char *v = getenv("LONGTUNE_ATTN_FWD");
    int want = 2;
    if (!lt_attn_cuda_sparse(p))
        want = 4 * p->B * p->H * ((p->T + 127) / 128) >= 3 * (int64_t)attn_sm_count() ? 4 : 1;
    if (v && !strcmp(v, "mma")) want = 0;
    if (v && !strcmp(v, "wg")) want = 1;
    if (v && !strcmp(v, "wg1")) want = 2;
    if (v && !strcmp(v, "ws")) want = 3;
    if (v && !strcmp(v, "ws3")) want = 4;
    if (want >= 3 && !lt_attn_fwd_ws_available()) want = 1;
    return want && attn_have_wgmma() && (p->T + 63) / 64 <= 65535 ? want : 0;
}

template <int D, int NB>
static lt_status attn_fwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B) {
    const size_t smem = (size_t)(1 + 2 * NB) * 64 * D * 2 + 1024;
    LT_TRY(lt_cuda_check(ctx,
                         cudaFuncSetAttribute(attn_fwd_wg_kernel<D, NB>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         "attention forward: shared memory size"));
    dim3 grid((unsigned)d.H, (unsigned)((d.T + 63) / 64), (unsigned)B);
    attn_fwd_wg_kernel<D, NB><<<grid, 128, smem, lt_cuda_stream(ctx)>>>(d);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention forward kernel launch");
}

/* Supported specialisations: bf16, head dims 64 / 96 / 128 (the table of LT_ATTENTION_CUDA_HEAD_DIMS);
 * wgmma kernels for 64 and 128 on compute capability 9.0 (attn_fwd_variant). mma.sync kernels per
 * head dim (warps, 16-row tiles per warp, Q in registers), measured on H200 (dev/cuda/NOTES.md):
 * D=128 (4, 2, no): 250 TFLOP/s at T=8k against 167 for (8, 1, yes); (4, 2, yes) spills.
 * D=64 (4, 2, yes). D=96 (8, 1, yes): (4, 2, no) spills. */
extern "C" lt_status lt_attention_cuda_forward(lt_ctx *ctx, const lt_attention_params *p,
                                               lt_attention_args *a) {
    LT_TRY(lt_attn_cuda_supported(ctx, p, p->H)); /* the query heads span a grid axis */
    if (p->T == 0 || p->B == 0) return LT_OK;
    size_t ws_bytes = lt_attention_cuda_workspace_bytes(p, 0, 0);
    void *ws = a->workspace;
    if (!ws) {
        ws = lt_alloc(ctx, LT_DEVICE_CUDA, ws_bytes, "attention forward workspace");
        if (!ws) return lt_ctx_status(ctx);
    }
    lt_attn_dev d;
    size_t used = 0;
    lt_status st = lt_attn_cuda_prepare(ctx, p, a, ws, &d, &used);
    if (st == LT_OK) {
        switch (p->D) {
        case 64: {
            const int v = attn_fwd_variant(p);
            st = v >= 3 ? lt_attn_fwd_ws_launch(ctx, p, &d, v == 4 ? 3 : 2)
               : v == 2 ? attn_fwd_wg_launch<64, 1>(ctx, d, (int)p->B)
               : v == 1 ? attn_fwd_wg_launch<64, 2>(ctx, d, (int)p->B)
                        : attn_fwd_launch<64, 4, 2, true>(ctx, d, (int)p->B);
            break;
        }
        case 96: st = attn_fwd_launch<96, 8, 1, true>(ctx, d, (int)p->B); break;
        default: {
            const int v = attn_fwd_variant(p);
            st = v >= 3 ? lt_attn_fwd_ws_launch(ctx, p, &d, v == 4 ? 3 : 2)
               : v == 2 ? attn_fwd_wg_launch<128, 1>(ctx, d, (int)p->B)
               : v == 1 ? attn_fwd_wg_launch<128, 2>(ctx, d, (int)p->B)
                        : attn_fwd_launch<128, 4, 2, false>(ctx, d, (int)p->B);
            break;
        }
        }
    }
    if (!a->workspace) lt_free(ctx, LT_DEVICE_CUDA, ws, ws_bytes); /* cudaFree waits for the kernel */
    return st;
}
