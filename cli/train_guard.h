/* The memory guard around `longtune train`: its flags, starting it with the run's plan, and on a
 * breach the aborted_memory_ceiling artifact and exit status. Private to cli/. */
#ifndef LT_CLI_TRAIN_GUARD_H
#define LT_CLI_TRAIN_GUARD_H

#include "longtune/guard.h"
#include "longtune/plan.h"
#include "longtune/train.h"

typedef struct lt_cli_guard {
    uint64_t ceiling; /* --memory-ceiling BYTES (0 = the guard's rule) */
    int allow_low;    /* --allow-low-memory */
    int off;          /* --no-memory-guard */
    lt_guard *g;
    lt_plan plan;
    int have_plan;
} lt_cli_guard;

#define LT_CLI_GUARD_HELP                                                                               \
    "  --memory-ceiling BYTES     stop cleanly above this much memory [min(0.90 x total, available -\n" \
    "                             cushion)]; --allow-low-memory: start even under a quarter free;\n"    \
    "                             --no-memory-guard: neither limit nor watchdog. A run stopped at\n"    \
    "                             the ceiling saves a checkpoint, writes aborted_memory_ceiling.json\n" \
    "                             into --adapter-path and exits with status 3\n"

/* If key (a flag name without dashes) is one of the guard's: applies it and returns 1, setting
 * *used_value when `value` was consumed; -1 for a bad value (message printed as a usage error);
 * 0 when the key is not the guard's. value may be NULL (the flag was the last argument). */
int lt_cli_guard_flag(lt_cli_guard *cg, const char *usage, const char *key, const char *value, int *used_value);

/* The plan of a resolved run as `longtune train` holds it: lt_train_plan over cfg and popt
 * (lt_train_plan_options, perhaps refined), on a CPU run with opt->data measured
 * (lt_train_measure_data) when it names a folder and the guard's block when guard_on. held (optional) receives what
 * was measured. Errors: those of the loaders and of lt_train_plan. */
lt_status lt_cli_train_plan(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                            const lt_plan_options *popt, int guard_on, lt_train_held *held, lt_plan *out);

/* Plans the resolved run on one of `world` ranks (lt_cli_train_plan over the model's metadata and
 * the data folder; no plan when that fails, the run reports it) and starts the guard, whose
 * breach raises the trainer's stop request. Returns the exit status to use when it refuses (1),
 * else 0. */
int lt_cli_guard_start(lt_ctx *ctx, lt_cli_guard *cg, const lt_train_options *opt, int world);
/* --recompute auto: replaces opt's policy by the least recompute whose plan fits --memory-ceiling
 * or the guard's ceiling (lt_train_choose_recompute) and says which. 0, or the exit status. */
int lt_cli_recompute_auto(lt_ctx *ctx, const lt_cli_guard *cg, lt_train_options *opt, int world);

/* After lt_train_run returned `run`: when the guard tripped and stopped the run (run is
 * LT_ERR_INTERRUPTED), writes the artifact next to the checkpoint, says so on stderr and returns
 * LT_GUARD_EXIT_STATUS (1 when the artifact cannot be written); a breach after the last step only
 * warns. Returns 0 otherwise. Stops the guard either way. */
int lt_cli_guard_finish(lt_ctx *ctx, lt_cli_guard *cg, const lt_train_options *opt, const lt_train_result *res,
                        lt_status run);

#endif
