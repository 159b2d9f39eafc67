/* The block formats against gguf-py: committed fixtures (tests/oracle/gen_quant_vectors.py) of
 * random valid blocks of every GGUF type longtune reads, dequantised by gguf.quants.dequantize,
 * must come out of lt_dequantize_row bit for bit; where gguf-py quantizes a type, lt_quantize_row
 * must write its bytes exactly. The K-quant quantizers (no gguf-py quantizer) are held to error
 * bounds on fresh random rows, and malformed sizes take the error paths. Every instruction set's
 * dequantizers the CPU has (scalar, AVX2, AVX-512) are held to the same bits; LONGTUNE_CPU_ISA
 * pins the one lt_dequantize_row itself runs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "core/quant_internal.h"
#include "longtune/tensor.h"

static const lt_dtype fixture_types[] = {
    LT_DTYPE_F16,  LT_DTYPE_BF16, LT_DTYPE_Q8_0, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_Q5_0,   LT_DTYPE_Q5_1,
    LT_DTYPE_Q2_K, LT_DTYPE_Q3_K, LT_DTYPE_Q4_K, LT_DTYPE_Q5_K, LT_DTYPE_Q6_K, LT_DTYPE_IQ4_NL, LT_DTYPE_IQ4_XS,
};
enum { N_FIXTURE_TYPES = sizeof fixture_types / sizeof fixture_types[0], WEIGHTS = 1024 };

/* The whole fixture file tests/fixtures/quant/<type><suffix>; fails the test if absent. */
static uint8_t *read_fixture(lt_dtype t, const char *suffix, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/%s%s", lt_test_source_dir(), lt_dtype_name(t), suffix);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("missing fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void dequantize_matches_gguf_py_bit_for_bit(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_FIXTURE_TYPES; ti++) {
        lt_dtype t = fixture_types[ti];
        size_t nraw, nref;
        uint8_t *raw = read_fixture(t, ".blocks", &nraw);
        float *ref = (float *)read_fixture(t, ".f32", &nref);
        assert_int_equal(nref, WEIGHTS * 4);
        assert_int_equal((int64_t)nraw, lt_dtype_row_bytes(t, WEIGHTS));
        float *got = lt_test_poisoned(WEIGHTS);
        lt_dequantize_row(t, raw, got, WEIGHTS);
        for (int i = 0; i < WEIGHTS; i++)
            if (memcmp(&got[i], &ref[i], 4) != 0)
                fail_msg("%s: weight %d: got %a, gguf-py %a", lt_dtype_name(t), i, (double)got[i], (double)ref[i]);
        /* The same weights a block at a time from block-aligned offsets. */
        int64_t be = lt_dtype_block_elems(t), bb = lt_dtype_block_bytes(t);
        for (int64_t b = 0; b < WEIGHTS / be; b++) {
            float *one = lt_test_poisoned(be);
            lt_dequantize_row(t, raw + b * bb, one, be);
            assert_memory_equal(one, ref + b * be, (size_t)be * 4);
            free(one);
        }
        free(got);
        free(raw);
        free(ref);
    }
}

static const lt_cpu_isa all_isas[] = {LT_CPU_ISA_SCALAR, LT_CPU_ISA_AVX2, LT_CPU_ISA_AVX512};
enum { N_ISAS = sizeof all_isas / sizeof all_isas[0] };

/* 1 when the path runs here; else prints why it is skipped. */
static int isa_runs(lt_cpu_isa isa) {
    const char *why;
    if (lt_cpu_isa_available(isa, &why)) return 1;
    print_message("%s path skipped: %s\n", lt_cpu_isa_name(isa), why);
    return 0;
}

/* Every instruction set's dequantizers (scalar, AVX2, AVX-512, each where the CPU has it) give
 * gguf-py's bits on the fixtures: whole rows, and one block at a time copied to an odd address. */
static void every_path_matches_gguf_py(void **state) {
    (void)state;
    print_message("lt_dequantize_row runs the %s path\n", lt_cpu_isa_name(lt_cpu_isa_active()));
    for (size_t k = 0; k < N_ISAS; k++) {
        const lt_cpu_isa isa = all_isas[k];
        if (!isa_runs(isa)) continue;
        for (size_t ti = 0; ti < N_FIXTURE_TYPES; ti++) {
            lt_dtype t = fixture_types[ti];
            size_t nraw, nref;
            uint8_t *raw = read_fixture(t, ".blocks", &nraw);
            float *ref = (float *)read_fixture(t, ".f32", &nref);
            float *got = lt_test_poisoned(WEIGHTS);
            lt_dequantize_row_isa(isa, t, raw, got, WEIGHTS);
            for (int i = 0; i < WEIGHTS; i++)
                if (memcmp(&got[i], &ref[i], 4) != 0)
                    fail_msg("%s path, %s: weight %d: got %a, gguf-py %a", lt_cpu_isa_name(isa), lt_dtype_name(t), i,
                             (double)got[i], (double)ref[i]);
            int64_t be = lt_dtype_block_elems(t), bb = lt_dtype_block_bytes(t);
            uint8_t *odd = malloc((size_t)bb + 1);
            float *one = lt_test_poisoned(be + 1);
            for (int64_t b = 0; b < WEIGHTS / be; b++) {
                memcpy(odd + 1, raw + b * bb, (size_t)bb);
                lt_dequantize_row_isa(isa, t, odd + 1, one + 1, be);
                if (memcmp(one + 1, ref + b * be, (size_t)be * 4) != 0)
                    fail_msg("%s path, %s: block %lld at an odd address differs", lt_cpu_isa_name(isa),
                             lt_dtype_name(t), (long long)b);
            }
            free(odd);
            free(one);
            free(got);
            free(raw);
            free(ref);
        }
        print_message("%s path: all %d fixture types equal gguf-py bit for bit\n", lt_cpu_isa_name(isa),
                      (int)N_FIXTURE_TYPES);
    }
}

/* A random finite f16 of either sign, magnitude 2^-24 .. 2^8 (subnormals included), as
 * gen_quant_vectors.py draws the scale fields; zero one time in 16. */
static uint16_t random_half(uint64_t *rng) {
    if (lt_test_rand_u64(rng) % 16 == 0) return 0;
    float mag = (float)exp2(lt_test_uniform(rng, -24, 8));
    return lt_f32_to_f16(lt_test_rand_u64(rng) & 1 ? -mag : mag);
}

/* Fresh random blocks of every type (random level bytes, random valid f16 scale fields; bf16 and
 * f16 rows of random bit patterns, NaNs, infinities and subnormals included), odd block counts,
 * source and destination at unaligned addresses: every vector path gives the scalar path's bits
 * (and the scalar path is gguf-py's on the fixtures above). */
static void every_path_matches_scalar_on_fresh_blocks(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 18;
    const struct {
        lt_dtype t;
        int halves[2]; /* byte offsets of the f16 fields in a block; -1 none */
    } types[] = {
        {LT_DTYPE_BF16, {-1, -1}},   {LT_DTYPE_F16, {-1, -1}},   {LT_DTYPE_Q8_0, {0, -1}},   {LT_DTYPE_Q4_0, {0, -1}},
        {LT_DTYPE_Q4_1, {0, 2}},     {LT_DTYPE_Q5_0, {0, -1}},   {LT_DTYPE_Q5_1, {0, 2}},    {LT_DTYPE_IQ4_NL, {0, -1}},
        {LT_DTYPE_INT4_G64, {0, 2}}, {LT_DTYPE_Q2_K, {80, 82}},  {LT_DTYPE_Q3_K, {108, -1}}, {LT_DTYPE_Q4_K, {0, 2}},
        {LT_DTYPE_Q5_K, {0, 2}},     {LT_DTYPE_Q6_K, {208, -1}}, {LT_DTYPE_IQ4_XS, {0, -1}},
    };
    const int64_t counts[] = {1, 3, 7, 33};
    int ran[N_ISAS] = {0};
    for (size_t k = 1; k < N_ISAS; k++) ran[k] = isa_runs(all_isas[k]);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const lt_dtype t = types[ti].t;
        const int64_t be = lt_dtype_block_elems(t), bb = lt_dtype_block_bytes(t);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            /* bf16/f16 "blocks" are single weights: longer rows reach the vector loops and their tails */
            const int64_t nb = be == 1 ? counts[ci] * 16 + counts[ci] : counts[ci], n = nb * be;
            const size_t bytes = (size_t)(nb * bb);
            for (int shift = 0; shift < 4; shift++) {
                uint8_t *buf = malloc(bytes + 4), *src = buf + shift;
                for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)lt_test_rand_u64(&rng);
                for (int64_t b = 0; b < nb; b++)
                    for (int h = 0; h < 2; h++)
                        if (types[ti].halves[h] >= 0) {
                            uint16_t v = random_half(&rng);
                            memcpy(src + b * bb + types[ti].halves[h], &v, 2);
                        }
                float *want = lt_test_poisoned(n), *got = lt_test_poisoned(n + 1);
                lt_dequantize_row_isa(LT_CPU_ISA_SCALAR, t, src, want, n);
                for (size_t k = 1; k < N_ISAS; k++) {
                    if (!ran[k]) continue;
                    float *dst = got + (shift & 1); /* every other time at a float not 8-byte aligned */
                    lt_dequantize_row_isa(all_isas[k], t, src, dst, n);
                    for (int64_t i = 0; i < n; i++)
                        if (memcmp(&dst[i], &want[i], 4) != 0)
                            fail_msg("%s path, %s, %lld blocks, source offset %d: weight %lld: got %a, scalar %a",
                                     lt_cpu_isa_name(all_isas[k]), lt_dtype_name(t), (long long)nb, shift, (long long)i,
                                     (double)dst[i], (double)want[i]);
                }
                free(buf);
                free(want);
                free(got);
            }
        }
    }
    for (size_t k = 1; k < N_ISAS; k++)
        if (ran[k])
            print_message("%s path equals the scalar one on fresh blocks of all 15 dtypes\n",
                          lt_cpu_isa_name(all_isas[k]));
}

/* LONGTUNE_CPU_ISA: each path by name where the CPU has it, a typed error naming the variable and
 * value where it does not or the name is unknown, and the widest available path when unset. */
static void cpu_isa_override(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *old = getenv("LONGTUNE_CPU_ISA");
    char *saved = old ? strdup(old) : NULL;
    lt_cpu_isa isa, widest = LT_CPU_ISA_SCALAR;
    for (size_t k = 0; k < N_ISAS; k++) {
        setenv("LONGTUNE_CPU_ISA", lt_cpu_isa_name(all_isas[k]), 1);
        const char *why;
        if (lt_cpu_isa_available(all_isas[k], &why)) {
            assert_int_equal(lt_cpu_isa_from_env(ctx, &isa), LT_OK);
            assert_int_equal(isa, all_isas[k]);
            widest = all_isas[k];
        } else {
            assert_int_equal(lt_cpu_isa_from_env(ctx, &isa), LT_ERR_UNSUPPORTED);
            assert_non_null(strstr(lt_ctx_error(ctx), "LONGTUNE_CPU_ISA="));
            assert_non_null(strstr(lt_ctx_error(ctx), lt_cpu_isa_name(all_isas[k])));
            assert_non_null(strstr(lt_ctx_error(ctx), why));
            assert_int_equal(lt_cpu_isa_select(ctx, all_isas[k]), LT_ERR_UNSUPPORTED);
        }
    }
    const char *bad[] = {"bogus", "AVX2", "avx", "avx512f", " scalar"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LONGTUNE_CPU_ISA", bad[i], 1);
        assert_int_equal(lt_cpu_isa_from_env(ctx, &isa), LT_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "LONGTUNE_CPU_ISA=%s:", bad[i]);
        assert_non_null(strstr(lt_ctx_error(ctx), want));
    }
    unsetenv("LONGTUNE_CPU_ISA");
    assert_int_equal(lt_cpu_isa_from_env(ctx, &isa), LT_OK);
    assert_int_equal(isa, widest);
    setenv("LONGTUNE_CPU_ISA", "", 1);
    assert_int_equal(lt_cpu_isa_from_env(ctx, &isa), LT_OK);
    assert_int_equal(isa, widest);
    /* pinning a path changes which one lt_dequantize_row runs, then back */
    const lt_cpu_isa before = lt_cpu_isa_active();
    assert_int_equal(lt_cpu_isa_select(ctx, LT_CPU_ISA_SCALAR), LT_OK);
    assert_int_equal(lt_cpu_isa_active(), LT_CPU_ISA_SCALAR);
    assert_int_equal(lt_cpu_isa_select(ctx, before), LT_OK);
    if (saved) setenv("LONGTUNE_CPU_ISA", saved, 1);
    else unsetenv("LONGTUNE_CPU_ISA");
    free(saved);
    lt_ctx_free(ctx);
}

static void quantize_matches_gguf_py_bytes(void **state) {
    (void)state;
    const lt_dtype types[] = {LT_DTYPE_Q8_0, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_Q5_0, LT_DTYPE_Q5_1, LT_DTYPE_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        lt_dtype t = types[ti];
        size_t nin, nout;
        float *x = (float *)read_fixture(t, ".qin.f32", &nin);
        uint8_t *want = read_fixture(t, ".qout", &nout);
        assert_int_equal(nin, WEIGHTS * 4);
        assert_int_equal((int64_t)nout, lt_dtype_row_bytes(t, WEIGHTS));
        uint8_t *got = malloc(nout);
        memset(got, 0xa5, nout);
        lt_quantize_row(t, x, got, WEIGHTS);
        for (size_t i = 0; i < nout; i++)
            if (got[i] != want[i])
                fail_msg("%s: byte %zu: got 0x%02x, gguf-py 0x%02x", lt_dtype_name(t), i, got[i], want[i]);
        free(x);
        free(want);
        free(got);
    }
}

/* A K-quant's sub-block shape: `sub` weights on a grid of `nmax` steps, affine (x = d*l - m,
 * l in [0, nmax]) or symmetric (x = d*l, l in [-nmax, nmax-1]). */
typedef struct kq {
    lt_dtype t;
    int sub, nmax, affine;
    double slack; /* allowed error over the float64 plain grid's */
} kq;

/* Squared error of the plain grid in float64 with exact per-sub-block scales: affine over
 * [min(0, lo), hi]; symmetric through the signed largest weight, which lands on -nmax. */
static double plain_grid_se(const kq *k, const float *x) {
    double lo = 0, hi = 0, amax = 0, mx = 0, se = 0;
    for (int i = 0; i < k->sub; i++) {
        lo = fmin(lo, x[i]);
        hi = fmax(hi, x[i]);
        if (fabs(x[i]) > amax) {
            amax = fabs(x[i]);
            mx = x[i];
        }
    }
    if (amax == 0) return 0;
    for (int i = 0; i < k->sub; i++) {
        double y;
        if (k->affine) {
            double d = (hi - lo) / k->nmax;
            y = lo + d * fmin(k->nmax, fmax(0, nearbyint((x[i] - lo) / d)));
        } else {
            double d = -mx / k->nmax;
            y = d * fmin(k->nmax - 1, fmax(-k->nmax, nearbyint(x[i] / d)));
        }
        se += (y - x[i]) * (y - x[i]);
    }
    return se;
}

static void k_quants_round_trip_within_bounds(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 7;
    /* The searched grids beat the plain one per sub-block; the 4-bit (Q2_K), 6-bit (Q3_K, Q4_K,
     * Q5_K) and 8-bit (Q6_K) quantization of the sub-block scales against one f16 super-scale
     * costs back a fraction of it, most where few bits quantize the scales. */
    const kq types[] = {
        {LT_DTYPE_Q2_K, 16, 3, 1, 1.35},  {LT_DTYPE_Q3_K, 16, 4, 0, 1.15},  {LT_DTYPE_Q4_K, 32, 15, 1, 1.10},
        {LT_DTYPE_Q5_K, 32, 31, 1, 1.10}, {LT_DTYPE_Q6_K, 16, 32, 0, 1.10},
    };
    const int64_t n = 256 * 16;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kq *k = &types[ti];
        float *x = lt_test_fresh(&rng, n, 0.02f), *y = lt_test_poisoned(n);
        /* outliers, a constant and an all-zero super-block */
        int outlier_sb[16] = {0, 1, 1}; /* outliers, the constant and the zero super-block: outside the comparison */
        for (int i = 0; i < 16; i++) {
            int64_t at = (int64_t)lt_test_uniform(&rng, 0, (double)n - 1);
            x[at] *= 30.0f;
            outlier_sb[at / 256] = 1;
        }
        for (int i = 0; i < 256; i++) x[256 + i] = 0.125f;
        for (int i = 0; i < 256; i++) x[512 + i] = 0.0f;
        uint8_t *row = malloc((size_t)lt_dtype_row_bytes(k->t, n));
        lt_quantize_row(k->t, x, row, n);
        lt_dequantize_row(k->t, row, y, n);
        double se = 0, se_plain = 0, sx = 0;
        for (int64_t i = 0; i < n; i++) {
            if (outlier_sb[i / 256]) continue;
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        for (int64_t s = 0; s < n / k->sub; s++)
            if (!outlier_sb[s * k->sub / 256]) se_plain += plain_grid_se(k, x + s * k->sub);
        /* the all-zero super-block comes back exactly; the constant one within f16 rounding */
        for (int i = 0; i < 256; i++) assert_true(y[512 + i] == 0.0f);
        for (int i = 0; i < 256; i++) assert_true(fabs(y[256 + i] - 0.125) <= 0.125 * 2e-3);
        double rel = sqrt(se / sx), rel_plain = sqrt(se_plain / sx);
        print_message("%s: relative rms error %.4f, plain grid %.4f\n", lt_dtype_name(k->t), rel, rel_plain);
        assert_true(rel <= k->slack * rel_plain);
        /* requantizing the dequantized row loses at most a little more */
        uint8_t *row2 = malloc((size_t)lt_dtype_row_bytes(k->t, n));
        float *y2 = lt_test_poisoned(n);
        lt_quantize_row(k->t, y, row2, n);
        lt_dequantize_row(k->t, row2, y2, n);
        double se2 = 0;
        for (int64_t i = 0; i < n; i++)
            if (!outlier_sb[i / 256]) se2 += ((double)y2[i] - y[i]) * ((double)y2[i] - y[i]);
        assert_true(sqrt(se2 / sx) <= rel);
        free(row2);
        free(y2);
        free(x);
        free(y);
        free(row);
    }
}

static void block_sizes_and_bad_lengths(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const struct {
        lt_dtype t;
        const char *name;
        int64_t elems, bytes;
    } want[] = {
        {LT_DTYPE_Q5_0, "q5_0", 32, 22},   {LT_DTYPE_Q5_1, "q5_1", 32, 24},     {LT_DTYPE_Q2_K, "q2_k", 256, 84},
        {LT_DTYPE_Q3_K, "q3_k", 256, 110}, {LT_DTYPE_Q4_K, "q4_k", 256, 144},   {LT_DTYPE_Q5_K, "q5_k", 256, 176},
        {LT_DTYPE_Q6_K, "q6_k", 256, 210}, {LT_DTYPE_IQ4_NL, "iq4_nl", 32, 18}, {LT_DTYPE_IQ4_XS, "iq4_xs", 256, 136},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        lt_dtype d;
        assert_int_equal(lt_dtype_parse(want[i].name, &d), LT_OK);
        assert_int_equal(d, want[i].t);
        assert_string_equal(lt_dtype_name(d), want[i].name);
        assert_true(lt_dtype_is_quantized(d));
        assert_int_equal(lt_dtype_block_elems(d), want[i].elems);
        assert_int_equal(lt_dtype_block_bytes(d), want[i].bytes);
        assert_int_equal(lt_dtype_row_bytes(d, 3 * want[i].elems), 3 * want[i].bytes);
        /* a row that is not a whole number of blocks has no size and cannot be allocated */
        assert_int_equal(lt_dtype_row_bytes(d, want[i].elems + 16), -1);
        int64_t shape[2] = {2, want[i].elems == 256 ? 576 : 48};
        lt_tensor t;
        assert_int_equal(lt_tensor_alloc(ctx, &t, d, LT_DEVICE_CPU, 2, shape, "w"), LT_ERR_SHAPE);
        assert_true(strstr(lt_ctx_error(ctx), want[i].name) != NULL);
    }
    assert_int_equal(lt_dtype_row_bytes(LT_DTYPE_Q8_0, INT64_MAX - 31), -1);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* lt_quant_round (inline, ggml's nearest_int) is lrintf in the default rounding mode wherever
 * |v| < 2^22, ±2^22 beyond, -2^22 for NaN: on random floats of every scale, on exact ties
 * (k + 1/2), at the 2^22 boundary, on zeros, infinities and NaN. */
static void quant_round_is_lrintf(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 41;
    for (int k = 0; k < 200000; k++) {
        float v;
        switch (k % 4) {
        case 0: v = (float)lt_test_uniform(&rng, -1, 1) * (float)exp2(lt_test_uniform(&rng, -30, 26)); break;
        case 1: v = (float)((int64_t)(lt_test_rand_u64(&rng) % 20000) - 10000) + 0.5f; break;
        case 2: v = (float)lt_test_uniform(&rng, -64, 64); break;
        default: {
            uint32_t b = (uint32_t)lt_test_rand_u64(&rng);
            memcpy(&v, &b, 4);
        }
        }
        const float edge[] = {4194304.0f,   -4194304.0f, 4194303.5f, -4194303.5f, 4194303.75f, 4194303.25f,
                              -4194303.75f, 2097151.5f,  0.0f,       -0.0f,       0.5f,        -0.5f,
                              1.5f,         -2.5f,       INFINITY,   -INFINITY,   NAN};
        if (k < (int)(sizeof edge / sizeof edge[0])) v = edge[k];
        const int want = fabsf(v) < 4194304.0f ? (int)lrintf(v) : v > 0 ? 4194304 : -4194304;
        if (lt_quant_round(v) != want)
            fail_msg("lt_quant_round(%a) = %d, lrintf %d", (double)v, lt_quant_round(v), want);
    }
}

/* Fills 16 weights with one of the shapes that steer the K-quant searches to their edges. */
static void k_sub_block(uint64_t *rng, float *x) {
    const int kind = (int)(lt_test_rand_u64(rng) % 12);
    const float scale = (float)exp2(lt_test_uniform(rng, -30, 30)), c = (float)lt_test_uniform(rng, -2, 2) * scale;
    for (int i = 0; i < 16; i++) {
        float u = (float)lt_test_uniform(rng, -1, 1);
        switch (kind) {
        case 0: x[i] = u * scale; break;                                               /* plain */
        case 1: x[i] = 0.0f; break;                                                    /* all zero */
        case 2: x[i] = lt_test_rand_u64(rng) & 1 ? -0.0f : 0.0f; break;                /* signed zeros */
        case 3: x[i] = c; break;                                                       /* constant */
        case 4: x[i] = -fabsf(u) * scale; break;                                       /* negative only */
        case 5: x[i] = lt_test_rand_u64(rng) % 3 ? fabsf(u) * scale : 0.0f; break;     /* non-negative */
        case 6: x[i] = u * 3e38f; break;                                               /* huge */
        case 7: x[i] = u * 1e-39f; break;                                              /* subnormal */
        case 8: x[i] = i == 5 ? c : (lt_test_rand_u64(rng) & 1 ? -0.0f : 0.0f); break; /* one non-zero */
        case 9: x[i] = (float)(int)(lt_test_rand_u64(rng) % 16) * 0.25f - 1.0f; break; /* rounding ties */
        case 10: x[i] = u * 1e19f; break;                                              /* squares overflow */
        default: x[i] = -fabsf(u) * 3e38f; break;                                      /* huge, negative */
        }
    }
}

/* Every vector path's K-quant encoders write the scalar path's bytes, on fresh random rows of
 * sub-blocks of every edge shape (all-zero, signed zeros, constant, negative-only, non-negative,
 * huge and subnormal magnitudes, exact rounding ties), some super-blocks with a NaN or an
 * infinity, the source at an unaligned address. */
static void k_quant_paths_match_scalar_bytes(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 42;
    const lt_dtype kt[] = {LT_DTYPE_Q2_K, LT_DTYPE_Q3_K, LT_DTYPE_Q4_K, LT_DTYPE_Q5_K, LT_DTYPE_Q6_K};
    enum { NSB = 600, N = NSB * 256 };
    float *buf = malloc((N + 1) * sizeof *buf), *x = buf + 1;
    assert_non_null(buf);
    for (int b = 0; b < NSB; b++) {
        for (int j = 0; j < 16; j++) k_sub_block(&rng, x + b * 256 + j * 16);
        if (b % 25 == 7) x[b * 256 + (int)(lt_test_rand_u64(&rng) % 256)] = b % 50 == 7 ? NAN : -INFINITY;
    }
    for (size_t k = 1; k < N_ISAS; k++) {
        const lt_cpu_isa isa = all_isas[k];
        if (!isa_runs(isa)) continue;
        for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
            /* the whole row, an odd count of super-blocks, and one alone */
            const int counts[] = {NSB, NSB - 1, 1};
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                const int64_t n = (int64_t)counts[ci] * 256;
                const float *src = x + (NSB - counts[ci]) * 256;
                const size_t bytes = (size_t)lt_dtype_row_bytes(kt[ti], n);
                uint8_t *want = malloc(bytes), *got = malloc(bytes);
                assert_non_null(want);
                assert_non_null(got);
                memset(got, 0xa5, bytes);
                lt_quantize_k_isa(LT_CPU_ISA_SCALAR, kt[ti], src, want, n);
                lt_quantize_k_isa(isa, kt[ti], src, got, n);
                const size_t bb = (size_t)lt_dtype_block_bytes(kt[ti]);
                for (size_t o = 0; o < bytes; o++)
                    if (got[o] != want[o])
                        fail_msg("%s path, %s, %d super-blocks: super-block %zu byte %zu: 0x%02x, scalar 0x%02x",
                                 lt_cpu_isa_name(isa), lt_dtype_name(kt[ti]), counts[ci], o / bb, o % bb, got[o],
                                 want[o]);
                free(want);
                free(got);
            }
        }
        print_message("%s path: Q2_K..Q6_K encoders equal the scalar ones on %d super-blocks\n", lt_cpu_isa_name(isa),
                      NSB);
    }
    free(buf);
}

/* lt_quantize_has_encoder names exactly the block formats lt_quantize_row writes: each of them
 * round-trips a row of 256 weights within a loose bound; IQ4 and the float types have none. */
static void has_encoder_lists_the_encoders(void **state) {
    (void)state;
    float x[256], y[256];
    uint8_t q[1024];
    for (int i = 0; i < 256; i++) x[i] = (float)sin(0.37 * i);
    int n = 0;
    for (int t = 0; t < LT_DTYPE_COUNT_; t++) {
        if (!lt_quantize_has_encoder((lt_dtype)t)) continue;
        assert_true(lt_dtype_is_quantized((lt_dtype)t));
        assert_true(lt_dtype_row_bytes((lt_dtype)t, 256) <= (int64_t)sizeof q);
        lt_quantize_row((lt_dtype)t, x, q, 256);
        lt_dequantize_row((lt_dtype)t, q, y, 256);
        for (int i = 0; i < 256; i++) assert_true(fabsf(y[i] - x[i]) < 0.35f);
        n++;
    }
    assert_int_equal(n, 11);
    assert_false(lt_quantize_has_encoder(LT_DTYPE_IQ4_NL));
    assert_false(lt_quantize_has_encoder(LT_DTYPE_IQ4_XS));
    assert_false(lt_quantize_has_encoder(LT_DTYPE_F32));
    assert_false(lt_quantize_has_encoder(LT_DTYPE_BF16));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dequantize_matches_gguf_py_bit_for_bit),
        cmocka_unit_test(has_encoder_lists_the_encoders),
        cmocka_unit_test(every_path_matches_gguf_py),
        cmocka_unit_test(every_path_matches_scalar_on_fresh_blocks),
        cmocka_unit_test(cpu_isa_override),
        cmocka_unit_test(quantize_matches_gguf_py_bytes),
        cmocka_unit_test(k_quants_round_trip_within_bounds),
        cmocka_unit_test(block_sizes_and_bad_lengths),
        cmocka_unit_test(quant_round_is_lrintf),
        cmocka_unit_test(k_quant_paths_match_scalar_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
