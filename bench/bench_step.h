/* The timed LoRA optimizer step on random tokens that the context and MoE benches take at each
 * length (they reach the backend's AdamW, so this lives with the benches that use internals). */
#ifndef LT_BENCH_STEP_H
#define LT_BENCH_STEP_H

#include <stdint.h>

#include "backend/backend.h"
#include "longtune/model.h"

/* One step of m (prepared for B = 1, T) on T random tokens drawn from *seed into tok (2·T ids on the
 * host: inputs, then targets shifted by one, the last ignored); AdamW with the moments mom_m, mom_v
 * on m's device, *adam_step counted up. Returns milliseconds (the device synchronised at both
 * ends) and the mean loss in *loss (NaN without targets), or < 0 on failure (the status in ctx). */
double lt_bench_random_step(lt_ctx *ctx, lt_model *m, const lt_backend *be, float *mom_m, float *mom_v, int32_t *tok,
                            int64_t T, uint64_t *seed, int64_t *adam_step, double *loss);

#endif
