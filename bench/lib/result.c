/* The result file and its provenance (see bench_lib.h). The commit is the build's: lt_commit.h,
 * which the build regenerates each time it runs (cmake/commit_stamp.cmake), defines LT_GIT_COMMIT
 * for the tree the binary was built from; nothing here runs git. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_lib.h"
#include "longtune/log.h"
#include "lt_commit.h"
#include "longtune/sysinfo.h"

const char *lt_bench_commit(void) {
    const char *env = getenv("LONGTUNE_COMMIT");
    return env && *env ? env : LT_GIT_COMMIT;
}

cJSON *lt_bench_machine(void) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
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
    return m;
}

cJSON *lt_bench_result_new(const char *bench) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    cJSON_AddStringToObject(r, "bench", bench);
    cJSON_AddStringToObject(r, "commit", lt_bench_commit());
    char date[64];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_AddStringToObject(r, "date", date);
    cJSON *m = lt_bench_machine();
    if (m) cJSON_AddItemToObject(r, "machine", m);
    return r;
}

int lt_bench_write(const lt_bench_common *c, cJSON *result, const char *tag) {
    if (c->suffix && !cJSON_GetObjectItem(result, "name_suffix"))
        cJSON_AddStringToObject(result, "name_suffix", c->suffix);
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
    snprintf(path, sizeof path, "%s/%s%s%s%s%s.json", c->out, bench ? bench : "bench", tag && *tag ? "-" : "",
             tag ? tag : "", c->suffix ? "-" : "", c->suffix ? c->suffix : "");
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
