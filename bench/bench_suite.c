/* `longtune bench --tier quick|full` (also `longtune bench suite --tier ...`): the community
 * benchmark. It detects the machine (CPU, RAM, GPU, driver, CUDA), picks the benches and shapes that
 * fit it, prints the plan with a time estimate, runs each bench as a child process of this binary
 * (its own memory guard, its own CUDA context; a failing bench does not stop the others) and folds
 * every result into one provenance-complete JSON file (scripts/fold_results.py turns such files into
 * the README table). The "smoke" tier runs tiny shapes only, to check the plumbing. It measures
 * nothing itself. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_model.h"
#include "bench.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

#define MAX_RUNS 16
#define MAX_ARGS 32

typedef struct suite_run {
    const char *label;
    const char *argv[MAX_ARGS]; /* after "bench" */
    int argc;
    double estimate_s;
    const char *result_glob; /* the result file's name prefix in the run's folder */
} suite_run;

#define SYNOPSIS "longtune bench --tier quick|full|smoke [options]"

static void add(suite_run *runs, int *n, const char *label, double est, const char *prefix, ...) {
    if (*n >= MAX_RUNS) return;
    suite_run *r = &runs[(*n)++];
    memset(r, 0, sizeof *r);
    r->label = label;
    r->estimate_s = est;
    r->result_glob = prefix;
    va_list ap;
    va_start(ap, prefix);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && r->argc < MAX_ARGS - 4) r->argv[r->argc++] = a;
    va_end(ap);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Runs `longtune bench <args> --out dir` as a child; returns its exit status (128+signal when
 * killed), killing it after limit_s seconds. */
static int run_child(const suite_run *r, const char *dir, double limit_s, double *secs) {
    const char *argv[MAX_ARGS + 4];
    int k = 0;
    argv[k++] = "longtune";
    argv[k++] = "bench";
    for (int i = 0; i < r->argc; i++) argv[k++] = r->argv[i];
    argv[k++] = "--out";
    argv[k++] = dir;
    argv[k] = NULL;
    fflush(NULL);
    double t0 = lt_time_now();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0, killed = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return -1;
        if (!killed && lt_time_now() - t0 > limit_s) {
            fprintf(stderr, "suite: %s passed its %.0f s limit; stopping it\n", r->label, limit_s);
            kill(-pid, SIGTERM);
            killed = 1;
        } else if (killed == 1 && lt_time_now() - t0 > limit_s + 20) {
            kill(-pid, SIGKILL);
            killed = 2;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *secs = lt_time_now() - t0;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* The result file the child wrote: the newest <prefix>*.json in dir. */
static cJSON *read_result(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char best[1500] = "";
    time_t best_t = 0;
    struct dirent *e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, pl) || n < 5 || strcmp(e->d_name + n - 5, ".json")) continue;
        char path[1500];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0 && (!*best || st.st_mtime >= best_t)) {
            best_t = st.st_mtime;
            snprintf(best, sizeof best, "%s", path);
        }
    }
    closedir(d);
    if (!*best) return NULL;
    FILE *f = fopen(best, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n > 0 && n < (64L << 20) ? malloc((size_t)n + 1) : NULL;
    cJSON *j = NULL;
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        j = cJSON_Parse(buf);
    }
    free(buf);
    fclose(f);
    return j;
}

int lt_bench_suite(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    const char *tier = NULL;
    int dry = 0, no_peer = 0;
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--dry-run", &dry, 1),
        LT_BENCH_SET("--no-peer", &no_peer, 1),
        LT_BENCH_CHOICE("--tier", &tier, "quick|full|smoke"),
    };
    const int parsed = lt_bench_parse_args("--tier", SYNOPSIS, argc, argv, &c,
                                           LT_BENCH_COMMON_JSON | LT_BENCH_COMMON_OUT, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench --tier quick|full|smoke [options]\n\n"
               "The community benchmark: detects this machine (CPU, RAM, GPU, driver, CUDA), picks the\n"
               "benches and shapes that fit it, prints a time estimate, runs them one by one (each under\n"
               "its memory guard, in its own process) and writes one JSON file with every result and the\n"
               "machine's description. python3 scripts/fold_results.py FILE... makes the README table.\n\n"
               "tiers:\n"
               "  quick   a few minutes: the training step of the small shape (and Qwen3-8B on a GPU with\n"
               "          >= 40 GiB), packed vs unpacked throughput, the planner's context ceiling\n"
               "  full    the flagship set: both shapes at several lengths, context ceilings confirmed\n"
               "          by real steps, the PyTorch peers where they import (tens of minutes)\n"
               "  smoke   tiny shapes only (seconds): checks the suite itself\n\n"
               "options:\n"
               "  --tier T      quick | full | smoke (required)\n"
               "  --dry-run     print the machine, the plan and the estimate; run nothing\n"
               "  --no-peer     skip the PyTorch peers\n"
               "  --out DIR     where the suite file goes (default bench/results); each bench's own\n"
               "                file goes to DIR/suite-<tier>-<date>/\n"
               "  --json        print the suite JSON on stdout\n");
        return 0;
    }
    if (parsed) return parsed;
    if (!tier) return lt_bench_usage_error("--tier", SYNOPSIS, "missing --tier");

    /* the machine */
    char cpu[256];
    int cores = 0;
    lt_sys_cpu(cpu, sizeof cpu, &cores);
    lt_host_memory hm;
    memset(&hm, 0, sizeof hm);
    lt_sys_host_memory(NULL, &hm);
    lt_cuda_device_info cu = lt_sys_cuda();
    double gib = 1073741824.0, gpu_gib = (double)cu.total_bytes / gib;
    fprintf(stderr, "machine: %s, %d cores, %.1f GiB RAM (%.1f available)\n", cpu, cores, (double)hm.total_bytes / gib,
            (double)hm.available_bytes / gib);
    if (cu.count)
        fprintf(stderr, "gpu:     %s, %.1f GiB, sm_%d%d, driver %d, CUDA runtime %d (%d device%s)\n", cu.name, gpu_gib,
                cu.cc_major, cu.cc_minor, cu.driver_version, cu.runtime_version, cu.count, cu.count > 1 ? "s" : "");
    else fprintf(stderr, "gpu:     none usable (CPU benches only)\n");

    /* the plan */
    suite_run runs[MAX_RUNS];
    int n = 0;
    const char *np = no_peer ? "--no-peer" : NULL; /* NULL also ends the list when peers stay on */
    char gguf[1024];
    const char *cache = getenv("LONGTUNE_CACHE"), *home = getenv("HOME");
    snprintf(gguf, sizeof gguf, "%s/smollm2-135m-instruct-q4_1.gguf", cache && *cache ? cache : home ? home : ".");
    if (!(cache && *cache))
        snprintf(gguf, sizeof gguf, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : ".");
    int have_gguf = file_exists(gguf);
    if (!strcmp(tier, "smoke")) {
        add(runs, &n, "sgemm", 3, "sgemm", "sgemm", "--repeats", "2", NULL);
        add(runs, &n, "train tiny (cpu)", 5, "train-cpu-tiny", "train", "--shape", "tiny", "--seq", "64,128",
            "--repeats", "2", "--warmup", "1", "--no-peer", NULL);
        add(runs, &n, "context tiny (cpu)", 5, "context-cpu-tiny", "context", "--shape", "tiny", "--step", "256",
            "--max", "8192", "--confirm-seconds", "1", NULL);
        if (cu.count) {
            add(runs, &n, "train tiny (cuda)", 10, "train-cuda-tiny", "train", "--backend", "cuda", "--shape", "tiny",
                "--seq", "256", "--repeats", "2", "--no-peer", NULL);
        }
    } else if (!cu.count) {
        int full = !strcmp(tier, "full");
        add(runs, &n, "sgemm", 5, "sgemm", "sgemm", NULL);
        add(runs, &n, "train smollm2-135m (cpu)", full ? 600 : 120, "train-cpu-smollm2", "train", "--shape",
            "smollm2-135m", "--seq", full ? "512,2048" : "256", "--repeats", full ? "3" : "2", "--warmup", "1", np,
            NULL);
        add(runs, &n, "context smollm2-135m (cpu)", full ? 120 : 40, "context-cpu-smollm2", "context", "--shape",
            "smollm2-135m", "--step", "1024", "--confirm-seconds", full ? "60" : "10", "--no-peer", NULL);
        if (have_gguf)
            add(runs, &n, "packed smollm2-135m gguf (cpu)", full ? 150 : 75, "packed-cpu", "packed", "--seconds",
                full ? "40" : "20", NULL);
        if (full) {
            add(runs, &n, "tokenizer", 30, "tokenizer", "tokenizer", NULL);
            add(runs, &n, "attention (cpu)", 120, "attention-cpu", "attention", NULL);
            add(runs, &n, "lce (cpu)", 60, "lce-small", "lce", NULL);
        }
    } else {
        int full = !strcmp(tier, "full"), big = gpu_gib >= 40, huge = gpu_gib >= 80;
        add(runs, &n, "train smollm2-135m (cuda)", full ? 90 : 45, "train-cuda-smollm2", "train", "--backend", "cuda",
            "--shape", "smollm2-135m", "--seq", full ? "2048,8192,32768" : "2048,8192", "--repeats", "3", "--warmup",
            "1", np, NULL);
        if (big)
            add(runs, &n, "train qwen3-8b (cuda)", full ? 150 : 70, "train-cuda-qwen3", "train", "--backend", "cuda",
                "--shape", "qwen3-8b", "--seq", full && huge ? "8192,32768" : "8192", "--repeats", full ? "3" : "2",
                "--warmup", "1", np, NULL);
        /* with the peers: the same batches twice more (transformers + PEFT, then + Liger) */
        add(runs, &n, "packed smollm2-135m (cuda)", no_peer ? (full ? 60 : 30) : (full ? 200 : 110), "packed-cuda",
            "packed", "--backend", "cuda", "--seconds", full ? "10" : "5", np, NULL);
        if (big)
            add(runs, &n, "context qwen3-8b (cuda)", full ? 200 : 40, "context-cuda-qwen3", "context", "--backend",
                "cuda", "--shape", "qwen3-8b", "--confirm-seconds", full ? "60" : "0",
                full && !no_peer ? NULL : "--no-peer", NULL);
        else
            add(runs, &n, "context smollm2-135m (cuda)", 40, "context-cuda-smollm2", "context", "--backend", "cuda",
                "--shape", "smollm2-135m", "--confirm-seconds", full ? "60" : "0", "--no-peer", NULL);
        if (full) {
            add(runs, &n, "attention (cuda)", 120, "attention-cuda", "attention", "--backend", "cuda", NULL);
            add(runs, &n, "lce (cuda)", 150, "lce", "lce", "--backend", "cuda", NULL);
        }
    }
    double total = 0;
    fprintf(stderr, "plan (%s tier):\n", tier);
    for (int i = 0; i < n; i++) {
        total += runs[i].estimate_s;
        fprintf(stderr, "  %-34s ~%4.0f s   longtune bench", runs[i].label, runs[i].estimate_s);
        for (int k = 0; k < runs[i].argc; k++) fprintf(stderr, " %s", runs[i].argv[k]);
        fputc('\n', stderr);
    }
    fprintf(stderr, "estimated total: %.0f s (%.1f min)%s\n", total, total / 60, dry ? "; --dry-run: nothing run" : "");
    if (dry) return 0;

    char date[32], dir[1200];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", gmtime(&now));
    mkdir(c.out, 0755);
    snprintf(dir, sizeof dir, "%s/suite-%s-%s", c.out, tier, date);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "longtune bench --tier: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    cJSON *res = lt_bench_result_new("suite");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "tier", tier);
    cJSON_AddNumberToObject(jc, "estimate_s", total);
    cJSON_AddBoolToObject(jc, "peers", !no_peer);
    cJSON_AddStringToObject(jc, "results_dir", dir);
    cJSON *m = cJSON_GetObjectItem(res, "machine");
    if (cu.count) {
        cJSON_AddNumberToObject(m, "gpu_count", cu.count);
        char sm[16];
        snprintf(sm, sizeof sm, "sm_%d%d", cu.cc_major, cu.cc_minor);
        cJSON_AddStringToObject(m, "gpu_arch", sm);
    }
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    int failed = 0;
    double spent = 0;
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "\n=== [%d/%d] %s (estimate %.0f s, %.0f s so far)\n", i + 1, n, runs[i].label,
                runs[i].estimate_s, spent);
        double secs = 0;
        int rc = run_child(&runs[i], dir, 4 * runs[i].estimate_s + 60, &secs);
        spent += secs;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "name", runs[i].label);
        cJSON *args = cJSON_AddArrayToObject(a, "args");
        for (int k = 0; k < runs[i].argc; k++) cJSON_AddItemToArray(args, cJSON_CreateString(runs[i].argv[k]));
        cJSON_AddNumberToObject(a, "exit_status", rc);
        cJSON_AddNumberToObject(a, "seconds", secs);
        cJSON_AddNumberToObject(a, "estimate_s", runs[i].estimate_s);
        cJSON *r = rc == 0 ? read_result(dir, runs[i].result_glob) : NULL;
        if (r) cJSON_AddItemToObject(a, "result", r);
        else failed++;
        cJSON_AddItemToArray(arms, a);
        fprintf(stderr, "=== %s: exit %d in %.0f s%s\n", runs[i].label, rc, secs, r ? "" : " (no result)");
    }
    cJSON_AddNumberToObject(jc, "seconds", spent);
    cJSON_AddNumberToObject(jc, "failed", failed);
    char tag[96];
    snprintf(tag, sizeof tag, "%s-%s", tier, date);
    int wrc = lt_bench_write(&c, res, tag);
    fprintf(stderr, "suite: %d of %d benches gave a result in %.0f s (estimate %.0f s)\n", n - failed, n, spent, total);
    return wrc != 0 ? 1 : failed ? 1 : 0;
}
