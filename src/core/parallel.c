/* OpenMP-backed parallel-for; see parallel.h. Static chunking keeps runs deterministic: the same
 * thread count gives the same split, which the CPU trainer's bit-exact resume relies on. */
#include "parallel.h"

#if LT_HAVE_OPENMP
#include <omp.h>
#endif

int lt_parallel_threads(int threads) {
#if LT_HAVE_OPENMP
    return threads > 0 ? threads : omp_get_max_threads();
#else
    (void)threads;
    return 1;
#endif
}

void lt_parallel_for(int threads, int64_t n, int64_t grain, lt_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = lt_parallel_threads(threads);
    int64_t max_chunks = (n + grain - 1) / grain;
    if (max_chunks < nt) nt = (int)max_chunks;
    if (nt <= 1) {
        fn(arg, 0, n, 0);
        return;
    }
#if LT_HAVE_OPENMP
    /* The team is never smaller than OpenMP's default size, even when fewer threads have work:
     * libgomp ends the pooled threads a smaller team leaves out and creates new ones for the next
     * larger team, so alternating sizes (an 8-chunk loop between 16-thread GEMMs) pay a thread
     * exit and a thread start per region (GCC 12's libgomp: 1,000 regions alternating teams of
     * 2 and 4 threads ran on 1,002 distinct threads). On the 16-core device with such teams, the
     * LoRA products (1,639 small regions per SmolLM2 step at T = 512) took 450-495 ms of a
     * 1.1-1.3 s step.
     * Threads past nt get no range; the split and thread ids of those with work are as before. */
    const int team = nt > omp_get_max_threads() ? nt : omp_get_max_threads();
#pragma omp parallel num_threads(team)
    {
        int t = omp_get_thread_num();
        if (t < nt) {
            int64_t begin = n * t / nt, end = n * (t + 1) / nt;
            if (begin < end) fn(arg, begin, end, t);
        }
    }
#else
    fn(arg, 0, n, 0);
#endif
}
