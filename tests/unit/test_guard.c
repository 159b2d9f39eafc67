/* The memory guard: the ceiling rule on fixed numbers, the allocator limit it sets, the watchdog
 * catching a block that never went through the allocator, and the atomic abort artifact. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, mkdir, dirent */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

static void ceiling_rule_on_fixed_numbers(void **state) {
    (void)state;
    /* 64 GiB box, 40 free, 1 held: cushion 2 GiB, static 57.6, dynamic 39 → 39. */
    lt_guard_ceiling c = lt_guard_ceiling_rule(64 * GIB, 40 * GIB, 1 * GIB, 0, 0, 0);
    assert_int_equal(c.cushion_bytes, 2 * GIB);
    assert_int_equal(c.static_bytes, (uint64_t)(0.9 * (double)(64 * GIB)));
    assert_int_equal(c.dynamic_bytes, 39 * GIB);
    assert_int_equal(c.ceiling_bytes, 39 * GIB);
    assert_false(c.low_memory);
    assert_false(c.plan_tight);
    /* Nearly idle box: the static share binds. */
    c = lt_guard_ceiling_rule(64 * GIB, 63 * GIB, 0, 0.5, 0, 0);
    assert_int_equal(c.ceiling_bytes, 32 * GIB);
    /* Cushion clamps at both ends. */
    assert_int_equal(lt_guard_ceiling_rule(4 * GIB, 4 * GIB, 0, 0, 0, 0).cushion_bytes, 256 * MIB);
    assert_int_equal(lt_guard_ceiling_rule(1024 * GIB, 4 * GIB, 0, 0, 0, 0).cushion_bytes, 4 * GIB);
    assert_int_equal(lt_guard_ceiling_rule(8 * GIB, 4 * GIB, 0, 0, 123, 0).cushion_bytes, 123);
    /* Under a quarter available: refuse. Exactly a quarter: fine. */
    assert_true(lt_guard_ceiling_rule(16 * GIB, 4 * GIB - 1, 0, 0, 0, 0).low_memory);
    assert_false(lt_guard_ceiling_rule(16 * GIB, 4 * GIB, 0, 0, 0, 0).low_memory);
    /* Less free than the cushion: dynamic is zero, not a wrapped huge number. */
    c = lt_guard_ceiling_rule(16 * GIB, 100 * MIB, 0, 0, 0, 0);
    assert_int_equal(c.dynamic_bytes, 0);
    assert_int_equal(c.ceiling_bytes, 0);
    /* Plan warning: reach (available + in use) against plan + cushion (512 MiB on 16 GiB). */
    assert_true(lt_guard_ceiling_rule(16 * GIB, 8 * GIB, 0, 0, 0, 8 * GIB - 512 * MIB + 1).plan_tight);
    assert_false(lt_guard_ceiling_rule(16 * GIB, 8 * GIB, 0, 0, 0, 8 * GIB - 512 * MIB).plan_tight);
    assert_true(lt_guard_ceiling_rule(16 * GIB, 8 * GIB, 0, 0, 0, UINT64_MAX).plan_tight);
}

static void measure_reads_this_machine(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_guard_ceiling c;
    assert_int_equal(lt_guard_measure(ctx, LT_DEVICE_CPU, NULL, &c), LT_OK);
    lt_host_memory hm;
    assert_int_equal(lt_sys_host_memory(ctx, &hm), LT_OK);
    assert_int_equal(c.total_bytes, hm.total_bytes);
    assert_true(c.in_use_bytes > 0); /* our own resident set */
    assert_true(c.ceiling_bytes <= c.static_bytes);
    assert_true(c.ceiling_bytes <= c.in_use_bytes + c.available_bytes);
    lt_guard_options o = {.device = LT_DEVICE_CPU, .ceiling_bytes = 12345};
    assert_int_equal(lt_guard_measure(ctx, LT_DEVICE_CPU, &o, &c), LT_OK);
    assert_int_equal(c.ceiling_bytes, 12345);
    assert_true(c.overridden);
    if (!lt_sys_cuda().count) {
        assert_int_equal(lt_guard_measure(ctx, LT_DEVICE_CUDA, NULL, &c), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "CUDA"));
    }
    lt_ctx_free(ctx);
}

static void start_sets_and_restores_the_allocator_limit(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_mem_set_limit(ctx, LT_DEVICE_CPU, 1ull << 40);
    uint64_t rss = lt_sys_process_rss();
    lt_guard_options o = {.device = LT_DEVICE_CPU,
                          .ceiling_bytes = rss + 8 * MIB,
                          .allow_low_memory = 1,
                          .no_watchdog = 1};
    lt_guard *g = NULL;
    assert_int_equal(lt_guard_start(ctx, &o, &g), LT_OK);
    size_t lim = lt_mem_get_stats(ctx, LT_DEVICE_CPU).limit_bytes;
    /* The allocator gets the ceiling less what the process holds outside it. */
    assert_true(lim > 6 * MIB && lim <= 8 * MIB + 4096); /* less resident-set growth since */
    void *big = lt_alloc(ctx, LT_DEVICE_CPU, 16 * MIB, "oversized activations");
    assert_null(big);
    assert_int_equal(lt_ctx_status(ctx), LT_ERR_OOM);
    assert_non_null(strstr(lt_ctx_error(ctx), "oversized activations"));
    void *small = lt_alloc(ctx, LT_DEVICE_CPU, 1 * MIB, "fits");
    assert_non_null(small);
    lt_free(ctx, LT_DEVICE_CPU, small, 1 * MIB);
    assert_false(lt_guard_tripped(g));
    lt_guard_ceiling c = lt_guard_get_ceiling(g, LT_DEVICE_CPU);
    assert_int_equal(c.ceiling_bytes, rss + 8 * MIB);
    assert_int_equal(lt_guard_get_ceiling(g, LT_DEVICE_CUDA).ceiling_bytes, 0);
    lt_guard_stop(g);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).limit_bytes, 1ull << 40);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);

    /* A ceiling below what the process already holds is refused, leaving the limit alone. */
    o.ceiling_bytes = rss / 2;
    assert_int_equal(lt_guard_start(ctx, &o, &g), LT_ERR_OOM);
    assert_null(g);
    assert_non_null(strstr(lt_ctx_error(ctx), "below what this process"));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).limit_bytes, 1ull << 40);
    o.share = 1.5;
    assert_int_equal(lt_guard_start(ctx, &o, &g), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

/* Polls the flag for up to `seconds`. */
static int wait_tripped(lt_guard *g, double seconds) {
    double t0 = lt_time_now();
    while (lt_time_now() - t0 < seconds) {
        if (lt_guard_tripped(g)) return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return lt_guard_tripped(g);
}

static atomic_int breach_calls;
static void count_breach(void *user) {
    atomic_fetch_add(&breach_calls, 1);
    *(int *)user = 1;
}

static void watchdog_catches_memory_outside_the_allocator(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rss = lt_sys_process_rss();
    assert_true(rss > 0);
    uint64_t ceiling = rss + 48 * MIB;
    lt_guard_options o = {.device = LT_DEVICE_CPU, .ceiling_bytes = ceiling, .allow_low_memory = 1, .interval_s = 0.02};
    int seen_flag = 0;
    o.on_breach = count_breach;
    o.user = &seen_flag;
    atomic_store(&breach_calls, 0);
    lt_guard *g = NULL;
    assert_int_equal(lt_guard_start(ctx, &o, &g), LT_OK);
    /* Negative control: a quiet process stays under its ceiling. */
    assert_false(wait_tripped(g, 0.2));
    assert_int_equal(lt_guard_get_breach(g).tripped, 0);
    /* 128 MiB straight from malloc, every page touched: invisible to the allocator. */
    size_t used_before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
    assert_true(used_before > 0 && used_before < 4096);
    size_t n = 128 * MIB;
    unsigned char *block = malloc(n);
    assert_non_null(block);
    uint64_t seed = lt_test_seed();
    for (size_t i = 0; i < n; i += 4096) block[i] = (unsigned char)(lt_test_rand_u64(&seed) | 1);
    assert_true(wait_tripped(g, 5.0));
    lt_guard_breach b = lt_guard_get_breach(g);
    assert_int_equal(b.tripped, 1);
    assert_int_equal(b.device, LT_DEVICE_CPU);
    assert_string_equal(b.source, "host_rss");
    assert_int_equal(b.ceiling_bytes, ceiling);
    assert_true(b.observed_bytes > ceiling);
    assert_true(b.elapsed_s > 0.15 && b.elapsed_s < 10);
    /* The allocator never saw the block: only the guard's own record is accounted. */
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, used_before);
    /* The flag stays up and check_now agrees; the callback ran exactly once. */
    assert_int_equal(lt_guard_check_now(g), 1);
    assert_int_equal(atomic_load(&breach_calls), 1);
    assert_int_equal(seen_flag, 1);
    unsigned sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += block[i];
    assert_true(sum > 0);
    free(block);
    lt_guard_stop(g);
    lt_ctx_free(ctx);
}

static char tmpdir[256];

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return cJSON_Parse(buf);
}

static void abort_artifact_is_atomic_and_parseable(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lt_guard_test_%ld", (long)getpid());
    assert_int_equal(mkdir(tmpdir, 0755), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/aborted_memory_ceiling.json", tmpdir);
    lt_ctx *ctx = lt_ctx_new();
    lt_guard_abort_record r;
    memset(&r, 0, sizeof r);
    r.breach.tripped = 1;
    r.breach.device = LT_DEVICE_CPU;
    r.breach.source = "host_rss";
    r.breach.observed_bytes = 5000000123ull;
    r.breach.ceiling_bytes = 4000000000ull;
    r.breach.elapsed_s = 1.5;
    r.step = 17;
    r.plan_peak_bytes = 3999999936ull;
    r.allocator_peak_bytes = 3900000000ull;
    r.plan_json = "{\"peak_bytes\": 3999999936, \"classes\": {\"frozen_weights\": 100}}";
    r.checkpoint = "/runs/x/checkpoint-17";
    /* Over an older file: the new one replaces it whole. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    assert_int_equal(lt_guard_write_abort(ctx, path, &r), LT_OK);
    assert_int_equal(count_entries(tmpdir), 1); /* no temporary left behind */
    cJSON *o = read_json(path);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, "aborted_memory_ceiling");
    assert_string_equal(cJSON_GetObjectItem(o, "source")->valuestring, "host_rss");
    assert_string_equal(cJSON_GetObjectItem(o, "device")->valuestring, "cpu");
    assert_true(cJSON_GetObjectItem(o, "ceiling_bytes")->valuedouble == 4000000000.0);
    assert_true(cJSON_GetObjectItem(o, "observed_bytes")->valuedouble == 5000000123.0);
    assert_int_equal(cJSON_GetObjectItem(o, "step")->valueint, 17);
    assert_true(cJSON_GetObjectItem(o, "plan_peak_bytes")->valuedouble == 3999999936.0);
    cJSON *plan = cJSON_GetObjectItem(o, "plan");
    assert_true(cJSON_IsObject(plan));
    assert_true(cJSON_GetObjectItem(plan, "peak_bytes")->valuedouble == 3999999936.0);
    assert_string_equal(cJSON_GetObjectItem(o, "checkpoint")->valuestring, "/runs/x/checkpoint-17");
    cJSON_Delete(o);

    /* Optional fields absent: nulls, still parseable. */
    r.plan_json = NULL;
    r.checkpoint = NULL;
    assert_int_equal(lt_guard_write_abort(ctx, path, &r), LT_OK);
    o = read_json(path);
    assert_non_null(o);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "plan")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "checkpoint")));
    cJSON_Delete(o);

    /* A plan that is not a JSON object is refused and the file is left as it was. */
    r.plan_json = "[1, 2";
    assert_int_equal(lt_guard_write_abort(ctx, path, &r), LT_ERR_INVALID_ARG);
    o = read_json(path);
    assert_non_null(o);
    cJSON_Delete(o);
    /* An unwritable place is an I/O error naming the path, with nothing left behind. */
    r.plan_json = NULL;
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/a.json", tmpdir);
    assert_int_equal(lt_guard_write_abort(ctx, bad, &r), LT_ERR_IO);
    assert_non_null(strstr(lt_ctx_error(ctx), "no/such/dir"));
    assert_int_equal(count_entries(tmpdir), 1);
    unlink(path);
    rmdir(tmpdir);
    lt_ctx_free(ctx);
}

int main(void) {
    lt_log_set_level(LT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ceiling_rule_on_fixed_numbers),
        cmocka_unit_test(measure_reads_this_machine),
        cmocka_unit_test(start_sets_and_restores_the_allocator_limit),
        cmocka_unit_test(watchdog_catches_memory_outside_the_allocator),
        cmocka_unit_test(abort_artifact_is_atomic_and_parseable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
