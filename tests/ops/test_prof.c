/* The op profiler on the CPU backend: the wrapped table computes what the plain one does and counts
 * every call in the phase it ran in, a nested record's time comes out of the record around it,
 * phases span their ops, and with profiling off nothing is wrapped or recorded. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "backend/prof.h"
#include "helpers/test_util.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void off_wraps_nothing(void **state) {
    (void)state;
    (void)lt_backend_get(LT_DEVICE_CPU); /* LONGTUNE_PROFILE is read here, before the switch below */
    lt_prof_enable(0);
    assert_ptr_equal(lt_backend_get(LT_DEVICE_CPU), &lt_backend_cpu);
    assert_int_equal(lt_prof_begin(LT_DEVICE_CPU, LT_PROF_GEMM), -1);
    lt_prof_totals t;
    memset(&t, 0, sizeof t);
    lt_ctx *ctx = lt_ctx_new();
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CPU, &t), LT_OK);
    assert_int_equal(t.steps, 0);
    lt_ctx_free(ctx);
}

static void wrapped_ops_counted_by_phase(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    lt_prof_enable(1);
    const lt_backend *pb = lt_backend_get(LT_DEVICE_CPU);
    assert_ptr_not_equal(pb, &lt_backend_cpu);
    assert_ptr_equal(lt_backend_profiled(pb), pb);
    assert_string_equal(pb->name, lt_backend_cpu.name);
    assert_ptr_equal(pb->matmul_workspace_bytes, lt_backend_cpu.matmul_workspace_bytes);
    lt_prof_totals t;
    memset(&t, 0, sizeof t);
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CPU, &t), LT_OK); /* start clean */
    memset(&t, 0, sizeof t);

    int64_t n = 1000;
    float *x = lt_test_fresh(&rng, n, 1), *y = lt_test_fresh(&rng, n, 1), *y2 = malloc((size_t)n * 4);
    memcpy(y2, y, (size_t)n * 4);
    lt_prof_set_phase(LT_DEVICE_CPU, LT_PROF_FORWARD);
    pb->add(ctx, y, x, 0.5f, n);
    lt_backend_cpu.add(ctx, y2, x, 0.5f, n);
    assert_memory_equal(y, y2, (size_t)n * 4);
    pb->scale(ctx, y, 2.0f, n);
    pb->scale(ctx, y, 0.5f, n);
    lt_prof_set_phase(LT_DEVICE_CPU, LT_PROF_BACKWARD);
    const double t0 = now_ms();
    int outer = lt_prof_begin(LT_DEVICE_CPU, LT_PROF_MATMUL);
    sleep_ms(4);
    int inner = lt_prof_begin(LT_DEVICE_CPU, LT_PROF_MATMUL_CVT);
    sleep_ms(12);
    lt_prof_end(inner);
    lt_prof_end(outer);
    const double outer_wall = now_ms() - t0; /* brackets the outer record, however loaded the machine */
    pb->add(ctx, y, x, 1.0f, n);
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CPU, &t), LT_OK);

    assert_int_equal(t.steps, 1);
    assert_int_equal(t.dropped, 0);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_ADD], 1);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_SCALE], 2);
    assert_int_equal(t.calls[LT_PROF_BACKWARD][LT_PROF_ADD], 1);
    assert_int_equal(t.calls[LT_PROF_BACKWARD][LT_PROF_MATMUL], 1);
    assert_int_equal(t.calls[LT_PROF_BACKWARD][LT_PROF_MATMUL_CVT], 1);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_MATMUL], 0);
    /* The nested record's time comes out of the outer one: both together fit in the wall time that
     * brackets the outer record (were the inner not subtracted, the outer alone would fill it).
     * Sleeps only ever last longer, so the lower bounds hold on a loaded machine too. */
    double cvt = t.op_ms[LT_PROF_BACKWARD][LT_PROF_MATMUL_CVT], mm = t.op_ms[LT_PROF_BACKWARD][LT_PROF_MATMUL];
    assert_true(cvt >= 11.5);
    assert_true(mm >= 3.5);
    assert_true(mm + cvt <= outer_wall + 0.01);
    for (int p = 0; p < LT_PROF_PHASE_COUNT_; p++) {
        double ops = 0;
        for (int k = 0; k < LT_PROF_OP_COUNT_; k++) {
            assert_true(t.op_ms[p][k] >= 0);
            ops += t.op_ms[p][k];
        }
        assert_true(t.phase_ms[p] + 1e-9 >= ops);
    }
    assert_true(t.phase_ms[LT_PROF_BACKWARD] >= 15.5);
    assert_string_equal(lt_prof_op_name(LT_PROF_MATMUL_CVT), "matmul_cvt");
    assert_string_equal(lt_prof_op_name(LT_PROF_MATMUL_FP8_SCALE), "matmul_fp8_scale");
    for (int k = 0; k < LT_PROF_OP_COUNT_; k++) { /* every op named, each name once (the JSON's keys) */
        const char *name = lt_prof_op_name((lt_prof_op)k);
        assert_non_null(name);
        assert_true(name[0] != '\0' && strcmp(name, "?") != 0);
        for (int j = 0; j < k; j++) assert_string_not_equal(lt_prof_op_name((lt_prof_op)j), name);
    }
    assert_string_equal(lt_prof_phase_name(LT_PROF_RECOMPUTE), "recompute");
    lt_prof_enable(0);
    free(x), free(y), free(y2);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(off_wraps_nothing),
        cmocka_unit_test(wrapped_ops_counted_by_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
