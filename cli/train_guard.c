/* The memory guard around `longtune train` (see train_guard.h). The trainer knows nothing of the
 * guard: a breach raises the same stop request SIGTERM does, the trainer saves a checkpoint at the
 * next step boundary, and this file turns the result into the artifact and exit status 3. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "longtune/alloc.h"
#include "train_guard.h"

int lt_cli_guard_flag(lt_cli_guard *cg, const char *usage, const char *key, const char *value, int *used_value) {
    *used_value = 0;
    if (!strcmp(key, "memory-ceiling") || !strcmp(key, "memory_ceiling")) {
        if (!value || lt_cli_parse_bytes(value, &cg->ceiling) || !cg->ceiling) {
            lt_cli_usage_error("train", usage, "--memory-ceiling '%s': expected a byte size (\"12G\")",
                               value ? value : "");
            return -1;
        }
        *used_value = 1;
        return 1;
    }
    if (!strcmp(key, "allow-low-memory") || !strcmp(key, "allow_low_memory")) {
        cg->allow_low = 1;
        return 1;
    }
    if (!strcmp(key, "no-memory-guard") || !strcmp(key, "no_memory_guard")) {
        cg->off = 1;
        return 1;
    }
    return 0;
}

/* The watchdog's breach: the trainer's own stop request. SIGXCPU names "a resource limit". */
static void stop_training(void *user) {
    (void)user;
    lt_train_request_stop(SIGXCPU);
}

/* The guard's host block is allocated before the data are read and held through the run. */
static void lt_cli_held_add_guard(lt_train_held *h) {
    h->caller_bytes += lt_guard_host_bytes();
    if (h->load_peak_bytes) h->load_peak_bytes += lt_guard_host_bytes();
}

lt_status lt_cli_train_plan(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                            const lt_plan_options *popt, int guard_on, lt_train_held *held, lt_plan *out) {
    lt_train_held h;
    memset(&h, 0, sizeof h);
    /* The tokenizer and data set are host memory: on the run's device only in a CPU run. */
    if (opt->data[0] && popt->device == LT_DEVICE_CPU) LT_TRY(lt_train_measure_data(ctx, opt, popt->cp_size, &h));
    if (guard_on && popt->device == LT_DEVICE_CPU) lt_cli_held_add_guard(&h);
    if (held) *held = h;
    return lt_train_plan(ctx, opt, cfg, popt, &h, out);
}

int lt_cli_recompute_auto(lt_ctx *ctx, const lt_cli_guard *cg, lt_train_options *opt, int world) {
    if (!opt->recompute_auto) return 0;
    lt_model_options mo;
    (void)lt_train_model_options(ctx, opt, &mo); /* validated with the options */
    lt_model_config cfg;
    lt_plan_options po;
    int cp = opt->context_parallel && world > 1;
    lt_status s = lt_model_inspect(ctx, opt->model, &mo, &cfg);
    if (s == LT_OK) s = lt_train_plan_options(ctx, opt, cp ? 1 : world, cp ? world : 1, &po);
    if (s != LT_OK) return lt_cli_fail("train", ctx, s);
    /* The budget: --memory-ceiling, or the guard's ceiling less what this process holds already
     * on the host (the plan counts the model, data and trainer it will load). */
    uint64_t budget = cg->ceiling, outside = 0;
    lt_guard_ceiling c;
    memset(&c, 0, sizeof c);
    if (!budget) {
        lt_guard_options go;
        memset(&go, 0, sizeof go);
        go.device = opt->device;
        if ((s = lt_guard_measure(ctx, opt->device, &go, &c)) != LT_OK) return lt_cli_fail("train", ctx, s);
        outside = opt->device == LT_DEVICE_CPU ? c.in_use_bytes : 0;
        budget = c.ceiling_bytes > outside ? c.ceiling_bytes - outside : 0;
    }
    lt_train_held h;
    lt_plan plan;
    lt_train_options chosen;
    memset(&h, 0, sizeof h);
    if (opt->data[0] && po.device == LT_DEVICE_CPU) s = lt_train_measure_data(ctx, opt, po.cp_size, &h);
    if (s == LT_OK && !cg->off && po.device == LT_DEVICE_CPU) lt_cli_held_add_guard(&h);
    if (s == LT_OK) s = lt_train_choose_recompute(ctx, opt, &cfg, &po, &h, (size_t)budget, &chosen, &plan);
    if (s != LT_OK) return lt_cli_fail("train", ctx, s);
    char name[128], b1[32], b2[32], b3[32];
    lt_cli_recompute_desc(chosen.recompute, chosen.recompute_every, chosen.recompute_attention,
                          chosen.recompute_attention_layers, chosen.chunk_rows, opt->chunk_rows, name, sizeof name);
    fprintf(stderr, "longtune train: recompute auto: %s (plan %s of a %s budget%s%s%s)\n", name,
            lt_cli_fmt_bytes(plan.peak_bytes, b1, sizeof b1), lt_cli_fmt_bytes(budget, b2, sizeof b2),
            cg->ceiling ? ": --memory-ceiling" : ": the guard's ceiling", outside ? " less the resident set of " : "",
            outside ? lt_cli_fmt_bytes(outside, b3, sizeof b3) : "");
    *opt = chosen;
    return 0;
}

int lt_cli_guard_start(lt_ctx *ctx, lt_cli_guard *cg, const lt_train_options *opt, int world) {
    if (cg->off) return 0;
    lt_model_options mo;
    (void)lt_train_model_options(ctx, opt, &mo); /* validated with the options; the device is in them */
    lt_model_config cfg;
    lt_plan_options po;
    int cp = opt->context_parallel && world > 1;
    cg->have_plan = lt_model_inspect(ctx, opt->model, &mo, &cfg) == LT_OK &&
        lt_train_plan_options(ctx, opt, cp ? 1 : world, cp ? world : 1, &po) == LT_OK &&
        lt_cli_train_plan(ctx, opt, &cfg, &po, 1, NULL, &cg->plan) == LT_OK;
    lt_ctx_clear_error(ctx); /* a model or data set that cannot be read is reported by the run itself */
    lt_guard_options go;
    memset(&go, 0, sizeof go);
    go.device = opt->device; /* a CUDA run guards the device and the host */
    go.ceiling_bytes = cg->ceiling;
    go.allow_low_memory = cg->allow_low;
    go.plan_bytes = cg->have_plan ? cg->plan.peak_bytes : 0;
    go.on_breach = stop_training;
    lt_status s = lt_guard_start(ctx, &go, &cg->g);
    if (s != LT_OK) return lt_cli_fail("train", ctx, s);
    lt_guard_ceiling c = lt_guard_get_ceiling(cg->g, opt->device);
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(stderr, "longtune train: memory ceiling %s%s, plan %s\n", lt_cli_fmt_bytes(c.ceiling_bytes, b1, sizeof b1),
            c.overridden ? " (--memory-ceiling)" : "",
            cg->have_plan ? lt_cli_fmt_bytes(cg->plan.peak_bytes, b2, sizeof b2) : "unknown");
    /* On the host the ceiling also covers what the process holds outside the allocator (code,
     * libraries, mappings): the allocator gets the rest. Say so, and say when the plan does not
     * fit in it. */
    size_t lim = lt_mem_get_stats(ctx, LT_DEVICE_CPU).limit_bytes;
    if (opt->device == LT_DEVICE_CPU && lim && lim < c.ceiling_bytes) {
        fprintf(stderr,
                "longtune train: %s of it is held already outside the allocator (code, libraries), so the run's "
                "allocations may use %s\n",
                lt_cli_fmt_bytes(c.ceiling_bytes - lim, b3, sizeof b3), lt_cli_fmt_bytes(lim, b4, sizeof b4));
        if (cg->have_plan && cg->plan.peak_bytes > lim)
            fprintf(stderr,
                    "longtune train: warning: the plan (%s) is above that: the run will stop at the ceiling (raise "
                    "--memory-ceiling or shrink the run)\n",
                    b2);
    }
    if (cg->have_plan && cg->plan.offload_bytes && opt->device != LT_DEVICE_CPU) {
        /* the offloaded checkpoints are host memory: the guard's host ceiling bounds them */
        lt_guard_ceiling h = lt_guard_get_ceiling(cg->g, LT_DEVICE_CPU);
        fprintf(stderr, "longtune train: offloaded checkpoints %s of pinned host memory (host ceiling %s)%s\n",
                lt_cli_fmt_bytes(cg->plan.offload_bytes, b1, sizeof b1),
                lt_cli_fmt_bytes(h.ceiling_bytes, b2, sizeof b2),
                h.ceiling_bytes && cg->plan.offload_bytes > h.ceiling_bytes ? ": will not fit in host memory" : "");
    }
    return 0;
}

int lt_cli_guard_finish(lt_ctx *ctx, lt_cli_guard *cg, const lt_train_options *opt, const lt_train_result *res,
                        lt_status run) {
    if (!cg->g) return 0;
    int rc = 0;
    if (lt_guard_tripped(cg->g) && run != LT_ERR_INTERRUPTED) {
        lt_guard_breach b = lt_guard_get_breach(cg->g);
        fprintf(stderr,
                "longtune train: warning: memory passed the ceiling (%s %llu > %llu bytes) after "
                "the last step boundary\n",
                b.source, (unsigned long long)b.observed_bytes, (unsigned long long)b.ceiling_bytes);
    } else if (lt_guard_tripped(cg->g)) {
        char ckpt[LT_TRAIN_PATH_MAX + 64], art[LT_TRAIN_PATH_MAX + 64], pj[4096], b1[32], b2[32];
        snprintf(ckpt, sizeof ckpt, "%s/%s", opt->adapter_path, LT_TRAIN_CHECKPOINT_FILE);
        snprintf(art, sizeof art, "%s/aborted_memory_ceiling.json", opt->adapter_path);
        lt_guard_abort_record r;
        memset(&r, 0, sizeof r);
        r.breach = lt_guard_get_breach(cg->g);
        r.step = res->steps;
        r.checkpoint = ckpt;
        r.allocator_peak_bytes = lt_mem_get_stats(ctx, opt->device).peak_bytes;
        if (cg->have_plan && lt_plan_to_json(ctx, &cg->plan, pj, sizeof pj) == LT_OK) {
            r.plan_json = pj;
            r.plan_peak_bytes = cg->plan.peak_bytes;
        }
        lt_status s = lt_guard_write_abort(ctx, art, &r);
        if (s != LT_OK) {
            rc = lt_cli_fail("train", ctx, s);
        } else {
            fprintf(stderr,
                    "longtune train: stopped at the memory ceiling: %s %s > %s at step %lld; "
                    "checkpoint %s, report %s\n",
                    r.breach.source, lt_cli_fmt_bytes(r.breach.observed_bytes, b1, sizeof b1),
                    lt_cli_fmt_bytes(r.breach.ceiling_bytes, b2, sizeof b2), (long long)r.step, ckpt, art);
            rc = LT_GUARD_EXIT_STATUS;
        }
    }
    lt_guard_stop(cg->g);
    cg->g = NULL;
    return rc;
}
