/* The attention tiles' GEMMs on bf16 operands (tile_gemm.h): op(A) and B rounded to bf16 (nearest
 * even, lt_f32_to_bf16's bits; the AMX path reads f32 denormals as zero) and multiplied with f32
 * sums, as the CUDA kernels multiply.
 * - AMX (Sapphire Rapids and later, once Linux grants the process the tile data state): op(A) is
 *   packed into rows of Kp bf16 (K padded to 32 with zeros), B into VNNI pairs (rows 2k and 2k+1
 *   of each column side by side, 16 columns a 64-byte tile row); C is computed in blocks of 32 x 32
 *   (four 16 x 16 accumulator tiles, two A and two B tiles per 32 k); a whole block with alpha 1
 *   and beta 0 or 1 is loaded from and stored to C directly, any other stored to a block on the
 *   stack and written out with alpha and beta. A transposed op(A) is packed by pairing rows of
 *   the stored A and transposing 16 x 16 blocks of those pairs in registers.
 *   Callers that reuse an operand pack it once (lt_cpu_bf16_pack_a / _b / _b_rows) and multiply
 *   packed operands (lt_cpu_tile_gemm_bf16_packed); B then comes as panels or as pair rows one
 *   after the other, which a product can read from any column.
 * - AVX512-BF16 without AMX (Zen 4 and later, Cooper Lake): the same packed operands, multiplied
 *   by VDPBF16PS: blocks of 8 rows x 32 columns in sixteen zmm accumulators, each step one B pair
 *   row of each 16-column group against the pair of every row of A broadcast. VDPBF16PS, as the
 *   tiles, reads bf16 denormals as zero.
 * - Elsewhere: both operands are rounded into f32 copies and lt_cpu_tile_gemm multiplies them, so
 *   the products are the same, only the order of the sums differs.
 * Each element of C is one fixed-order sum over k on every path (on AMX in ascending chunks of
 * 32, with VDPBF16PS pair by pair), whatever M and N, so the result does not depend on how a
 * caller splits its tiles. */
#define _DEFAULT_SOURCE /* syscall */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/tile_gemm.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LT_TILE_X86 1
#define AMX_FN __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define DP_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

static int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

size_t lt_cpu_tile_gemm_bf16_pack_bytes(int64_t M, int64_t N, int64_t K) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    const size_t amx = 2 * (size_t)(up(M, 32) * up(K, 32) + up(K, 32) * up(N, 32));
    const size_t f32 = 4 * (size_t)(M * K + K * N);
    return (amx > f32 ? amx : f32) + 64;
}

/* Rows of src rounded to bf16 values (lt_f32_to_bf16's bits, a select where it branches, so the
 * loop vectorises) into dst, packed (rows, cols). */
LT_CPU_CLONES static void round_rows(const float *src, int64_t ld, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t *s = (const uint32_t *)(src + r * ld);
        uint32_t *d = (uint32_t *)(dst + r * cols);
        for (int64_t c = 0; c < cols; c++) {
            const uint32_t u = s[c], near = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u,
                           quiet = (u | 0x00400000u) & 0xffff0000u;
            d[c] = (u & 0x7fffffffu) > 0x7f800000u ? quiet : near;
        }
    }
}

static void gemm_rounded(int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack) {
    float *a = (float *)(((uintptr_t)pack + 63) & ~(uintptr_t)63), *b = a + M * K;
    const int64_t ar = trans_a ? K : M, ac = trans_a ? M : K;
    round_rows(A, lda, ar, ac, a);
    round_rows(B, ldb, K, N, b);
    lt_cpu_tile_gemm(trans_a, M, N, K, alpha, a, ac, b, N, beta, C, ldc);
}

#if defined(LT_TILE_X86)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_ok, dp_ok;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

/* Which of the hardware paths this CPU runs: AVX512-BF16 (dp_ok), and AMX once the OS grants the
 * process the tile state (amx_ok). */
static void probe_paths(void) {
    unsigned a, b, c, d;
    dp_ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tile || !bf16 || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bf16"))
        return;
    /* The OS must enable the tile state in XCR0 (bits 17 and 18) and grant it to the process. */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* LDTILECFG with the whole 64-byte config as the asm's operand: GCC 12's _tile_loadconfig names
 * only its first 8 bytes, so the stores of the rest may be dropped as dead. */
static inline void load_config(const tile_config *c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }

static inline __mmask16 lanes(int64_t n) {
    const unsigned m = n >= 16 ? 0xffffu : (1u << n) - 1u;
    return (__mmask16)m;
}

/* 16 VNNI pairs: lane j holds bf16(r0[j]) in its lower half and bf16(r1[j]) in its upper (a NULL
 * row reads as zeros). VCVTNE2PS2BF16 rounds to nearest even and keeps NaNs quiet, as
 * lt_f32_to_bf16 does, but reads f32 denormals as zero. */
AMX_FN static inline __m512i pair16(const float *r0, const float *r1, __mmask16 m) {
    static const int16_t interleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512 lo = r0 ? _mm512_maskz_loadu_ps(m, r0) : _mm512_setzero_ps();
    const __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, r1) : _mm512_setzero_ps();
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* words 0-15: lo, 16-31: hi */
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(interleave), both);
}

/* op(A) = A (M, K): rows of Kp bf16, zero beyond K and below M up to Mp. */
AMX_FN static void pack_a_rows(uint16_t *dst, int64_t ldd, const float *A, int64_t lda, int64_t M, int64_t K,
                               int64_t Mp, int64_t Kp) {
    for (int64_t i = 0; i < Mp; i++) {
        uint16_t *d = dst + i * ldd;
        if (i >= M) {
            memset(d, 0, (size_t)Kp * 2);
            continue;
        }
        const float *a = A + i * lda;
        for (int64_t k = 0; k < Kp; k += 32) {
            const __m512 lo = k < K ? _mm512_maskz_loadu_ps(lanes(K - k), a + k) : _mm512_setzero_ps();
            const __m512 hi = k + 16 < K ? _mm512_maskz_loadu_ps(lanes(K - k - 16), a + k + 16) : _mm512_setzero_ps();
            _mm512_storeu_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* 16 x 16 32-bit transpose in registers. */
AMX_FN static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4q + j] now holds, in each 128-bit lane L, the 4 x 4 block (rows 4q..4q+3 of the input,
     * column 4L + j). */
    for (int i = 0; i < 8; i++) {
        const int a = (i / 4) * 8 + i % 4, b = a + 4;
        t[a] = _mm512_shuffle_i32x4(r[a], r[b], 0x88);
        t[b] = _mm512_shuffle_i32x4(r[a], r[b], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* op(A) = Aᵀ with A stored (K, M): row i of op(A) is column i of A. Rows 2kk and 2kk+1 of A are
 * paired lane by lane (lane j: column i0 + j), and sixteen such pairs, transposed, are the 32
 * bf16 of rows i0..i0+15 for k0..k0+31. */
AMX_FN static void pack_a_cols(uint16_t *dst, int64_t ldd, const float *A, int64_t lda, int64_t M, int64_t K,
                               int64_t Mp, int64_t Kp) {
    for (int64_t i = 0; i < Mp; i += 16) {
        const __mmask16 m = i < M ? lanes(M - i) : 0;
        for (int64_t k = 0; k < Kp; k += 32) {
            __m512i r[16];
            for (int kk = 0; kk < 16; kk++) {
                const int64_t k0 = k + 2 * kk;
                r[kk] =
                    pair16(k0 < K && m ? A + k0 * lda + i : NULL, k0 + 1 < K && m ? A + (k0 + 1) * lda + i : NULL, m);
            }
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + (i + j) * ldd + k, r[j]);
        }
    }
}

/* B (K, N) as VNNI: per 16 columns, Kp/2 rows of 16 pairs (64 bytes). */
AMX_FN static void pack_b(uint16_t *dst, const float *B, int64_t ldb, int64_t N, int64_t K, int64_t Np, int64_t Kp) {
    for (int64_t n = 0; n < Np; n += 16) {
        uint16_t *d = dst + n / 16 * (Kp / 2) * 32;
        const __mmask16 m = n < N ? lanes(N - n) : 0;
        for (int64_t kk = 0; kk < Kp / 2; kk++) {
            const int64_t k0 = 2 * kk;
            const __m512i v =
                pair16(k0 < K && m ? B + k0 * ldb + n : NULL, k0 + 1 < K && m ? B + (k0 + 1) * ldb + n : NULL, m);
            _mm512_storeu_si512(d + kk * 32, v);
        }
    }
}

/* B (K, N) as VNNI pair rows one after the other: pair row kk (rows 2kk, 2kk+1 of B) at dst + kk·ldd,
 * its column n at element 2n; kpairs pair rows and ncols columns written, zeros beyond K and N. */
AMX_FN static void pack_b_rows(uint16_t *dst, int64_t ldd, const float *B, int64_t ldb, int64_t N, int64_t K,
                               int64_t kpairs, int64_t ncols) {
    for (int64_t kk = 0; kk < kpairs; kk++) {
        const int64_t k0 = 2 * kk;
        for (int64_t n = 0; n < ncols; n += 16) {
            const __mmask16 m = n < N ? lanes(N - n) : 0;
            const __m512i v =
                pair16(k0 < K && m ? B + k0 * ldb + n : NULL, k0 + 1 < K && m ? B + (k0 + 1) * ldb + n : NULL, m);
            if (ncols - n >= 16) _mm512_storeu_si512(dst + kk * ldd + 2 * n, v);
            else _mm512_mask_storeu_epi32(dst + kk * ldd + 2 * n, lanes(ncols - n), v);
        }
    }
}

/* C = alpha·A·B + beta·C on packed operands: A's rows at stride lda (bf16), up32(M) of them and
 * up32(K) columns readable; B's VNNI pair rows (16 columns, 32 bf16, a tile row) at b_row
 * elements from one to the next and its 16-column groups at b_panel, up32(K)/2 pair rows and
 * up32(N) columns readable, the pair rows from K on zero. */
AMX_FN static void gemm_packed(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa, int64_t lda,
                               const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta, float *C, int64_t ldc) {
    const int64_t Mp = up(M, 32), Np = up(N, 32), Kp = up(K, 32);
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    load_config(&cfg);
    float blk[32 * 32] __attribute__((aligned(64)));
    const int64_t sa = lda * 2, sb = b_row * 2; /* row strides in bytes */
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int64_t j = 0; j < Np; j += 32) {
        const uint16_t *b0 = pb + (j / 16) * b_panel, *b1 = b0 + b_panel;
        for (int64_t i = 0; i < Mp; i += 32) {
            const uint16_t *a0 = pa + i * lda, *a1 = a0 + 16 * lda;
            /* A whole block with alpha 1 and beta 0 or 1 accumulates in C itself. */
            float *cb = C + i * ldc + j;
            const int direct = alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && i + 32 <= M && j + 32 <= N;
            if (direct && beta == 1.0f) {
                _tile_loadd(0, cb, ldc * 4);
                _tile_loadd(1, cb + 16, ldc * 4);
                _tile_loadd(2, cb + 16 * ldc, ldc * 4);
                _tile_loadd(3, cb + 16 * ldc + 16, ldc * 4);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t k = 0; k < Kp; k += 32) {
                _tile_loadd(4, a0 + k, sa);
                _tile_loadd(5, a1 + k, sa);
                _tile_loadd(6, b0 + k / 2 * b_row, sb);
                _tile_loadd(7, b1 + k / 2 * b_row, sb);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            if (direct) {
                _tile_stored(0, cb, ldc * 4);
                _tile_stored(1, cb + 16, ldc * 4);
                _tile_stored(2, cb + 16 * ldc, ldc * 4);
                _tile_stored(3, cb + 16 * ldc + 16, ldc * 4);
                continue;
            }
            _tile_stored(0, blk, 128);
            _tile_stored(1, blk + 16, 128);
            _tile_stored(2, blk + 16 * 32, 128);
            _tile_stored(3, blk + 16 * 32 + 16, 128);
            const int64_t rows = M - i < 32 ? M - i : 32;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < 32 && j + c < N; c += 16) {
                    const __mmask16 m = lanes(N - j - c);
                    float *dst = C + (i + r) * ldc + j + c;
                    __m512 v = _mm512_mul_ps(va, _mm512_load_ps(blk + r * 32 + c));
                    if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, dst), v);
                    _mm512_mask_storeu_ps(dst, m, v);
                }
        }
    }
    _tile_release();
}

/* acc + the pairwise products of the bf16 pairs in a and b, lane by lane (VDPBF16PS). Written
 * as asm on integer vectors: GCC 12 keeps __m512bh operands of the intrinsic in memory and reloads
 * them before every use. */
DP_FN static inline __m512 dpbf16(__m512 acc, __m512i a, __m512i b) {
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* gemm_packed's product on VDPBF16PS (the same operands and contract): C in blocks of 8 rows x
 * 32 columns, sixteen accumulators; each pair row of B (one zmm of each 16-column group) meets the
 * pair of every row of A broadcast. Up to (K + 1) / 2 pair rows: the rest are zero in B. A's rows
 * past M and B's columns past N are readable by the contract, so every block computes 8 x 32 and
 * stores what lies inside C. */
DP_FN static void gemm_packed_dp(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa, int64_t lda,
                                 const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta, float *C,
                                 int64_t ldc) {
    const int64_t kp = (K + 1) / 2;
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int64_t j = 0; j < N; j += 32) {
        const uint16_t *b0 = pb + (j / 16) * b_panel, *b1 = b0 + b_panel;
        for (int64_t i = 0; i < M; i += 8) {
            __m512 acc[8][2];
            for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            const uint16_t *a = pa + i * lda;
            for (int64_t kk = 0; kk < kp; kk++) {
                const __m512i x0 = _mm512_loadu_si512(b0 + kk * b_row), x1 = _mm512_loadu_si512(b1 + kk * b_row);
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) {
                    int32_t pair; /* A's pair at k = 2kk of row r (any alignment: A may start at an odd column) */
                    memcpy(&pair, a + r * lda + 2 * kk, sizeof pair);
                    const __m512i y = _mm512_set1_epi32(pair);
                    acc[r][0] = dpbf16(acc[r][0], y, x0);
                    acc[r][1] = dpbf16(acc[r][1], y, x1);
                }
            }
            const int64_t rows = M - i < 8 ? M - i : 8;
            for (int64_t r = 0; r < rows; r++)
                for (int h = 0; h < 2 && j + 16 * h < N; h++) {
                    const __mmask16 m = lanes(N - j - 16 * h);
                    float *dst = C + (i + r) * ldc + j + 16 * h;
                    __m512 v = _mm512_mul_ps(va, acc[r][h]);
                    if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, dst), v);
                    _mm512_mask_storeu_ps(dst, m, v);
                }
        }
    }
}

/* Packs op(A) and B into `pack` and multiplies them on the AMX tiles or, for path
 * LT_TILE_BF16_DP, on VDPBF16PS. */
AMX_FN static void gemm_hw(int path, int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack) {
    const int64_t Mp = up(M, 32), Np = up(N, 32), Kp = up(K, 32);
    uint16_t *pa = (uint16_t *)(((uintptr_t)pack + 63) & ~(uintptr_t)63), *pb = pa + Mp * Kp;
    if (trans_a) pack_a_cols(pa, Kp, A, lda, M, K, Mp, Kp);
    else pack_a_rows(pa, Kp, A, lda, M, K, Mp, Kp);
    pack_b(pb, B, ldb, N, K, Np, Kp);
    if (path == LT_TILE_BF16_DP) gemm_packed_dp(M, N, K, alpha, pa, Kp, pb, Kp * 16, 32, beta, C, ldc);
    else gemm_packed(M, N, K, alpha, pa, Kp, pb, Kp * 16, 32, beta, C, ldc);
}
#endif

int lt_cpu_tile_gemm_bf16_has(int path) {
    if (path == LT_TILE_BF16_ROUNDED) return 1;
#if defined(LT_TILE_X86)
    pthread_once(&probe_once, probe_paths);
    return path == LT_TILE_BF16_AMX ? amx_ok : path == LT_TILE_BF16_DP ? dp_ok : 0;
#else
    return 0;
#endif
}

int lt_cpu_tile_gemm_bf16_path(void) {
    return lt_cpu_tile_gemm_bf16_has(LT_TILE_BF16_AMX) ? LT_TILE_BF16_AMX
        : lt_cpu_tile_gemm_bf16_has(LT_TILE_BF16_DP)   ? LT_TILE_BF16_DP
                                                       : LT_TILE_BF16_ROUNDED;
}

void lt_cpu_tile_gemm_bf16_on(int path, int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        lt_cpu_tile_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#if defined(LT_TILE_X86)
    if (path != LT_TILE_BF16_ROUNDED && lt_cpu_tile_gemm_bf16_has(path)) {
        gemm_hw(path, trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
        return;
    }
#else
    (void)path;
#endif
    gemm_rounded(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
}

void lt_cpu_tile_gemm_bf16(int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack) {
    lt_cpu_tile_gemm_bf16_on(lt_cpu_tile_gemm_bf16_path(), trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
}

size_t lt_cpu_bf16_pack_b_elems(int64_t N, int64_t K) { return (size_t)(up(N, 32) * up(K, 32)); }

void lt_cpu_bf16_pack_a(int trans_a, const float *A, int64_t lda, int64_t M, int64_t K, uint16_t *dst, int64_t ldd,
                        int64_t rows, int64_t cols) {
#if defined(LT_TILE_X86)
    if (trans_a) pack_a_cols(dst, ldd, A, lda, M, K, rows, cols);
    else pack_a_rows(dst, ldd, A, lda, M, K, rows, cols);
#else
    (void)trans_a, (void)A, (void)lda, (void)M, (void)K, (void)dst, (void)ldd, (void)rows, (void)cols;
#endif
}

void lt_cpu_bf16_pack_b(const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst) {
#if defined(LT_TILE_X86)
    pack_b(dst, B, ldb, N, K, up(N, 32), up(K, 32));
#else
    (void)B, (void)ldb, (void)N, (void)K, (void)dst;
#endif
}

int64_t lt_cpu_bf16_panel_elems(int64_t K) { return up(K, 32) * 16; }

void lt_cpu_bf16_pack_b_rows(const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst, int64_t ldd,
                             int64_t kpairs, int64_t ncols) {
#if defined(LT_TILE_X86)
    pack_b_rows(dst, ldd, B, ldb, N, K, kpairs, ncols);
#else
    (void)B, (void)ldb, (void)N, (void)K, (void)dst, (void)ldd, (void)kpairs, (void)ncols;
#endif
}

void lt_cpu_tile_gemm_bf16_packed_on(int path, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa,
                                     int64_t lda, const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta,
                                     float *C, int64_t ldc) {
#if defined(LT_TILE_X86)
    if (M <= 0 || N <= 0 || K <= 0 || !lt_cpu_tile_gemm_bf16_has(path)) return;
    if (path == LT_TILE_BF16_AMX) gemm_packed(M, N, K, alpha, pa, lda, pb, b_panel, b_row, beta, C, ldc);
    else if (path == LT_TILE_BF16_DP) gemm_packed_dp(M, N, K, alpha, pa, lda, pb, b_panel, b_row, beta, C, ldc);
#else
    (void)path, (void)M, (void)N, (void)K, (void)alpha, (void)pa, (void)lda, (void)pb, (void)b_panel, (void)b_row,
        (void)beta, (void)C, (void)ldc;
#endif
}

void lt_cpu_tile_gemm_bf16_packed(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa, int64_t lda,
                                  const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta, float *C,
                                  int64_t ldc) {
    lt_cpu_tile_gemm_bf16_packed_on(lt_cpu_tile_gemm_bf16_path(), M, N, K, alpha, pa, lda, pb, b_panel, b_row, beta, C,
                                    ldc);
}
