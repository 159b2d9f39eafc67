/* lt_parallel_for: every index is visited once with the documented static split, and loops of
 * different sizes run on one stable set of threads (libgomp ends and starts pooled threads when
 * consecutive teams differ in size, which cost the 16-thread trainer a third of its step). */
#define _GNU_SOURCE /* gettid through syscall */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>
#include <omp.h>

#include "core/parallel.h"

typedef struct {
    int *hits;
    int64_t n;
    int threads;
    int bad;
} cover_job;

static void cover(void *arg, int64_t b, int64_t e, int thread) {
    cover_job *j = arg;
    /* the split: thread t of nt owns [n·t/nt, n·(t+1)/nt) */
    if (thread < 0 || thread >= j->threads) j->bad = 1;
    for (int64_t i = b; i < e; i++) __atomic_fetch_add(&j->hits[i], 1, __ATOMIC_RELAXED);
}

static void every_index_once(void **state) {
    (void)state;
    static int hits[1000];
    const int64_t sizes[] = {1, 7, 64, 65, 999, 1000};
    const int64_t grains[] = {1, 16, 64};
    const int threads[] = {1, 2, 3, 8};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
            for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
                memset(hits, 0, sizeof hits);
                cover_job j = {hits, sizes[a], threads[t], 0};
                lt_parallel_for(threads[t], sizes[a], grains[g], cover, &j);
                assert_int_equal(j.bad, 0);
                for (int64_t i = 0; i < sizes[a]; i++) assert_int_equal(hits[i], 1);
            }
}

#define MAX_TIDS 4096

typedef struct {
    int tids[MAX_TIDS];
    int count;
} tid_set;

static void note_tid(void *arg, int64_t b, int64_t e, int thread) {
    (void)b, (void)e, (void)thread;
    tid_set *s = arg;
    const int tid = (int)syscall(SYS_gettid);
#pragma omp critical(lt_test_tids)
    {
        int known = 0;
        for (int i = 0; i < s->count; i++) known |= s->tids[i] == tid;
        if (!known && s->count < MAX_TIDS) s->tids[s->count++] = tid;
    }
}

/* Loops with 2 chunks between loops with as many chunks as threads: the same threads throughout. */
static void stable_threads_across_sizes(void **state) {
    (void)state;
    const int nt = 4;
    omp_set_num_threads(nt);
    static tid_set s;
    memset(&s, 0, sizeof s);
    for (int r = 0; r < 200; r++) lt_parallel_for(0, r % 2 ? nt : 2, 1, note_tid, &s);
    print_message("200 loops of 2 and %d chunks ran on %d distinct threads\n", nt, s.count);
    assert_true(s.count <= nt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_index_once),
        cmocka_unit_test(stable_threads_across_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
