/* Logging and the progress display (see log.h). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "longtune/log.h"

static lt_log_level log_level = LT_LOG_INFO;

void lt_log_set_level(lt_log_level level) { log_level = level; }
lt_log_level lt_log_get_level(void) { return log_level; }

void lt_log(lt_log_level level, const char *fmt, ...) {
    if (level > log_level) return;
    static const char *const tags[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "longtune: %s: ", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double lt_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, n, "%02ld:%02ld", t / 60, t % 60);
}

void lt_progress_begin(lt_progress *p, FILE *out, const char *label, int64_t total) {
    memset(p, 0, sizeof *p);
    p->out = out ? out : stderr;
    p->is_tty = isatty(fileno(p->out));
    const char *mode = getenv("LONGTUNE_PROGRESS");
    if (mode && strcmp(mode, "plain") == 0) p->is_tty = 0;
    if (mode && strcmp(mode, "bar") == 0) p->is_tty = 1;
    p->total = total > 0 ? total : 1;
    p->t_start = lt_time_now();
    p->t_last_draw = -1;
    p->plain_every = 1;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
}

static void draw(lt_progress *p, const char *status, int final) {
    double now = lt_time_now(), el = now - p->t_start;
    double rate = el > 0 ? (double)p->done / el : 0;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : -1;
    char e[32], r[32];
    fmt_duration(e, sizeof e, el);
    fmt_duration(r, sizeof r, final ? 0 : eta);
    if (p->is_tty) {
        int width = 24, fill = (int)((double)width * (double)p->done / (double)p->total);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
        bar[width] = '\0';
        fprintf(p->out, "\r\033[K%s [%s] %lld/%lld %.2f it/s %s<%s %s", p->label, bar, (long long)p->done,
                (long long)p->total, rate, e, r, status ? status : "");
        if (final) fputc('\n', p->out);
    } else {
        fprintf(p->out, "%s %lld/%lld %.2f it/s elapsed %s eta %s %s\n", p->label, (long long)p->done,
                (long long)p->total, rate, e, r, status ? status : "");
    }
    fflush(p->out);
    p->t_last_draw = now;
}

void lt_progress_update(lt_progress *p, int64_t done, const char *status) {
    p->done = done > p->total ? p->total : done;
    if (p->is_tty) {
        if (p->t_last_draw >= 0 && lt_time_now() - p->t_last_draw < 0.1 && p->done < p->total) return;
    } else if (p->done % p->plain_every != 0 && p->done < p->total) {
        return;
    }
    draw(p, status, 0);
}

void lt_progress_println(lt_progress *p, const char *line) {
    if (p->is_tty) fprintf(p->out, "\r\033[K");
    fprintf(p->out, "%s\n", line);
    fflush(p->out);
}

void lt_progress_end(lt_progress *p, const char *status) {
    if (p->is_tty) draw(p, status, 1);
    else if (status && *status) fprintf(p->out, "%s done: %s\n", p->label, status);
    fflush(p->out);
}
