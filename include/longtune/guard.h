/* The memory guard: a ceiling derived from the machine, enforced twice. The accounting allocator's
 * hard limit is set from it (an oversized run fails with LT_ERR_OOM at allocation time), and a
 * watchdog thread samples the process's resident set and the device's usage to catch memory that
 * does not go through the allocator (libraries, the CUDA context, page cache of mapped files).
 * The guard never stops the run itself: it raises a flag the trainer polls once per step; the
 * trainer then saves a checkpoint, writes the abort artifact and returns LT_ERR_INTERRUPTED.
 *
 * The ceiling rule (docs/memory.md), for a memory of `total` bytes of which `available` are free
 * now and `in_use` already belong to this process:
 *   cushion = clamp(total / 32, 256 MiB, 4 GiB)            (unless given)
 *   static  = share · total                                (share 0.90 unless given)
 *   dynamic = in_use + available − cushion                 (0 when negative)
 *   ceiling = min(static, dynamic)
 * CPU: total/available come from lt_sys_host_memory (MemTotal/MemAvailable, capped by a cgroup v1
 * or v2 limit), in_use is the process's resident set. CUDA: total/free from the device (device 0),
 * in_use is what the accounting allocator holds on the device.
 * Refusal: available < total / 4 refuses to start (LT_ERR_OOM, message says why and names the
 * override) unless allow_low_memory is set. Warning: available + in_use < plan + cushion. */
#ifndef LONGTUNE_GUARD_H
#define LONGTUNE_GUARD_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_GUARD_DEFAULT_SHARE 0.90
#define LT_GUARD_DEFAULT_INTERVAL_S 0.5
/* Exit status of the `longtune` command when a run stopped at the memory ceiling (0 ok, 1 failure,
 * 2 usage error are the others). */
#define LT_GUARD_EXIT_STATUS 3
/* The `status` field of the abort artifact. */
#define LT_GUARD_ABORT_STATUS "aborted_memory_ceiling"

/* The rule's inputs and outputs for one memory (host or device), all in bytes. */
typedef struct lt_guard_ceiling {
    uint64_t total_bytes, available_bytes, in_use_bytes; /* inputs (see the rule above) */
    uint64_t cushion_bytes, static_bytes, dynamic_bytes;
    uint64_t ceiling_bytes; /* min(static, dynamic) or the override */
    uint64_t plan_bytes;    /* what the plan needs here, 0 = unknown */
    int low_memory;         /* available < total / 4: refuse */
    int plan_tight;         /* available + in_use < plan + cushion */
    int overridden;         /* ceiling given by the caller */
} lt_guard_ceiling;

/* The rule as a pure function. share <= 0 means LT_GUARD_DEFAULT_SHARE; cushion 0 means the
 * default clamp(total/32, 256 MiB, 4 GiB); plan 0 disables the warning test. */
LT_API lt_guard_ceiling lt_guard_ceiling_rule(uint64_t total, uint64_t available, uint64_t in_use, double share,
                                              uint64_t cushion, uint64_t plan);

/* Zero-initialised = defaults. */
typedef struct lt_guard_options {
    lt_device device;       /* where the run's tensors live. CPU guards host memory; CUDA guards
                                the device and host memory both */
    double share;           /* static share of total memory, in (0, 1]; 0 = 0.90 */
    uint64_t cushion_bytes; /* 0 = the rule's default */
    uint64_t ceiling_bytes; /* nonzero: use this ceiling for `device` instead of the rule (tests,
                                `--memory-ceiling`) */
    uint64_t plan_bytes;    /* planned peak on `device` (lt_plan.peak_bytes), 0 = unknown */
    int allow_low_memory;   /* 1: start even when available < total / 4 */
    int no_allocator_limit; /* 1: leave the accounting allocator's limits alone */
    int no_watchdog;        /* 1: no sampling thread (the allocator limit still applies) */
    double interval_s;      /* watchdog period in seconds; 0 = 0.5 */
    /* Optional: called once, from the thread whose sample tripped (the watchdog, or a caller of
     * lt_guard_check_now), right after the flag is raised, e.g. with
     * a function that calls lt_train_request_stop so a trainer that checks stop requests between
     * steps stops there. Must be thread-safe and must not block. */
    void (*on_breach)(void *user);
    void *user;
} lt_guard_options;

/* Measures the machine and applies the rule for `dev` without starting anything. in_use is the
 * resident set (CPU) or the allocator's device bytes (CUDA). Errors: LT_ERR_IO when /proc/meminfo
 * is unreadable, LT_ERR_UNSUPPORTED for CUDA without a device. */
LT_API lt_status lt_guard_measure(lt_ctx *ctx, lt_device dev, const lt_guard_options *opt, lt_guard_ceiling *out);

typedef struct lt_guard lt_guard;

/* What the watchdog saw when it tripped. */
typedef struct lt_guard_breach {
    int tripped;             /* 0 until a sample passed a ceiling */
    lt_device device;        /* the memory that passed its ceiling */
    const char *source;      /* "host_rss" or "device_used" (static strings) */
    uint64_t observed_bytes; /* the sample that passed */
    uint64_t ceiling_bytes;
    double elapsed_s; /* since lt_guard_start */
} lt_guard_breach;

/* Measures, refuses or warns, sets the allocator's hard limit on each guarded memory to
 * ceiling − (memory this process already holds outside the allocator), and starts the watchdog.
 * On success *out owns a thread; end it with lt_guard_stop. Errors: LT_ERR_OOM when available
 * memory is under a quarter of total (the message names allow_low_memory / --allow-low-memory) or
 * the ceiling is below what the allocator already holds; LT_ERR_IO / LT_ERR_UNSUPPORTED from
 * lt_guard_measure; LT_ERR_INVALID_ARG for share outside (0, 1] or a negative interval. */
LT_API lt_status lt_guard_start(lt_ctx *ctx, const lt_guard_options *opt, lt_guard **out);
/* Bytes a started guard holds in the accounting allocator (host), for the run's plan. */
LT_API size_t lt_guard_host_bytes(void);

/* 1 once the watchdog saw a sample above a ceiling (it then stops sampling). Cheap (one atomic
 * load): the trainer calls it every step. NULL guard → 0. */
LT_API int lt_guard_tripped(const lt_guard *g);
LT_API lt_guard_breach lt_guard_get_breach(const lt_guard *g);
/* The rule's numbers for `dev` as measured at start (zeroed when that memory is not guarded). */
LT_API lt_guard_ceiling lt_guard_get_ceiling(const lt_guard *g, lt_device dev);
/* Samples now on the calling thread (same check as the watchdog); returns lt_guard_tripped. Lets a
 * caller check at a point it chooses, e.g. right after model load. */
LT_API int lt_guard_check_now(lt_guard *g);

/* Stops and joins the watchdog, restores the allocator limits that were in place before start,
 * frees the guard. NULL is a no-op. */
LT_API void lt_guard_stop(lt_guard *g);

/* The `aborted_memory_ceiling` artifact: one JSON object
 *   { "status": "aborted_memory_ceiling", "source", "device": "cpu"|"cuda", "ceiling_bytes",
 *     "observed_bytes", "step", "elapsed_s", "plan_peak_bytes", "plan": {...}|null,
 *     "checkpoint": "path"|null, "allocator_peak_bytes" }
 * written to a temporary in the same folder, fsynced and renamed over `path`. */
typedef struct lt_guard_abort_record {
    lt_guard_breach breach;
    int64_t step;                  /* the optimizer step at which the trainer stopped */
    uint64_t plan_peak_bytes;      /* 0 = unknown */
    const char *plan_json;         /* optional: a JSON object (e.g. lt_plan_to_json), embedded as "plan" */
    const char *checkpoint;        /* optional: path of the checkpoint saved before stopping */
    uint64_t allocator_peak_bytes; /* high-water of the accounting allocator on breach.device */
} lt_guard_abort_record;

/* Errors: LT_ERR_INVALID_ARG when plan_json is not a JSON object, LT_ERR_IO when the file cannot be
 * written, fsynced or renamed (an earlier file at `path` is then left as it was and the temporary
 * is removed), LT_ERR_OOM. */
LT_API lt_status lt_guard_write_abort(lt_ctx *ctx, const char *path, const lt_guard_abort_record *r);

#ifdef __cplusplus
}
#endif
#endif
