/* The out-of-line helpers of core/fastmath.h. GCC makes the branch-free functions' clamps and
 * selects vector selects only when it may assume no floating-point traps, hence the option before
 * the includes; nothing is reordered or contracted, so each lane equals the scalar function. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "core/fastmath.h"

void lt_fast_softcap(float *x, int64_t n, float cap) {
    if (!(cap > 0)) return;
    const float ic = 1.0f / cap;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) x[i] = cap * lt_fast_tanh(x[i] * ic);
}
