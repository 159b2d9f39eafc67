/* The one flag parser of every bench (see bench_lib.h): a table of flags, each a kind, a destination
 * and its bounds, parsed in order beside the common flags; every error names the flag and the
 * value and says what is allowed, then prints the bench's usage line. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_lib.h"

static void print_usage(const char *bench, const char *synopsis) {
    if (synopsis) fprintf(stderr, "usage: %s\n", synopsis);
    else fprintf(stderr, "usage: longtune bench %s [options]\n", bench);
}

int lt_bench_usage_error(const char *bench, const char *synopsis, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "longtune bench %s: ", bench);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    print_usage(bench, synopsis);
    return 2;
}

int lt_bench_parse_i64(const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    if (!v || !*v) return -1;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

int lt_bench_parse_bytes(const char *v, uint64_t *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || !(x > 0) || x > 1e18) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || x * mul > 1.8e19) return -1;
    *out = (uint64_t)(x * mul);
    return 0;
}

int lt_bench_parse_i64_list(const char *v, int64_t *out, int max, int64_t lo, int64_t hi) {
    int n = 0;
    for (const char *q = v; q && *q;) {
        char *end;
        long long x = strtoll(q, &end, 10);
        if (end == q || x < lo || x > hi || n == max) return -1;
        out[n++] = x;
        q = end;
        if (*q == ',' && q[1]) q++;
        else if (*q) return -1;
    }
    return n > 0 ? n : -1;
}

const char *lt_bench_parse_seconds(const char *v, void *dst) {
    char *end;
    const double d = strtod(v, &end);
    if (end == v || *end || !(d > 0 && d <= 1e9)) return "a number of seconds above 0";
    *(double *)dst = d;
    return NULL;
}

/* --name-suffix: 1 to 32 of [A-Za-z0-9._-] (a file-name part). */
static const char *parse_suffix(const char *v, void *dst) {
    size_t n = strlen(v);
    if (n < 1 || n > 32) return "1 to 32 characters";
    for (size_t i = 0; i < n; i++) {
        char ch = v[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return "letters, digits, '.', '_' or '-'";
    }
    *(const char **)dst = v;
    return NULL;
}

/* The common flags as table rows; c's fields are their destinations. */
enum { COMMON_JSON, COMMON_OUT, COMMON_REPEATS, COMMON_WARMUP, COMMON_BACKEND, COMMON_SUFFIX, COMMON_COUNT };

static void common_rows(lt_bench_common *c, lt_bench_arg rows[COMMON_COUNT]) {
    const lt_bench_arg r[COMMON_COUNT] = {
        LT_BENCH_SET("--json", &c->json, 1),
        LT_BENCH_STR("--out", &c->out),
        LT_BENCH_INT("--repeats", &c->repeats, 1, 100000),
        LT_BENCH_INT("--warmup", &c->warmup, 0, 100000),
        LT_BENCH_CHOICE("--backend", &c->backend, "cpu|cuda"),
        LT_BENCH_FN("--name-suffix", &c->suffix, parse_suffix),
    };
    memcpy(rows, r, sizeof r);
}

/* 1 when v is one of the '|'-separated choices. */
static int is_choice(const char *v, const char *choices) {
    const size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

/* Stores v by the row's kind; NULL, or what the value should have been. */
static const char *store(const lt_bench_arg *a, const char *v, char *why, size_t whyn) {
    int64_t x = 0;
    switch (a->kind) {
    case LT_BENCH_ARG_SET: *(int *)a->dst = (int)a->lo; return NULL;
    case LT_BENCH_ARG_STR:
        if (!*v) return "a non-empty string";
        *(const char **)a->dst = v;
        return NULL;
    case LT_BENCH_ARG_CHOICE:
        if (!is_choice(v, a->choices)) {
            snprintf(why, whyn, "one of %s", a->choices);
            return why;
        }
        *(const char **)a->dst = v;
        return NULL;
    case LT_BENCH_ARG_I64:
    case LT_BENCH_ARG_INT:
    case LT_BENCH_ARG_U64:
        if (lt_bench_parse_i64(v, a->lo, a->hi, &x)) {
            snprintf(why, whyn, "a whole number from %" PRId64 " to %" PRId64, a->lo, a->hi);
            return why;
        }
        if (a->kind == LT_BENCH_ARG_I64) *(int64_t *)a->dst = x;
        else if (a->kind == LT_BENCH_ARG_INT) *(int *)a->dst = (int)x;
        else *(uint64_t *)a->dst = (uint64_t)x;
        return NULL;
    case LT_BENCH_ARG_F64: {
        char *end;
        const double d = strtod(v, &end);
        if (end == v || *end || !(d >= (double)a->lo && d <= (double)a->hi)) {
            snprintf(why, whyn, "a number from %" PRId64 " to %" PRId64, a->lo, a->hi);
            return why;
        }
        *(double *)a->dst = d;
        return NULL;
    }
    case LT_BENCH_ARG_BYTES:
        if (lt_bench_parse_bytes(v, (uint64_t *)a->dst)) return "a byte size such as 4096, 64M or 120G";
        return NULL;
    case LT_BENCH_ARG_LIST: {
        const int n = lt_bench_parse_i64_list(v, (int64_t *)a->dst, a->max, a->lo, a->hi);
        if (n < 0) {
            snprintf(why, whyn, "a comma list of up to %d whole numbers from %" PRId64 " to %" PRId64, a->max, a->lo,
                     a->hi);
            return why;
        }
        *a->count = n;
        return NULL;
    }
    case LT_BENCH_ARG_FN: return a->parse(v, a->dst);
    }
    return "a value this bench knows";
}

int lt_bench_parse_args(const char *bench, const char *synopsis, int argc, char **argv, lt_bench_common *c,
                        unsigned common, const lt_bench_arg *args, int nargs) {
    lt_bench_arg crow[COMMON_COUNT];
    common_rows(c, crow);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        if (!strcmp(a, "--help")) return LT_BENCH_ARGS_HELP;
        char name[64];
        if (eq) {
            const size_t len = (size_t)(eq - a);
            if (len >= sizeof name) return lt_bench_usage_error(bench, synopsis, "unknown option '%s'", a);
            memcpy(name, a, len);
            name[len] = 0;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        const lt_bench_arg *row = NULL;
        for (int k = 0; k < nargs && !row; k++)
            if (!strcmp(name, args[k].name)) row = &args[k];
        for (int k = 0; k < COMMON_COUNT && !row; k++) {
            if (strcmp(name, crow[k].name)) continue;
            /* the file name's suffix comes with --out */
            if (!(common & (1u << (k == COMMON_SUFFIX ? COMMON_OUT : k))))
                return lt_bench_usage_error(bench, synopsis, "%s is not an option of this bench", name);
            row = &crow[k];
        }
        if (!row) return lt_bench_usage_error(bench, synopsis, "unknown option '%s'", a);
        const char *v = NULL;
        if (row->kind == LT_BENCH_ARG_SET) {
            if (eq) return lt_bench_usage_error(bench, synopsis, "%s takes no value", name);
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            return lt_bench_usage_error(bench, synopsis, "missing value for %s", name);
        }
        char why[160];
        const char *bad = store(row, v, why, sizeof why);
        if (bad) return lt_bench_usage_error(bench, synopsis, "bad value '%s' for %s: want %s", v, name, bad);
        if (row->seen) *row->seen = 1;
    }
    return 0;
}

void lt_bench_common_init(lt_bench_common *c) {
    memset(c, 0, sizeof *c);
    c->out = "bench/results";
    c->repeats = 5;
    c->warmup = 1;
    c->backend = "cpu";
}
