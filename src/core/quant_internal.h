/* The block formats' (de)quantizers shared between quant.c (32-weight blocks, the dispatchers
 * lt_dequantize_row / lt_quantize_row), quant_k.c (256-weight super-blocks), the vector
 * dequantizers quant_avx2.c and quant_avx512.c, and quant_isa.c, which picks one instruction set's
 * dequantizers once per process. Every dequantizer takes whole blocks: `nb` blocks in (for bf16 and
 * f16, nb weights), nb * block_elems weights out, any alignment of either pointer. */
#ifndef LONGTUNE_QUANT_INTERNAL_H
#define LONGTUNE_QUANT_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "longtune/status.h"
#include "longtune/tensor.h"

/* ggml's nearest_int, inline: to nearest, ties to even (lrintf's answer in the default rounding
 * mode) for |v| < 2^22 - 1/2, where adding 1.5·2^23 leaves the rounded integer plus 2^22 in the
 * low mantissa bits; beyond that ±2^22 (what lrintf gives up to 2^22) and NaN -2^22, which every
 * caller clamps to its range. */
static inline int lt_quant_round(float v) {
    if (!(fabsf(v) < 4194303.5f)) return v > 0 ? 4194304 : -4194304;
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* The little-endian f16 at p, widened; and f rounded to f16 and stored at p. */
static inline float lt_quant_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return lt_f16_to_f32(h);
}

static inline void lt_quant_put_half(uint8_t *p, float f) {
    uint16_t h = lt_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* ---- sub-block scale fields, read the same way by every dequantizer ---- */

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block's 12 scale bytes:
 * bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; bytes 8-11 the low nibbles of
 * scales/mins 4-7, whose top two bits ride in the high bits of bytes 0-7. */
static inline void lt_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* Q2_K's 4-bit scale and min of sub-block j (0..15): the low and high nibble of byte j. */
static inline void lt_q2_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    *sc = s[j] & 0xf;
    *mn = s[j] >> 4;
}

/* Q3_K's 6-bit signed scale k (0..15) from its 12 scale bytes. */
static inline int lt_q3_scale(const uint8_t *s, int k) {
    int lo = k < 8 ? (s[k] & 0xf) : (s[k - 8] >> 4);
    int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* IQ4_XS's 6-bit signed scale k (0..7) of super-block p: the low four bits from a nibble of
 * scales_l (bytes 4-7), the high two from the u16 scales_h (bytes 2-3). */
static inline int lt_iq4_xs_scale(const uint8_t *p, int k) {
    uint16_t sh;
    memcpy(&sh, p + 2, 2);
    return (((p[4 + k / 2] >> (4 * (k % 2))) & 0xf) | (((sh >> (2 * k)) & 3) << 4)) - 32;
}

/* The 16 values an IQ4 nibble indexes (IQ4_NL and IQ4_XS). */
extern const int8_t lt_iq4_values[16];

/* ---- dequantizers, one table per instruction set ----
 * Every path gives the scalar path's bits: the same float32 operations in the same order (a
 * product and then a sum or difference, never an FMA), on the same scales, which are widened from
 * f16 by lt_quant_half in every path. */
typedef void (*lt_dequant_fn)(const uint8_t *p, float *out, int64_t nb);

typedef enum lt_cpu_isa {
    LT_CPU_ISA_SCALAR = 0,
    LT_CPU_ISA_AVX2,   /* avx2 + f16c */
    LT_CPU_ISA_AVX512, /* avx512f + avx512bw + avx512vl */
    LT_CPU_ISA_COUNT_
} lt_cpu_isa;

/* Per dtype (indexed by lt_dtype; NULL where the dtype has no dequantizer, f32 included). The
 * vector tables are NULL when the compiler cannot build that instruction set (not x86-64 GCC or
 * clang); they list every dtype the scalar table does. */
extern const lt_dequant_fn lt_dequant_scalar[LT_DTYPE_COUNT_];
const lt_dequant_fn *lt_dequant_avx2_table(void);
const lt_dequant_fn *lt_dequant_avx512_table(void);

/* "scalar", "avx2", "avx512". */
const char *lt_cpu_isa_name(lt_cpu_isa isa);

/* 1 when this build has the path and the CPU runs it; else 0 and *why (when why is non-NULL) says
 * what is missing. */
int lt_cpu_isa_available(lt_cpu_isa isa, const char **why);

/* The path LONGTUNE_CPU_ISA names (scalar|avx2|avx512), read now; the widest available one when
 * it is unset or empty. LT_ERR_INVALID_ARG for an unknown value, LT_ERR_UNSUPPORTED for a path
 * this CPU or build lacks, each with a message naming the variable and its value. */
lt_status lt_cpu_isa_from_env(lt_ctx *ctx, lt_cpu_isa *out);
/* The same with the message in msg (cap bytes) instead of a context: for callers that check the
 * variable before any context exists (the CLI, at start-up). */
lt_status lt_cpu_isa_env(lt_cpu_isa *out, char *msg, size_t cap);

/* The path lt_dequantize_row (and lt_quantize_row's K-quant searches) use: chosen by lt_cpu_isa_from_env at the first call (a bad
 * LONGTUNE_CPU_ISA then aborts with its message, never falls back), or pinned by
 * lt_cpu_isa_select. */
lt_cpu_isa lt_cpu_isa_active(void);

/* Pins lt_dequantize_row and the K-quant searches to `isa` (benchmarks comparing paths in one process); LT_ERR_UNSUPPORTED
 * when it is not available here. Not for use while other threads dequantize. */
lt_status lt_cpu_isa_select(lt_ctx *ctx, lt_cpu_isa isa);

/* lt_dequantize_row on a chosen path, which must be available (tests compare every path). */
void lt_dequantize_row_isa(lt_cpu_isa isa, lt_dtype t, const void *row, float *out, int64_t n);

/* ---- scalar definitions ---- */
void lt_dequant_q8_0_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q4_0_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q4_1_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_0_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_1_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_iq4_nl_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_int4_g64_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_bf16_scalar(const uint8_t *p, float *out, int64_t n);
void lt_dequant_f16_scalar(const uint8_t *p, float *out, int64_t n);
void lt_dequant_q2_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q3_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q4_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q6_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_iq4_xs_scalar(const uint8_t *p, float *out, int64_t nb);

/* ---- K-quant encoders ----
 * Each encodes nb super-blocks in two halves: the per-sub-block grid searches (levels, scale and
 * for the affine types a min, of `nsub` consecutive sub-blocks of n weights), one table per
 * instruction set, then the scalar super-block step (the sub-block scales quantized against f16
 * super-scales, the levels re-derived from the stored scales, the packing). The AVX2 searches
 * run eight sub-blocks at once, one per lane, each lane the scalar search's float32 operations in
 * its order (no FMA), so every table gives the scalar table's bits. */
typedef struct lt_kquant_search {
    /* affine grids x ≈ scale·L - min, L in [0, nmax], importance w (nsub·n) */
    void (*affine)(const float *x, const float *w, int nsub, int n, int nmax, float rmin, float rdelta, int nstep,
                   int use_mad, uint8_t *L, float *scales, float *mins);
    /* Q6_K's symmetric grids (19 candidates), L = level + nmax */
    void (*symmetric)(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales);
    /* Q3_K's symmetric grid refined by single-level moves, L = level + nmax */
    void (*q3)(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales);
    /* the levels again from a stored scale dl (and min ml): L = clamp(round((x + ml) / dl), 0,
     * nmax), or clamp(round(x / dl), -nmax, nmax - 1) + nmax; n weights; untouched when dl is 0 */
    void (*requant_affine)(const float *x, int n, float dl, float ml, int nmax, uint8_t *L);
    void (*requant_symmetric)(const float *x, int n, float dl, int nmax, int8_t *L);
} lt_kquant_search;

extern const lt_kquant_search lt_kquant_search_scalar;
/* NULL when the compiler cannot build the AVX2 path. */
const lt_kquant_search *lt_kquant_search_avx2(void);
/* The searches an instruction set's path runs (quant_isa.c): the AVX2 ones for avx2 and avx512. */
const lt_kquant_search *lt_kquant_search_for(lt_cpu_isa isa);

/* The lowest of x[0..n) by the scalar search's fminf chain, raised to 0 when positive: the one
 * step whose result (the sign of a zero) the vector min cannot promise, shared by both paths. */
float lt_kquant_affine_lo(const float *x, int n);

/* lt_quantize_row's K-quant encoders on a chosen path, which must be available (tests compare
 * the paths); t one of Q2_K..Q6_K, n a multiple of 256. */
void lt_quantize_k_isa(lt_cpu_isa isa, lt_dtype t, const float *x, uint8_t *p, int64_t n);

/* On the path lt_cpu_isa_active names. */
void lt_quant_q2_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q3_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q4_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q5_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q6_k(const float *x, uint8_t *p, int64_t nb);

#endif
