/* CLI helpers (see cli.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "longtune/plan.h"

int lt_cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    fprintf(stderr, "longtune %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: %s\n(see 'longtune %s --help')\n", usage, cmd);
    return LT_EXIT_USAGE;
}

int lt_cli_fail(const char *cmd, lt_ctx *ctx, lt_status s) {
    const char *msg = lt_ctx_error(ctx);
    fprintf(stderr, "longtune %s: %s%s%s\n", cmd, lt_status_str(s), *msg ? ": " : "", msg);
    return LT_EXIT_FAIL;
}

int lt_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int lt_cli_parse_f64(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int lt_cli_parse_bytes(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    double mul = 1;
    if (*end) {
        static const char *const units[] = {"K", "M", "G", "T"};
        int found = 0;
        for (int i = 0; i < 4; i++) {
            size_t n = strlen(end);
            if (strncasecmp(end, units[i], 1) == 0 &&
                (n == 1 || strcasecmp(end + 1, "B") == 0 || strcasecmp(end + 1, "iB") == 0)) {
                mul = pow(1024.0, i + 1);
                found = 1;
            }
        }
        if (!found && strcasecmp(end, "B") != 0) return -1;
    }
    double b = v * mul;
    if (b >= 18446744073709551615.0) return -1;
    *out = (uint64_t)b;
    return 0;
}

const char *lt_cli_recompute_desc(lt_recompute policy, int64_t k, int recompute_attention, int64_t attention_layers,
                                  int64_t chunk, int64_t asked_chunk, char *buf, size_t n) {
    char name[32];
    lt_plan_recompute_name(policy, k, name, sizeof name);
    int w = snprintf(buf, n, "%s", name);
    if (policy != LT_RECOMPUTE_NONE && recompute_attention)
        w += snprintf(buf + w, n - (size_t)w, " + recompute_attention");
    else if (policy != LT_RECOMPUTE_NONE && attention_layers > 0)
        w += snprintf(buf + w, n - (size_t)w, " + attention rerun in %lld layer%s", (long long)attention_layers,
                      attention_layers == 1 ? "" : "s");
    if (chunk != asked_chunk) snprintf(buf + w, n - (size_t)w, ", chunks of %lld rows", (long long)chunk);
    return buf;
}

const char *lt_cli_fmt_bytes(uint64_t bytes, char *buf, int n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, (size_t)n, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}
