/* The accounting allocator: used/peak bytes per device, alignment, the hard limit and fault
 * injection of the n-th allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "longtune/alloc.h"

static void accounting_tracks_used_and_peak(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    size_t sizes[] = {1, 63, 64, 65, 1000, 1 << 20};
    void *p[6];
    size_t want = 0, peak = 0;
    for (int i = 0; i < 6; i++) {
        p[i] = lt_alloc(ctx, LT_DEVICE_CPU, sizes[i], "test");
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % LT_ALLOC_ALIGN_HOST, 0);
        memset(p[i], 0xab, sizes[i]);
        want += lt_alloc_accounted_size(LT_DEVICE_CPU, sizes[i]);
        peak = want;
        lt_mem_stats s = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
        assert_int_equal(s.used_bytes, want);
        assert_int_equal(s.peak_bytes, peak);
    }
    assert_int_equal(lt_alloc_accounted_size(LT_DEVICE_CPU, 65), 128);
    assert_int_equal(lt_alloc_accounted_size(LT_DEVICE_CUDA, 1), 256);
    for (int i = 0; i < 6; i += 2) {
        lt_free(ctx, LT_DEVICE_CPU, p[i], sizes[i]);
        want -= lt_alloc_accounted_size(LT_DEVICE_CPU, sizes[i]);
    }
    lt_mem_stats s = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    assert_int_equal(s.used_bytes, want);
    assert_int_equal(s.peak_bytes, peak);
    assert_int_equal(s.n_allocs, 6);
    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, want);
    for (int i = 1; i < 6; i += 2) lt_free(ctx, LT_DEVICE_CPU, p[i], sizes[i]);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    /* The device's counters are separate. */
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes, 0);
    unsigned char *z = lt_calloc(ctx, LT_DEVICE_CPU, 100, "zeroed");
    for (int i = 0; i < 100; i++) assert_int_equal(z[i], 0);
    lt_free(ctx, LT_DEVICE_CPU, z, 100);
    lt_ctx_free(ctx);
}

static void hard_limit_fails_cleanly(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_mem_set_limit(ctx, LT_DEVICE_CPU, 1024);
    void *a = lt_alloc(ctx, LT_DEVICE_CPU, 1000, "first");
    assert_non_null(a);
    void *b = lt_alloc(ctx, LT_DEVICE_CPU, 100, "second block");
    assert_null(b);
    assert_int_equal(lt_ctx_status(ctx), LT_ERR_OOM);
    assert_non_null(strstr(lt_ctx_error(ctx), "second block"));
    assert_non_null(strstr(lt_ctx_error(ctx), "1024"));
    lt_mem_stats s = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    assert_int_equal(s.used_bytes, 1024);
    assert_int_equal(s.n_failed, 1);
    lt_free(ctx, LT_DEVICE_CPU, a, 1000);
    b = lt_alloc(ctx, LT_DEVICE_CPU, 100, "fits now");
    assert_non_null(b);
    lt_free(ctx, LT_DEVICE_CPU, b, 100);
    /* Absurd sizes are refused by accounting, never passed to the system. */
    lt_mem_set_limit(ctx, LT_DEVICE_CPU, 0);
    assert_null(lt_alloc(ctx, LT_DEVICE_CPU, SIZE_MAX - 3, "huge"));
    assert_int_equal(lt_ctx_status(ctx), LT_ERR_OOM);
    assert_null(lt_alloc(ctx, LT_DEVICE_CPU, 0, "empty"));
    assert_int_equal(lt_ctx_status(ctx), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void fault_injection_fails_exactly_the_nth(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (uint64_t n = 1; n <= 5; n++) {
        lt_mem_fail_nth(ctx, n);
        void *p[5];
        for (uint64_t i = 1; i <= 5; i++) {
            p[i - 1] = lt_alloc(ctx, LT_DEVICE_CPU, 128, "block");
            if (i == n) {
                assert_null(p[i - 1]);
                assert_int_equal(lt_ctx_status(ctx), LT_ERR_OOM);
                assert_non_null(strstr(lt_ctx_error(ctx), "fault injection"));
            } else {
                assert_non_null(p[i - 1]);
            }
        }
        for (int i = 0; i < 5; i++) lt_free(ctx, LT_DEVICE_CPU, p[i], 128);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    }
    lt_mem_fail_nth(ctx, 0);
    void *q = lt_alloc(ctx, LT_DEVICE_CPU, 128, "after");
    assert_non_null(q);
    lt_free(ctx, LT_DEVICE_CPU, q, 128);
    lt_ctx_free(ctx);
}

static void device_allocation_without_cuda(void **state) {
    (void)state;
#if !LT_HAVE_CUDA
    lt_ctx *ctx = lt_ctx_new();
    assert_null(lt_alloc(ctx, LT_DEVICE_CUDA, 64, "gpu buffer"));
    assert_int_equal(lt_ctx_status(ctx), LT_ERR_UNSUPPORTED);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accounting_tracks_used_and_peak),
        cmocka_unit_test(hard_limit_fails_cleanly),
        cmocka_unit_test(fault_injection_fails_exactly_the_nth),
        cmocka_unit_test(device_allocation_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
