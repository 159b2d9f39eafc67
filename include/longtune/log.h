/* Logging to stderr with a process-wide level, and the progress display the trainer and other
 * long commands use: a bar with rate and ETA on a terminal, one plain line per update otherwise
 * (so logs and CI output stay readable). */
#ifndef LONGTUNE_LOG_H
#define LONGTUNE_LOG_H

#include <stdio.h>
#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_log_level { LT_LOG_ERROR = 0, LT_LOG_WARN, LT_LOG_INFO, LT_LOG_DEBUG } lt_log_level;

LT_API void lt_log_set_level(lt_log_level level);
LT_API lt_log_level lt_log_get_level(void);
LT_API void lt_log(lt_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
#define LT_INFO(...) lt_log(LT_LOG_INFO, __VA_ARGS__)
#define LT_WARN(...) lt_log(LT_LOG_WARN, __VA_ARGS__)
#define LT_DEBUG(...) lt_log(LT_LOG_DEBUG, __VA_ARGS__)

/* Monotonic wall clock in seconds. */
LT_API double lt_time_now(void);

typedef struct lt_progress {
    FILE *out;     /* stream written to (stderr by default) */
    int is_tty;    /* bar mode when 1, plain lines when 0 */
    int64_t total; /* units of work (steps) */
    int64_t done;
    double t_start;
    double t_last_draw;
    int64_t plain_every; /* plain mode: print every k updates (>= 1) */
    char label[32];
} lt_progress;

/* Starts a display for `total` units on `out` (NULL = stderr); tty-ness detected from the stream,
 * LONGTUNE_PROGRESS=plain|bar overrides. */
LT_API void lt_progress_begin(lt_progress *p, FILE *out, const char *label, int64_t total);
/* Advances to `done` units and redraws with a caller-formatted status text (e.g. "loss 2.31 lr
 * 1e-4"); bar mode redraws at most ~10 times a second. */
LT_API void lt_progress_update(lt_progress *p, int64_t done, const char *status);
/* Prints a line above the bar without breaking it. */
LT_API void lt_progress_println(lt_progress *p, const char *line);
LT_API void lt_progress_end(lt_progress *p, const char *status);

#ifdef __cplusplus
}
#endif
#endif
