/* Which instruction set's dequantizers lt_dequantize_row runs: the widest the CPU has (AVX-512,
 * then AVX2, then scalar), decided once at the first call from the CPU's features, so one portable
 * build runs at the speed of the machine it lands on. LONGTUNE_CPU_ISA=scalar|avx2|avx512 pins a
 * path for tests and benchmarks; a value the CPU lacks or does not know is an error, never a
 * quiet fallback. Every path gives the same bits, so the choice changes speed, not results. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant_internal.h"

const lt_dequant_fn lt_dequant_scalar[LT_DTYPE_COUNT_] = {
    [LT_DTYPE_BF16] = lt_dequant_bf16_scalar,     [LT_DTYPE_F16] = lt_dequant_f16_scalar,
    [LT_DTYPE_Q8_0] = lt_dequant_q8_0_scalar,     [LT_DTYPE_Q4_0] = lt_dequant_q4_0_scalar,
    [LT_DTYPE_Q4_1] = lt_dequant_q4_1_scalar,     [LT_DTYPE_INT4_G64] = lt_dequant_int4_g64_scalar,
    [LT_DTYPE_Q5_0] = lt_dequant_q5_0_scalar,     [LT_DTYPE_Q5_1] = lt_dequant_q5_1_scalar,
    [LT_DTYPE_Q2_K] = lt_dequant_q2_k_scalar,     [LT_DTYPE_Q3_K] = lt_dequant_q3_k_scalar,
    [LT_DTYPE_Q4_K] = lt_dequant_q4_k_scalar,     [LT_DTYPE_Q5_K] = lt_dequant_q5_k_scalar,
    [LT_DTYPE_Q6_K] = lt_dequant_q6_k_scalar,     [LT_DTYPE_IQ4_NL] = lt_dequant_iq4_nl_scalar,
    [LT_DTYPE_IQ4_XS] = lt_dequant_iq4_xs_scalar,
};

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c"). */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const char *lt_cpu_isa_name(lt_cpu_isa isa) {
    switch (isa) {
    case LT_CPU_ISA_SCALAR: return "scalar";
    case LT_CPU_ISA_AVX2: return "avx2";
    case LT_CPU_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

int lt_cpu_isa_available(lt_cpu_isa isa, const char **why) {
    const char *w = NULL;
    switch (isa) {
    case LT_CPU_ISA_SCALAR: break;
    case LT_CPU_ISA_AVX2:
        if (!lt_dequant_avx2_table()) w = "this build has no AVX2 path (not an x86-64 GCC or clang build)";
#if defined(__x86_64__) && defined(__GNUC__)
        else if (!__builtin_cpu_supports("avx2") || !has_f16c()) w = "the CPU lacks avx2 or f16c";
#endif
        break;
    case LT_CPU_ISA_AVX512:
        if (!lt_dequant_avx512_table()) w = "this build has no AVX-512 path (not an x86-64 GCC or clang build)";
#if defined(__x86_64__) && defined(__GNUC__)
        else if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
                 !__builtin_cpu_supports("avx512vl"))
            w = "the CPU lacks avx512f, avx512bw or avx512vl";
#endif
        break;
    default: w = "no such path";
    }
    if (why) *why = w;
    return w == NULL;
}

lt_status lt_cpu_isa_env(lt_cpu_isa *out, char *msg, size_t cap) {
    const char *v = getenv("LONGTUNE_CPU_ISA");
    if (!v || !*v) {
        *out = lt_cpu_isa_available(LT_CPU_ISA_AVX512, NULL) ? LT_CPU_ISA_AVX512
            : lt_cpu_isa_available(LT_CPU_ISA_AVX2, NULL)    ? LT_CPU_ISA_AVX2
                                                             : LT_CPU_ISA_SCALAR;
        return LT_OK;
    }
    for (int i = 0; i < LT_CPU_ISA_COUNT_; i++) {
        if (strcmp(v, lt_cpu_isa_name((lt_cpu_isa)i))) continue;
        const char *why;
        if (!lt_cpu_isa_available((lt_cpu_isa)i, &why)) {
            snprintf(msg, cap, "LONGTUNE_CPU_ISA=%s: %s; use another path or unset it", v, why);
            return LT_ERR_UNSUPPORTED;
        }
        *out = (lt_cpu_isa)i;
        return LT_OK;
    }
    snprintf(msg, cap, "LONGTUNE_CPU_ISA=%.64s: unknown path (scalar, avx2 or avx512)", v);
    return LT_ERR_INVALID_ARG;
}

lt_status lt_cpu_isa_from_env(lt_ctx *ctx, lt_cpu_isa *out) {
    char msg[256];
    lt_status st = lt_cpu_isa_env(out, msg, sizeof msg);
    return st == LT_OK ? LT_OK : lt_error(ctx, st, "%s", msg);
}

/* The chosen path plus one, 0 before the first call. Threads racing the first call compute the
 * same answer from the same environment. */
static atomic_int active_isa;

lt_cpu_isa lt_cpu_isa_active(void) {
    int a = atomic_load_explicit(&active_isa, memory_order_relaxed);
    if (a) return (lt_cpu_isa)(a - 1);
    char msg[256];
    lt_cpu_isa isa;
    if (lt_cpu_isa_env(&isa, msg, sizeof msg) != LT_OK) LT_ABORT("choosing the CPU dequantizers: %s", msg);
    atomic_store_explicit(&active_isa, (int)isa + 1, memory_order_relaxed);
    return isa;
}

lt_status lt_cpu_isa_select(lt_ctx *ctx, lt_cpu_isa isa) {
    const char *why;
    if (!lt_cpu_isa_available(isa, &why))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "CPU path %s: %s", lt_cpu_isa_name(isa), why);
    atomic_store_explicit(&active_isa, (int)isa + 1, memory_order_relaxed);
    return LT_OK;
}

const lt_kquant_search *lt_kquant_search_for(lt_cpu_isa isa) {
    const lt_kquant_search *v = isa == LT_CPU_ISA_SCALAR ? NULL : lt_kquant_search_avx2();
    return v ? v : &lt_kquant_search_scalar;
}
