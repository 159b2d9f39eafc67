/* The experts' grouped products on CUDA: one launch for all experts of a call, a tiled bf16
 * tensor-core GEMM (mma.sync m16n8k16, fp32 accumulate) whose CTAs find their (expert, row tile)
 * from the offsets on the device, so nothing waits for the host and the call can be captured in a
 * graph. x (f32) is rounded to bf16 and W (f32, bf16, f16 or any block format cuda_dequant.cuh
 * decodes) converted to bf16 in the tile loads: no bf16 copy of the experts is ever made, and the
 * call needs no workspace. Not here: split-K, Hopper wgmma/TMA pipelines. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_ops.h"

/* Tiles: 128 grouped rows × 128 output columns × 64 of the reduction per step, 8 warps of 64 × 32
 * each (4 × 4 mma tiles, 64 accumulators a thread), two CTAs an SM. A 64-wide step makes every W
 * row of an NT tile two whole 32-weight groups (NN: a W row of the step holds four groups of the
 * tile's 128 columns): one group a thread. Pipeline, one barrier a step: before the products of
 * step k a thread issues step k + 1's loads (x by cp.async into an f32 staging area; aligned bf16
 * W by cp.async into the next B tile, other W into registers: raw, or decoded right away for the
 * formats staged that way), and after them rounds x and decodes W into the other of two shared
 * buffers. The A tile and NT's B tile are [row][k], NN's B tile [k][n] (read with
 * ldmatrix.trans), each padded by 8 bf16 a row so every 8-row phase of an ldmatrix reads 8
 * distinct 16-byte bank groups. */
#define GM_BM 128
#define GM_BN 128
#define GM_BK 64
#define GM_LD (GM_BK + 8)
#define GM_LDN (GM_BN + 8)
#define GM_THREADS 256

/* Weight formats by how a 32-weight group is loaded and decoded, each its own instantiation:
 * bf16 with 16-byte aligned rows and `in` a multiple of 32 (copied by cp.async straight into the
 * B tile, as x is into its staging); other bf16 and f16; f32; Q8_0 and Q4_0 (2-byte aligned
 * blocks, staged as raw halfwords); Q4_1 / INT4_G64; the other 32-weight and super-block formats
 * (decoded at load, the dtype switch per group); Q4_K / Q5_K (16-byte aligned super-blocks staged
 * raw, scales decoded once a group) and Q6_K (decoded at load, scales once a group). */
enum { GM_PLAIN = 0, GM_Q8_0, GM_Q4_0, GM_B32, GM_EXT, GM_Q4K, GM_Q5K, GM_Q6K, GM_F32, GM_BF16 };

typedef struct gm_params {
    const uint8_t *w;
    size_t row_bytes;
    lt_dtype dt;
    const int32_t *off;
    const float *x;
    float *y;
    int E;
    int64_t out, in; /* one expert's W: (out, in) */
    int64_t K, N;    /* the product's reduction and output widths: NT (in, out), NN (out, in) */
    float beta;
    int wvec; /* W's rows start 16-byte aligned (vector loads) */
} gm_params;

static __device__ __forceinline__ float gm_h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

/* (float)q − bias for 0 <= q < 2^22 and integer bias: 2^23 + q built from its bits, then one exact
 * subtraction (no integer-to-float conversion, a quarter-rate instruction). */
static __device__ __forceinline__ float gm_q2f(uint32_t q, float bias) {
    return __fsub_rn(__uint_as_float(0x4b000000u | q), 8388608.0f + bias);
}

/* A W group staged between its load and its shared-memory store. */
template <int FMT> struct gm_wst {
    uint32_t w[16]; /* 32 weights as packed bf16 (f16: the raw halves when f16raw) */
    int f16raw;
};
template <> struct gm_wst<GM_Q8_0> {
    unsigned short h[17]; /* the block: d, then 32 int8 two a halfword */
    int ok;
};
template <> struct gm_wst<GM_Q4_0> {
    unsigned short h[9]; /* d, then 16 bytes of nibbles */
    int ok;
};
template <> struct gm_wst<GM_Q4K> {
    uint4 hd, q[2]; /* d, dmin, the 12 scale bytes; this group's 32 bytes of nibbles */
    int j, ok;
};
template <> struct gm_wst<GM_Q5K> {
    uint4 hd, q[2], qh[2]; /* as Q4_K, plus the super-block's 32 high-bit bytes */
    int j, ok;
};

static __device__ __forceinline__ void gm_pack32(uint32_t w[16], const float v[32]) {
#pragma unroll
    for (int i = 0; i < 16; i++) w[i] = lt_pack_bf16(v[2 * i], v[2 * i + 1]);
}

static __device__ __forceinline__ void gm_zero32(uint32_t w[16]) {
#pragma unroll
    for (int i = 0; i < 16; i++) w[i] = 0u;
}

/* 16 bytes at p: one vector load when aligned, else byte by byte (little-endian words). */
static __device__ __forceinline__ uint4 gm_ld16(const uint8_t *p, int vec) {
    if (vec) return *(const uint4 *)p;
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        u[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
            (uint32_t)p[4 * i + 3] << 24;
    return make_uint4(u[0], u[1], u[2], u[3]);
}

static __device__ __forceinline__ uint32_t gm_word(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
static __device__ __forceinline__ int gm_byte(const uint4 &u, int i) {
    return (int)((gm_word(u, i >> 2) >> (8 * (i & 3))) & 0xffu);
}

/* Loads the group of 32 weights of stack row `row` from column c0 (a multiple of 32); ok = 0 (a
 * row or column past the product's end) stages zeros. Block formats: `in` is a multiple of the
 * block, so a group is whole or entirely past the row. */
template <int FMT>
static __device__ __forceinline__ void gm_wload(const gm_params &p, int64_t row, int64_t c0, bool ok, gm_wst<FMT> &s) {
    const uint8_t *r = p.w + (size_t)row * p.row_bytes;
    if constexpr (FMT == GM_Q8_0 || FMT == GM_Q4_0) {
        const int nh = FMT == GM_Q8_0 ? 17 : 9;
        s.ok = ok && c0 < p.in;
        const unsigned short *b = (const unsigned short *)(r + (c0 / 32) * (FMT == GM_Q8_0 ? 34 : 18));
#pragma unroll
        for (int i = 0; i < nh; i++) s.h[i] = s.ok ? b[i] : (unsigned short)0;
    } else if constexpr (FMT == GM_Q4K || FMT == GM_Q5K) {
        const int five = FMT == GM_Q5K;
        s.ok = ok && c0 < p.in;
        if (!s.ok) return;
        const int64_t g = c0 / 32;
        const uint8_t *b = r + (size_t)(g >> 3) * (five ? 176 : 144);
        s.j = (int)(g & 7);
        s.hd = gm_ld16(b, p.wvec);
        const uint8_t *q = b + (five ? 48 : 16) + (s.j >> 1) * 32;
        s.q[0] = gm_ld16(q, p.wvec), s.q[1] = gm_ld16(q + 16, p.wvec);
        if constexpr (FMT == GM_Q5K) s.qh[0] = gm_ld16(b + 16, p.wvec), s.qh[1] = gm_ld16(b + 32, p.wvec);
    } else {
        gm_wst<FMT> &t = s;
        t.f16raw = 0;
        if (!ok || c0 >= p.in) {
            gm_zero32(t.w);
            return;
        }
        float v[32];
        if constexpr (FMT == GM_PLAIN || FMT == GM_F32) {
            if (p.wvec && c0 + 32 <= p.in) {
                if constexpr (FMT == GM_PLAIN) { /* bf16 / f16: raw vector loads */
                    const uint4 *q = (const uint4 *)(r + c0 * 2);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const uint4 u = q[i];
                        t.w[4 * i] = u.x, t.w[4 * i + 1] = u.y, t.w[4 * i + 2] = u.z, t.w[4 * i + 3] = u.w;
                    }
                    t.f16raw = p.dt == LT_DTYPE_F16;
                    return;
                } else {
                    const float4 *q = (const float4 *)(r + c0 * 4);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const float4 f = q[i];
                        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
                    }
                }
            } else {
                /* A partial or unaligned group. The bound goes through an opaque copy: NN's c0 is
                 * the same every step, and hoisting 32 comparisons out of the loop costs registers. */
                int64_t lim = p.in - c0;
                asm volatile("" : "+l"(lim));
#pragma unroll
                for (int j = 0; j < 32; j++) v[j] = j < lim ? lt_dq_plain(p.dt, r, c0 + j) : 0.0f;
            }
        } else if constexpr (FMT == GM_B32) {
            lt_dq_group32(p.dt, r, c0 / 32, v);
        } else if constexpr (FMT == GM_Q6K) {
            /* group j of super-block b: low nibbles at byte h·64 + (j % 2)·32 (shift 4·(j / 2 % 2)),
             * high pairs at 128 + h·32 (shift 2·(j % 4)), h = j / 4; scales 2j, 2j + 1; d at 208. */
            const int64_t g = c0 / 32;
            const int j = (int)(g & 7), h = j >> 2;
            const uint8_t *b = r + (size_t)(g >> 3) * 210;
            const unsigned short *lo = (const unsigned short *)(b + h * 64 + (j & 1) * 32);
            const unsigned short *hi = (const unsigned short *)(b + 128 + h * 32);
            const unsigned short sc = *(const unsigned short *)(b + 192 + 2 * j);
            const float d = gm_h2f(*(const unsigned short *)(b + 208));
            const float dl0 = __fmul_rn(d, (float)(int8_t)(sc & 0xff)), dl1 = __fmul_rn(d, (float)(int8_t)(sc >> 8));
            const int ls = 4 * ((j >> 1) & 1), hs = 2 * (j & 3);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const unsigned short a = lo[i], c = hi[i];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int l = 2 * i + u;
                    const int q = (((a >> (8 * u)) >> ls) & 0xf) | ((((c >> (8 * u)) >> hs) & 3) << 4);
                    v[l] = __fmul_rn(l < 16 ? dl0 : dl1, gm_q2f((uint32_t)q, 32.0f));
                }
            }
        } else { /* GM_EXT: each dtype its own constant-folded decoder */
            switch (p.dt) {
            case LT_DTYPE_Q5_0: lt_dq_group32_ext(LT_DTYPE_Q5_0, r, c0 / 32, v); break;
            case LT_DTYPE_Q5_1: lt_dq_group32_ext(LT_DTYPE_Q5_1, r, c0 / 32, v); break;
            case LT_DTYPE_IQ4_NL: lt_dq_group32_ext(LT_DTYPE_IQ4_NL, r, c0 / 32, v); break;
            case LT_DTYPE_Q2_K: lt_dq_group32_ext(LT_DTYPE_Q2_K, r, c0 / 32, v); break;
            case LT_DTYPE_Q3_K: lt_dq_group32_ext(LT_DTYPE_Q3_K, r, c0 / 32, v); break;
            default: lt_dq_group32_ext(LT_DTYPE_IQ4_XS, r, c0 / 32, v); break;
            }
        }
        gm_pack32(t.w, v);
    }
}

/* Decodes a staged group and stores its 32 bf16 at dst (16-byte aligned). */
template <int FMT> static __device__ __forceinline__ void gm_wstore(const gm_wst<FMT> &s, __nv_bfloat16 *dst) {
    uint32_t w[16];
    if constexpr (FMT == GM_Q8_0) {
        const float d = gm_h2f(s.h[0]);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const unsigned short h = s.h[1 + i];
            w[i] = lt_pack_bf16(__fmul_rn(gm_q2f((h & 0xffu) ^ 0x80u, 128.0f), d),
                                __fmul_rn(gm_q2f((uint32_t)(h >> 8) ^ 0x80u, 128.0f), d));
        }
        if (!s.ok) gm_zero32(w);
    } else if constexpr (FMT == GM_Q4_0) {
        const float d = gm_h2f(s.h[0]);
        float v[32];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int q = (s.h[1 + i / 2] >> (8 * (i & 1))) & 0xff;
            v[i] = __fmul_rn(gm_q2f((uint32_t)q & 0xfu, 8.0f), d);
            v[i + 16] = __fmul_rn(gm_q2f((uint32_t)q >> 4, 8.0f), d);
        }
        gm_pack32(w, v);
        if (!s.ok) gm_zero32(w);
    } else if constexpr (FMT == GM_Q4K || FMT == GM_Q5K) {
        if (!s.ok) gm_zero32(w);
        else {
            /* d, dmin and sub-block j's 6-bit scale and min, once for the group */
            const int j = s.j;
            const float d = gm_h2f((unsigned short)(s.hd.x & 0xffffu)), dm = gm_h2f((unsigned short)(s.hd.x >> 16));
            int sc, mn;
            if (j < 4) {
                sc = gm_byte(s.hd, 4 + j) & 63;
                mn = gm_byte(s.hd, 8 + j) & 63;
            } else {
                sc = (gm_byte(s.hd, 8 + j) & 0xf) | ((gm_byte(s.hd, j) >> 2) & 0x30);
                mn = (gm_byte(s.hd, 8 + j) >> 4) | ((gm_byte(s.hd, 4 + j) >> 2) & 0x30);
            }
            const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dm, (float)mn);
            const int sh = 4 * (j & 1);
            float v[32];
#pragma unroll
            for (int l = 0; l < 32; l++) {
                int q = (int)((gm_word(s.q[l >> 4], (l >> 2) & 3) >> (8 * (l & 3) + sh)) & 0xfu);
                if constexpr (FMT == GM_Q5K) {
                    q |= (int)(((gm_word(s.qh[l >> 4], (l >> 2) & 3) >> (8 * (l & 3) + j)) & 1u) << 4);
                }
                v[l] = lt_dq_mul_sub(dl, gm_q2f((uint32_t)q, 0.0f), ml);
            }
            gm_pack32(w, v);
        }
    } else {
        const gm_wst<FMT> &t = s;
        if (t.f16raw) {
#pragma unroll
            for (int i = 0; i < 16; i++)
                w[i] = lt_pack_bf16(gm_h2f((unsigned short)(t.w[i] & 0xffffu)), gm_h2f((unsigned short)(t.w[i] >> 16)));
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) w[i] = t.w[i];
        }
    }
    uint4 *d4 = (uint4 *)dst;
#pragma unroll
    for (int q = 0; q < 4; q++) d4[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
}

/* x's f32 staging: per step a thread copies the 8 float4 at rows 16q + tid / 16, columns
 * 4·(tid % 16) (q < 8) with cp.async into slots [q][tid] and, after waiting for its own copies,
 * rounds them into the A tile: no registers hold x across the products. Rows past the tile and
 * columns past K are zero; x not 16-byte aligned (or K not a multiple of 4) takes plain loads. */
static __device__ __forceinline__ void gm_xload(const gm_params &p, int64_t row0, int rows, int64_t k0, bool xvec,
                                                float4 *xf, int tid) {
    const int64_t c = k0 + (tid % 16) * 4;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int r = q * 16 + tid / 16;
        float4 *dst = xf + q * GM_THREADS + tid;
        const float *src = p.x + (row0 + r) * p.K + c;
        if (xvec) {
            const bool in = r < rows && c < p.K;
            lt_cp_async16(dst, in ? (const void *)src : (const void *)p.x, in ? 16 : 0);
        } else {
            float4 v;
            v.x = r < rows && c < p.K ? src[0] : 0.0f;
            v.y = r < rows && c + 1 < p.K ? src[1] : 0.0f;
            v.z = r < rows && c + 2 < p.K ? src[2] : 0.0f;
            v.w = r < rows && c + 3 < p.K ? src[3] : 0.0f;
            *dst = v;
        }
    }
    lt_cp_async_commit();
}

static __device__ __forceinline__ void gm_xstore(const float4 *xf, __nv_bfloat16 *As, int tid) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float4 v = xf[q * GM_THREADS + tid];
        *(uint2 *)(As + (q * 16 + tid / 16) * GM_LD + (tid % 16) * 4) =
            make_uint2(lt_pack_bf16(v.x, v.y), lt_pack_bf16(v.z, v.w));
    }
}

/* Dynamic shared memory: two buffers of [A tile | B tile], x's staging. */
#define GM_A_BYTES (GM_BM * GM_LD * 2)
#define GM_B_BYTES(nn) ((nn) ? GM_BK * GM_LDN * 2 : GM_BN * GM_LD * 2)
#define GM_X_BYTES (8 * GM_THREADS * 16)
#define GM_BUF_BYTES(nn) (GM_A_BYTES + GM_B_BYTES(nn))
#define GM_SMEM(nn) (2 * GM_BUF_BYTES(nn) + GM_X_BYTES)

template <int FMT, bool NN> static __global__ void __launch_bounds__(GM_THREADS, 2) grouped_mm_k(gm_params p) {
    extern __shared__ __align__(16) uint8_t gm_smem[];
    float4 *const xf = (float4 *)(gm_smem + 2 * GM_BUF_BYTES(NN));
    __shared__ int cum[LT_MOE_MAX_EXPERTS];
    __shared__ int s_e, s_tile;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    /* Which (expert, row tile) this CTA is: expert e owns ceil(m_e / BM) consecutive tiles. */
    const int y_tile = (int)blockIdx.y;
    if (tid == 0) s_e = -1;
    if (warp == 0) {
        const int per = (p.E + 31) / 32, e0 = lane * per;
        int run = 0;
        for (int e = e0; e < e0 + per && e < p.E; e++) run += (p.off[e + 1] - p.off[e] + GM_BM - 1) / GM_BM;
        int incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        int c = incl - run;
        for (int e = e0; e < e0 + per && e < p.E; e++) {
            c += (p.off[e + 1] - p.off[e] + GM_BM - 1) / GM_BM;
            cum[e] = c;
        }
    }
    __syncthreads();
    for (int e = tid; e < p.E; e += GM_THREADS) {
        const int lo = e ? cum[e - 1] : 0;
        if (y_tile >= lo && y_tile < cum[e]) s_e = e, s_tile = y_tile - lo;
    }
    __syncthreads();
    const int e = s_e;
    if (e < 0) return; /* past the last tile of this call */
    const int64_t row0 = p.off[e] + (int64_t)s_tile * GM_BM;
    const int rows = (int)min((int64_t)GM_BM, (int64_t)p.off[e + 1] - row0);
    const int64_t n0 = (int64_t)blockIdx.x * GM_BN, wrow0 = (int64_t)e * p.out;

    const int wm = warp / 4, wn = warp % 4, g = lane / 4, t4 = lane % 4; /* g, t4: an accumulator's row, column pair */
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    /* This thread's W loads: NT: W row n0 + ar, group ah; NN: W row k0 + bk, the group of columns
     * n0 + 32·bg. */
    const int ar = tid / 2, ah = tid % 2, bk = tid / 4, bg = tid % 4;
    const bool xvec = (p.K % 4) == 0 && !((uintptr_t)p.x & 15);
    const int boff = NN ? bk * GM_LDN + bg * 32 : ar * GM_LD + ah * 32;
    gm_wst<FMT> ws;
    /* Step k0's loads; GM_BF16's W goes straight into buffer nb's B tile. */
    const auto load = [&](int64_t k0, int nb) {
        if constexpr (FMT == GM_BF16) {
            const int64_t row = NN ? wrow0 + k0 + bk : wrow0 + n0 + ar, c0 = NN ? n0 + bg * 32 : k0 + ah * 32;
            const bool in = (NN ? k0 + bk < p.K : n0 + ar < p.N) && c0 < p.in;
            __nv_bfloat16 *const d = (__nv_bfloat16 *)(gm_smem + nb * GM_BUF_BYTES(NN) + GM_A_BYTES) + boff;
            const uint8_t *src = in ? p.w + (size_t)row * p.row_bytes + c0 * 2 : p.w;
#pragma unroll
            for (int q = 0; q < 4; q++) lt_cp_async16(d + 8 * q, in ? src + 16 * q : src, in ? 16 : 0);
            gm_xload(p, row0, rows, k0, xvec, xf, tid); /* commits W's copies with x's */
        } else {
            (void)nb;
            gm_xload(p, row0, rows, k0, xvec, xf, tid);
            if (!NN) gm_wload<FMT>(p, wrow0 + n0 + ar, k0 + ah * 32, n0 + ar < p.N, ws);
            else gm_wload<FMT>(p, wrow0 + k0 + bk, n0 + bg * 32, k0 + bk < p.K, ws);
        }
    };
    load(0, 0);
    gm_xstore(xf, (__nv_bfloat16 *)gm_smem, tid);
    if constexpr (FMT != GM_BF16) gm_wstore<FMT>(ws, (__nv_bfloat16 *)(gm_smem + GM_A_BYTES) + boff);
    __syncthreads();
    int buf = 0;
#pragma unroll 1
    for (int64_t k0 = 0; k0 < p.K; k0 += GM_BK, buf ^= 1) {
        const __nv_bfloat16 *const As = (const __nv_bfloat16 *)(gm_smem + buf * GM_BUF_BYTES(NN)),
                                   *const Bs = As + GM_BM * GM_LD;
        const bool next = k0 + GM_BK < p.K;
        if (next) load(k0 + GM_BK, buf ^ 1); /* in flight during this step's products */
#pragma unroll
        for (int ks = 0; ks < GM_BK / 16; ks++) {
            /* ldmatrix.x4: A's four 8x8 quarters of a 16x16 tile (lane l addresses row l % 16, column
             * half l / 16); B's (n 0-7 | 8-15) x (k 0-7 | 8-15) for two n8 tiles at once: NT from
             * [n][k] rows, NN transposed from [k][n] rows (matrix l / 8: k half l / 8 % 2, n half l / 16). */
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                lt_ldsm_x4(a[mi], As + (wm * 64 + mi * 16 + (lane & 15)) * GM_LD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t r[4];
                if (!NN)
                    lt_ldsm_x4(r,
                               Bs + (wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * GM_LD + ks * 16 +
                                   ((lane >> 3) & 1) * 8);
                else
                    lt_ldsm_x4_t(r,
                                 Bs + (ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * GM_LDN + wn * 32 + nj * 16 +
                                     (lane >> 4) * 8);
                b[2 * nj][0] = r[0], b[2 * nj][1] = r[1], b[2 * nj + 1][0] = r[2], b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) lt_mma16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
        if (next) { /* into the other buffer, whose last readers finished before the previous barrier */
            __nv_bfloat16 *const An = (__nv_bfloat16 *)(gm_smem + (buf ^ 1) * GM_BUF_BYTES(NN));
            gm_xstore(xf, An, tid); /* waits for all of this thread's copies */
            if constexpr (FMT != GM_BF16) gm_wstore<FMT>(ws, An + GM_BM * GM_LD + boff);
        }
        __syncthreads();
    }

    /* Epilogue: c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at row g + 8; beta 0 does not read y.
     * Column pairs go out as one 8-byte store when N is even (and y 8-byte aligned). */
    const bool yvec = (p.N % 2) == 0 && !((uintptr_t)p.y & 7);
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = wm * 64 + mi * 16 + g + 8 * hr;
            if (r >= rows) continue;
            float *yr = p.y + (row0 + r) * p.N;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int64_t c = n0 + wn * 32 + ni * 8 + 2 * t4;
                const float v0 = acc[mi][ni][2 * hr], v1 = acc[mi][ni][2 * hr + 1];
                if (yvec && c + 1 < p.N) {
                    float2 o = make_float2(v0, v1);
                    if (p.beta != 0.0f) {
                        const float2 y0 = *(const float2 *)(yr + c);
                        o.x = __fmaf_rn(p.beta, y0.x, v0), o.y = __fmaf_rn(p.beta, y0.y, v1);
                    }
                    *(float2 *)(yr + c) = o;
                } else {
                    if (c < p.N) yr[c] = p.beta == 0.0f ? v0 : __fmaf_rn(p.beta, yr[c], v0);
                    if (c + 1 < p.N) yr[c + 1] = p.beta == 0.0f ? v1 : __fmaf_rn(p.beta, yr[c + 1], v1);
                }
            }
        }
}

/* Raises the instantiation's dynamic shared-memory limit and carveout (no stream work: capturable;
 * two CTAs of ~107 KB fit an SM) and queues it. */
template <int FMT, bool NN> static void gm_run(lt_ctx *ctx, const gm_params &p, dim3 grid, cudaStream_t s) {
    lt_cuda_check_abort(ctx,
                        cudaFuncSetAttribute(grouped_mm_k<FMT, NN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             GM_SMEM(NN)),
                        "grouped_matmul shared memory");
    lt_cuda_check_abort(ctx,
                        cudaFuncSetAttribute(grouped_mm_k<FMT, NN>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared),
                        "grouped_matmul shared memory carveout");
    grouped_mm_k<FMT, NN><<<grid, GM_THREADS, GM_SMEM(NN), s>>>(p);
}

template <bool NN> static void gm_launch(lt_ctx *ctx, const gm_params &p, dim3 grid) {
    cudaStream_t s = lt_cuda_stream(ctx);
    switch (p.dt) {
    case LT_DTYPE_F32: gm_run<GM_F32, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_BF16:
        if (p.wvec && p.in % 32 == 0) gm_run<GM_BF16, NN>(ctx, p, grid, s);
        else gm_run<GM_PLAIN, NN>(ctx, p, grid, s);
        break;
    case LT_DTYPE_F16: gm_run<GM_PLAIN, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_Q8_0: gm_run<GM_Q8_0, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_Q4_0: gm_run<GM_Q4_0, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_Q4_K: gm_run<GM_Q4K, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_Q5_K: gm_run<GM_Q5K, NN>(ctx, p, grid, s); break;
    case LT_DTYPE_Q6_K: gm_run<GM_Q6K, NN>(ctx, p, grid, s); break;
    default:
        if (lt_dq_ext(p.dt)) gm_run<GM_EXT, NN>(ctx, p, grid, s);
        else gm_run<GM_B32, NN>(ctx, p, grid, s);
    }
}

extern "C" void lt_cuda_grouped_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E,
                                       const int32_t *off, const float *x, int64_t nk, float beta, float *y, void *ws) {
    (void)ws;
    const int64_t out = w->shape[0] / E, in = w->shape[1];
    if (nk <= 0 || out <= 0 || in <= 0) return;
    const int nn = mode == LT_MATMUL_NN;
    gm_params p;
    p.w = (const uint8_t *)w->data;
    p.row_bytes = (size_t)lt_dtype_row_bytes(w->dtype, in);
    p.dt = w->dtype;
    p.off = off, p.x = x, p.y = y;
    p.E = (int)E, p.out = out, p.in = in;
    p.K = nn ? out : in, p.N = nn ? in : out;
    p.beta = beta;
    p.wvec = !((uintptr_t)w->data % 16) && p.row_bytes % 16 == 0;
    LT_ASSERT(!((uintptr_t)w->data & 1)); /* Q8_0, Q4_0, Q6_K and the 16-bit dtypes load halfwords */
    /* The worst case of Σ_e ceil(m_e / BM) row tiles is nk / BM + E; CTAs past the call's last
     * tile exit after reading the offsets. */
    const int64_t ytiles = (nk + GM_BM - 1) / GM_BM + E;
    LT_ASSERT(ytiles <= 65535);
    dim3 grid((unsigned)((p.N + GM_BN - 1) / GM_BN), (unsigned)ytiles);
    if (nn) gm_launch<true>(ctx, p, grid);
    else gm_launch<false>(ctx, p, grid);
    LT_CUDA_LAUNCHED(ctx, "grouped_matmul");
}

extern "C" size_t lt_cuda_grouped_matmul_workspace_bytes(lt_dtype wdtype, int64_t E, int64_t out, int64_t in,
                                                         int64_t nk_max, int threads) {
    (void)wdtype, (void)E, (void)out, (void)in, (void)nk_max, (void)threads;
    return 0;
}
