/* Status codes and the context's error buffer: every code has a distinct, non-empty string;
 * lt_error records status and message; clearing resets both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "longtune/status.h"

static void every_code_has_a_distinct_string(void **state) {
    (void)state;
    for (int i = 0; i < LT_STATUS_COUNT_; i++) {
        const char *a = lt_status_str((lt_status)i);
        assert_non_null(a);
        assert_true(strlen(a) > 0);
        assert_string_not_equal(a, "unknown status");
        for (int j = 0; j < i; j++) assert_string_not_equal(a, lt_status_str((lt_status)j));
    }
    assert_string_equal(lt_status_str((lt_status)LT_STATUS_COUNT_), "unknown status");
    assert_string_equal(lt_status_str((lt_status)-1), "unknown status");
}

static void error_message_is_recorded_per_context(void **state) {
    (void)state;
    lt_ctx *a = lt_ctx_new(), *b = lt_ctx_new();
    assert_string_equal(lt_ctx_error(a), "");
    for (int i = 1; i < LT_STATUS_COUNT_; i++) {
        assert_int_equal(lt_error(a, (lt_status)i, "file.json:%d: bad %s", i, "key"), i);
        assert_int_equal(lt_ctx_status(a), i);
        char want[64];
        snprintf(want, sizeof want, "file.json:%d: bad key", i);
        assert_string_equal(lt_ctx_error(a), want);
    }
    assert_string_equal(lt_ctx_error(b), "");
    assert_int_equal(lt_ctx_status(b), LT_OK);
    lt_ctx_clear_error(a);
    assert_string_equal(lt_ctx_error(a), "");
    assert_int_equal(lt_ctx_status(a), LT_OK);
    /* A message longer than the buffer is truncated, never overflowed. */
    char big[4096];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    lt_error(a, LT_ERR_FORMAT, "%s", big);
    assert_true(strlen(lt_ctx_error(a)) < sizeof big - 1);
    assert_int_equal(lt_error(NULL, LT_ERR_IO, "no context"), LT_ERR_IO);
    lt_ctx_free(a);
    lt_ctx_free(b);
}

static jmp_buf abort_jmp;
static char abort_msg[256];
static void test_abort_hook(const char *file, int line, const char *msg) {
    snprintf(abort_msg, sizeof abort_msg, "%s:%d:%s", file, line, msg);
    longjmp(abort_jmp, 1);
}

static void assert_calls_the_abort_hook(void **state) {
    (void)state;
    lt_set_abort_hook(test_abort_hook);
    volatile int reached = 0;
    if (setjmp(abort_jmp) == 0) {
        LT_ASSERT(1 + 1 == 3);
        reached = 1;
    }
    lt_set_abort_hook(NULL);
    assert_int_equal(reached, 0);
    assert_non_null(strstr(abort_msg, "test_status.c"));
    assert_non_null(strstr(abort_msg, "1 + 1 == 3"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_a_distinct_string),
        cmocka_unit_test(error_message_is_recorded_per_context),
        cmocka_unit_test(assert_calls_the_abort_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
