/* What every bench file includes: the bench library and the handlers of bench/benches.h. */
#ifndef LT_BENCH_H
#define LT_BENCH_H

#include "bench_lib.h"

#define LT_BENCH(name, fn, summary) int fn(int argc, char **argv);
#include "benches.h"
#undef LT_BENCH

#endif
