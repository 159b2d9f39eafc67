/* Benchmark plumbing (see bench_util.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_util.h"
#include "longtune/alloc.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

void lt_bench_common_init(lt_bench_common *c) {
    memset(c, 0, sizeof *c);
    c->out = "bench/results";
    c->repeats = 5;
    c->warmup = 1;
    c->backend = "cpu";
}

int lt_bench_common_flag(lt_bench_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        c->json = 1;
        return 1;
    }
    const char *names[] = {"--out", "--repeats", "--warmup", "--backend"};
    for (int k = 0; k < 4; k++) {
        if (strcmp(a, names[k])) continue;
        if (*i + 1 >= argc) return -1;
        const char *v = argv[++*i];
        if (k == 0) c->out = v;
        if (k == 3) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return -1;
            c->backend = v;
        }
        if (k == 1 || k == 2) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < (k == 1 ? 1 : 0) || n > 100000) return -1;
            if (k == 1) c->repeats = (int)n;
            else c->warmup = (int)n;
        }
        return 1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double lt_bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void git_commit(char *buf, size_t n) {
    const char *env = getenv("LONGTUNE_COMMIT");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return;
    }
    snprintf(buf, n, "unknown");
    FILE *p = popen("git rev-parse --short=12 HEAD 2>/dev/null && git diff --quiet HEAD 2>/dev/null || echo dirty", "r");
    if (!p) return;
    char line[64], out[96] = "";
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (*out) strncat(out, "-", sizeof out - strlen(out) - 1);
        strncat(out, line, sizeof out - strlen(out) - 1);
    }
    pclose(p);
    if (*out) snprintf(buf, n, "%s", out);
}

cJSON *lt_bench_result_new(const char *bench) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "bench", bench);
    char commit[128];
    git_commit(commit, sizeof commit);
    cJSON_AddStringToObject(r, "commit", commit);
    char date[64];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_AddStringToObject(r, "date", date);
    cJSON *m = cJSON_AddObjectToObject(r, "machine");
    char cpu[256];
    int cores;
    lt_sys_cpu(cpu, sizeof cpu, &cores);
    cJSON_AddStringToObject(m, "cpu", cpu);
    cJSON_AddNumberToObject(m, "cores", cores);
    lt_host_memory hm;
    if (lt_sys_host_memory(NULL, &hm) == LT_OK) cJSON_AddNumberToObject(m, "host_memory_bytes", (double)hm.total_bytes);
    lt_cuda_device_info cu = lt_sys_cuda();
    if (cu.count) {
        cJSON_AddStringToObject(m, "gpu", cu.name);
        cJSON_AddNumberToObject(m, "gpu_memory_bytes", (double)cu.total_bytes);
        cJSON_AddNumberToObject(m, "driver", cu.driver_version);
        cJSON_AddNumberToObject(m, "cuda", cu.runtime_version);
    } else {
        cJSON_AddNullToObject(m, "gpu");
    }
    return r;
}

int lt_bench_write(const lt_bench_common *c, cJSON *result, const char *tag) {
    char *text = cJSON_Print(result);
    const char *bench = cJSON_GetStringValue(cJSON_GetObjectItem(result, "bench"));
    int rc = 0;
    if (!text) {
        cJSON_Delete(result);
        return 1;
    }
    if (c->json) printf("%s\n", text);
    mkdir(c->out, 0755);
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/%s%s%s.json", c->out, bench ? bench : "bench", tag && *tag ? "-" : "",
             tag ? tag : "");
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f)) || fclose(f)) {
        lt_log(LT_LOG_ERROR, "cannot write %s", tmp);
        rc = 1;
    } else if (rename(tmp, path)) {
        lt_log(LT_LOG_ERROR, "cannot rename %s to %s", tmp, path);
        rc = 1;
    } else {
        fprintf(stderr, "wrote %s\n", path);
    }
    free(text);
    cJSON_Delete(result);
    return rc;
}

double lt_bench_sgemm_gflops(int n, int repeats, int threads) {
    size_t sz = (size_t)n * (size_t)n;
    float *a = malloc(sz * 4), *b = malloc(sz * 4), *cm = malloc(sz * 4);
    if (!a || !b || !cm) {
        free(a);
        free(b);
        free(cm);
        return 0;
    }
    for (size_t i = 0; i < sz; i++) {
        a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    }
    if (threads > 0) openblas_set_num_threads(threads);
    double *t = malloc(sizeof(double) * (size_t)(repeats + 1));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, cm, n);
    for (int r = 0; r < repeats; r++) {
        double t0 = lt_time_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, cm, n);
        t[r] = lt_time_now() - t0;
    }
    double med = lt_bench_median(t, repeats);
    free(t);
    free(a);
    free(b);
    free(cm);
    return 2.0 * n * (double)n * n / med * 1e-9;
}
