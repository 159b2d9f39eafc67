/* The memory guard (see guard.h): the ceiling rule, the allocator limits derived from it and the
 * watchdog thread that samples resident memory and device usage. It only raises a flag; saving a
 * checkpoint and stopping belong to the trainer, exiting to the CLI. */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

lt_guard_ceiling lt_guard_ceiling_rule(uint64_t total, uint64_t available, uint64_t in_use, double share,
                                       uint64_t cushion, uint64_t plan) {
    lt_guard_ceiling c;
    memset(&c, 0, sizeof c);
    if (share <= 0) share = LT_GUARD_DEFAULT_SHARE;
    if (share > 1) share = 1;
    if (!cushion) {
        /* A fixed fraction scales with the machine; the clamp keeps a small box from reserving
         * too little for the kernel and a large one from wasting tens of GiB. */
        cushion = total / 32;
        if (cushion < 256 * MIB) cushion = 256 * MIB;
        if (cushion > 4 * GIB) cushion = 4 * GIB;
    }
    c.total_bytes = total;
    c.available_bytes = available;
    c.in_use_bytes = in_use;
    c.cushion_bytes = cushion;
    c.plan_bytes = plan;
    c.static_bytes = (uint64_t)(share * (double)total);
    uint64_t reach = in_use > UINT64_MAX - available ? UINT64_MAX : in_use + available;
    c.dynamic_bytes = reach > cushion ? reach - cushion : 0;
    c.ceiling_bytes = c.static_bytes < c.dynamic_bytes ? c.static_bytes : c.dynamic_bytes;
    c.low_memory = available < total / 4;
    c.plan_tight = plan && (plan > UINT64_MAX - cushion || reach < plan + cushion);
    return c;
}

lt_status lt_guard_measure(lt_ctx *ctx, lt_device dev, const lt_guard_options *opt, lt_guard_ceiling *out) {
    lt_guard_options def;
    memset(&def, 0, sizeof def);
    if (!opt) opt = &def;
    memset(out, 0, sizeof *out);
    uint64_t total, avail, in_use;
    if (dev == LT_DEVICE_CPU) {
        lt_host_memory hm;
        LT_TRY(lt_sys_host_memory(ctx, &hm));
        total = hm.total_bytes;
        avail = hm.available_bytes;
        in_use = lt_sys_process_rss();
    } else if (dev == LT_DEVICE_CUDA) {
        lt_cuda_device_info cu = lt_sys_cuda();
        if (!cu.count || !cu.total_bytes)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "memory guard: no CUDA device to guard%s",
                            LT_HAVE_CUDA ? "" : " (this build has no CUDA)");
        total = cu.total_bytes;
        avail = cu.free_bytes;
        in_use = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
    } else {
        return lt_error(ctx, LT_ERR_INVALID_ARG, "memory guard: unknown device %d", (int)dev);
    }
    uint64_t plan = dev == opt->device ? opt->plan_bytes : 0;
    *out = lt_guard_ceiling_rule(total, avail, in_use, opt->share, opt->cushion_bytes, plan);
    if (dev == opt->device && opt->ceiling_bytes) {
        out->ceiling_bytes = opt->ceiling_bytes;
        out->overridden = 1;
    }
    return LT_OK;
}

struct lt_guard {
    lt_ctx *ctx;
    lt_guard_options opt;
    lt_guard_ceiling ceil[LT_DEVICE_COUNT_];
    int guarded[LT_DEVICE_COUNT_];
    size_t old_limit[LT_DEVICE_COUNT_];
    int limit_set[LT_DEVICE_COUNT_];
    uint64_t device_others; /* device bytes used by others (and our context) at start */
    double t_start;
    atomic_int tripped;
    lt_guard_breach breach; /* written once, before `tripped` is released */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int have_thread;
    pthread_t thread;
};

static const char *dev_word(lt_device d) { return d == LT_DEVICE_CPU ? "host" : "device"; }

/* One sample of each guarded memory; records the first breach. Returns 1 when tripped. */
static int sample(lt_guard *g) {
    if (atomic_load(&g->tripped)) return 1;
    for (int d = 0; d < LT_DEVICE_COUNT_; d++) {
        if (!g->guarded[d]) continue;
        uint64_t seen;
        const char *src;
        if (d == LT_DEVICE_CPU) {
            seen = lt_sys_process_rss();
            src = "host_rss";
        } else {
            lt_cuda_device_info cu = lt_sys_cuda();
            if (!cu.count) continue; /* a failed query keeps the watchdog armed */
            uint64_t used = cu.total_bytes - cu.free_bytes;
            seen = used > g->device_others ? used - g->device_others : 0;
            src = "device_used";
        }
        if (seen > g->ceil[d].ceiling_bytes) {
            int first = 0;
            pthread_mutex_lock(&g->mu);
            if (!atomic_load(&g->tripped)) {
                g->breach.tripped = 1;
                g->breach.device = (lt_device)d;
                g->breach.source = src;
                g->breach.observed_bytes = seen;
                g->breach.ceiling_bytes = g->ceil[d].ceiling_bytes;
                g->breach.elapsed_s = lt_time_now() - g->t_start;
                atomic_store(&g->tripped, 1);
                first = 1;
            }
            pthread_mutex_unlock(&g->mu);
            if (first && g->opt.on_breach) g->opt.on_breach(g->opt.user);
            return 1;
        }
    }
    return 0;
}

static void *watchdog(void *arg) {
    lt_guard *g = arg;
    double period = g->opt.interval_s > 0 ? g->opt.interval_s : LT_GUARD_DEFAULT_INTERVAL_S;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        pthread_mutex_unlock(&g->mu);
        int hit = sample(g);
        pthread_mutex_lock(&g->mu);
        if (hit) break; /* one breach is the whole story; the trainer takes it from here */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + period;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (!g->stop) {
            int rc = pthread_cond_timedwait(&g->cv, &g->mu, &ts);
            if (rc == ETIMEDOUT) break;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static void restore_limits(lt_guard *g) {
    for (int d = 0; d < LT_DEVICE_COUNT_; d++)
        if (g->limit_set[d]) lt_mem_set_limit(g->ctx, (lt_device)d, g->old_limit[d]);
}

static lt_status guard_one(lt_guard *g, lt_device d) {
    lt_ctx *ctx = g->ctx;
    lt_guard_ceiling *c = &g->ceil[d];
    LT_TRY(lt_guard_measure(ctx, d, &g->opt, c));
    char what[16];
    snprintf(what, sizeof what, "%s", dev_word(d));
    if (c->low_memory && !g->opt.allow_low_memory)
        return lt_error(ctx, LT_ERR_OOM,
                        "memory guard: refusing to start: %s memory available (%llu bytes) is under "
                        "a quarter of the total (%llu bytes); free memory or pass --allow-low-memory "
                        "(allow_low_memory) to run anyway",
                        what, (unsigned long long)c->available_bytes, (unsigned long long)c->total_bytes);
    if (c->plan_tight)
        LT_WARN("memory guard: %s memory available (%llu bytes, %llu in use by this process) is under "
                "the plan (%llu bytes) plus the cushion (%llu bytes); the run may stop at the ceiling",
                what, (unsigned long long)c->available_bytes, (unsigned long long)c->in_use_bytes,
                (unsigned long long)c->plan_bytes, (unsigned long long)c->cushion_bytes);
    lt_mem_stats ms = lt_mem_get_stats(ctx, d);
    /* Memory this process holds outside the allocator (code, libraries, stacks) counts against
     * the same ceiling, so the allocator gets what is left. On the device that part is unknown at
     * start and the watchdog covers it. */
    uint64_t outside = 0;
    if (d == LT_DEVICE_CPU && c->in_use_bytes > ms.used_bytes) outside = c->in_use_bytes - ms.used_bytes;
    if (c->ceiling_bytes <= outside || c->ceiling_bytes - outside < ms.used_bytes)
        return lt_error(ctx, LT_ERR_OOM,
                        "memory guard: the %s ceiling of %llu bytes is below what this process "
                        "already holds (%llu bytes)",
                        what, (unsigned long long)c->ceiling_bytes, (unsigned long long)(outside + ms.used_bytes));
    if (d == LT_DEVICE_CUDA) {
        lt_cuda_device_info cu = lt_sys_cuda();
        uint64_t used = cu.total_bytes - cu.free_bytes;
        g->device_others = used > ms.used_bytes ? used - ms.used_bytes : 0;
    }
    g->guarded[d] = 1;
    if (!g->opt.no_allocator_limit) {
        g->old_limit[d] = ms.limit_bytes;
        g->limit_set[d] = 1;
        uint64_t lim = c->ceiling_bytes - outside;
        if (lim > SIZE_MAX) lim = SIZE_MAX;
        lt_mem_set_limit(ctx, d, (size_t)lim);
    }
    return LT_OK;
}

size_t lt_guard_host_bytes(void) { return lt_alloc_accounted_size(LT_DEVICE_CPU, sizeof(lt_guard)); }

lt_status lt_guard_start(lt_ctx *ctx, const lt_guard_options *opt, lt_guard **out) {
    *out = NULL;
    lt_guard_options def;
    memset(&def, 0, sizeof def);
    if (!opt) opt = &def;
    if (opt->share < 0 || opt->share > 1 || opt->interval_s < 0 || (unsigned)opt->device >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "memory guard: share %g must be in (0, 1], interval %g s must be >= 0",
                        opt->share, opt->interval_s);
    lt_guard *g = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *g, "memory guard");
    if (!g) return LT_ERR_OOM;
    g->ctx = ctx;
    g->opt = *opt;
    g->t_start = lt_time_now();
    atomic_init(&g->tripped, 0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    lt_status s = guard_one(g, opt->device);
    /* A CUDA run also keeps host memory in check: the loaders stage weights there. */
    if (s == LT_OK && opt->device == LT_DEVICE_CUDA) {
        lt_guard_options host = *opt;
        host.device = LT_DEVICE_CPU; /* no override and no plan for the host side */
        host.ceiling_bytes = 0;
        host.plan_bytes = 0;
        lt_guard_options keep = g->opt;
        g->opt = host;
        s = guard_one(g, LT_DEVICE_CPU);
        g->opt = keep;
    }
    if (s != LT_OK) goto fail;
    if (!opt->no_watchdog) {
        if (pthread_create(&g->thread, NULL, watchdog, g)) {
            s = lt_error(ctx, LT_ERR_OOM, "memory guard: cannot start the watchdog thread");
            goto fail;
        }
        g->have_thread = 1;
    }
    *out = g;
    return LT_OK;
fail:
    restore_limits(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    lt_free(ctx, LT_DEVICE_CPU, g, sizeof *g);
    return s;
}

int lt_guard_tripped(const lt_guard *g) { return g ? atomic_load(&((lt_guard *)g)->tripped) : 0; }

lt_guard_breach lt_guard_get_breach(const lt_guard *g) {
    lt_guard_breach b;
    memset(&b, 0, sizeof b);
    if (g && lt_guard_tripped(g)) b = g->breach; /* immutable once tripped */
    return b;
}

lt_guard_ceiling lt_guard_get_ceiling(const lt_guard *g, lt_device dev) {
    lt_guard_ceiling c;
    memset(&c, 0, sizeof c);
    if (g && (unsigned)dev < LT_DEVICE_COUNT_ && g->guarded[dev]) c = g->ceil[dev];
    return c;
}

int lt_guard_check_now(lt_guard *g) { return g ? sample(g) : 0; }

void lt_guard_stop(lt_guard *g) {
    if (!g) return;
    if (g->have_thread) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    restore_limits(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    lt_free(g->ctx, LT_DEVICE_CPU, g, sizeof *g);
}
