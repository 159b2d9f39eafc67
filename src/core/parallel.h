/* Parallel-for over an index range on OpenMP threads (serial when the build has no OpenMP).
 * Work is split into contiguous chunks so each call sees [begin, end) and its thread id, which
 * kernels use to pick a per-thread workspace slot. No nested parallelism. */
#ifndef LT_CORE_PARALLEL_H
#define LT_CORE_PARALLEL_H

#include <stdint.h>

typedef void (*lt_range_fn)(void *arg, int64_t begin, int64_t end, int thread);

/* Threads a parallel loop will use with `threads` requested (0 = default). */
int lt_parallel_threads(int threads);
/* Calls fn over [0, n) in chunks of at least `grain` items on up to `threads` threads. */
void lt_parallel_for(int threads, int64_t n, int64_t grain, lt_range_fn fn, void *arg);

#endif
