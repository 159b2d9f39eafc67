/* Crash safety of the trainer's saves: a child process saves checkpoint + PEFT adapter over and
 * over and is killed with SIGKILL at random moments; after every kill the checkpoint and the
 * adapter on disk must load and hold one complete save (values all from the same step). A full disk
 * (emulated with RLIMIT_FSIZE, so writes fail with EFBIG as ENOSPC would) must give LT_ERR_IO and
 * leave the previous checkpoint and adapter as they were, with no temp file behind.
 * SIGINT/SIGTERM through the CLI are tests/cli/test_cli_signals.sh. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/safetensors.h"
#include "longtune/train.h"

enum { R = 8, IN = 2048, OUT = 1024, NP = 2 };

static char dir[128];
static char ckpt[256];
static uint64_t rng;

typedef struct {
    lt_train_param p[NP];
    float *mem;
} params;

/* Every value of save k is a function of k, so a file mixing two saves is detected. */
static float value_of(int64_t k, int which, int64_t i) {
    return (float)k + (float)which * 0.25f + (float)(i % 1000) * 1e-4f;
}

static void params_make(params *ps) {
    const char *names[NP] = {"model.layers.0.self_attn.q_proj.lora_A", "model.layers.0.self_attn.q_proj.lora_B"};
    const int64_t shapes[NP][2] = {{R, IN}, {OUT, R}};
    ps->mem = malloc((size_t)(R * IN + OUT * R) * 3 * sizeof(float));
    float *at = ps->mem;
    for (int i = 0; i < NP; i++) {
        lt_train_param *p = &ps->p[i];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s", names[i]);
        p->ndim = 2;
        p->shape[0] = shapes[i][0];
        p->shape[1] = shapes[i][1];
        int64_t n = lt_train_param_numel(p);
        p->data = at;
        p->m = at + n;
        p->v = at + 2 * n;
        at += 3 * n;
    }
}

static void params_fill(params *ps, int64_t k) {
    for (int i = 0; i < NP; i++) {
        int64_t n = lt_train_param_numel(&ps->p[i]);
        for (int64_t j = 0; j < n; j++) {
            ps->p[i].data[j] = value_of(k, 0, j);
            ps->p[i].m[j] = value_of(k, 1, j);
            ps->p[i].v[j] = value_of(k, 2, j);
        }
    }
}

static lt_train_options run_options(lt_ctx *ctx) {
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    snprintf(in.model, sizeof in.model, "m.gguf");
    snprintf(in.data, sizeof in.data, "d");
    snprintf(in.adapter_path, sizeof in.adapter_path, "%s", dir);
    in.lora_rank = R;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    return o;
}

/* Saves step k: checkpoint then adapter, as the trainer does. */
static lt_status save_step(lt_ctx *ctx, const lt_train_options *o, params *ps, int64_t k) {
    params_fill(ps, k);
    lt_train_state st = {.step = k, .rng = {(uint64_t)k, 2, 3, 4}, .tokens_seen = 10 * k};
    lt_status s = lt_checkpoint_save(ctx, ckpt, o, &st, ps->p, NP);
    if (s == LT_OK) s = lt_peft_save(ctx, dir, "tiny", o, ps->p, NP);
    return s;
}

/* Loads the checkpoint; returns its step after checking every value belongs to that step. */
static int64_t check_checkpoint(lt_ctx *ctx, const lt_train_options *o) {
    params got;
    params_make(&got);
    memset(got.mem, 0xff, (size_t)(R * IN + OUT * R) * 3 * sizeof(float));
    lt_train_state st;
    memset(&st, 0, sizeof st);
    lt_status s = lt_checkpoint_load(ctx, ckpt, o, &st, got.p, NP);
    if (s != LT_OK) fail_msg("checkpoint does not load after a kill: %s", lt_ctx_error(ctx));
    for (int i = 0; i < NP; i++) {
        int64_t n = lt_train_param_numel(&got.p[i]);
        for (int64_t j = 0; j < n; j++)
            if (got.p[i].data[j] != value_of(st.step, 0, j) || got.p[i].m[j] != value_of(st.step, 1, j) ||
                got.p[i].v[j] != value_of(st.step, 2, j))
                fail_msg("checkpoint of step %lld mixes saves at %s[%lld]", (long long)st.step, got.p[i].name,
                         (long long)j);
    }
    assert_int_equal(st.rng[0], (uint64_t)st.step);
    free(got.mem);
    return st.step;
}

/* Opens the adapter; returns the step its values come from (all tensors must agree). */
static int64_t check_adapter(lt_ctx *ctx) {
    lt_lora_options lo;
    lt_status s = lt_peft_read_config(ctx, dir, 1, &lo);
    if (s != LT_OK) fail_msg("adapter_config.json does not load after a kill: %s", lt_ctx_error(ctx));
    char path[300];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    lt_safetensors *st = NULL;
    s = lt_safetensors_open(ctx, path, &st);
    if (s != LT_OK) fail_msg("adapter does not load after a kill: %s", lt_ctx_error(ctx));
    assert_int_equal(lt_safetensors_count(st), NP);
    int64_t k = -1;
    for (int64_t i = 0; i < NP; i++) {
        lt_tensor t;
        assert_int_equal(lt_safetensors_find(ctx, st, lt_safetensors_name(st, i), &t), LT_OK);
        const float *x = t.data;
        if (k < 0) k = (int64_t)x[0];
        int64_t n = lt_tensor_numel(&t);
        for (int64_t j = 0; j < n; j++)
            if (x[j] != value_of(k, 0, j))
                fail_msg("adapter mixes saves at %s[%lld]", lt_safetensors_name(st, i), (long long)j);
    }
    lt_safetensors_close(ctx, st);
    return k;
}

/* Temp files left in the folder by a killed save; removed (as the next run's save would overwrite
 * its own pid's name only). */
static int sweep_temps(void) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
            n++;
        }
    closedir(d);
    return n;
}

static void sigkill_during_saves(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options o = run_options(ctx);
    params ps;
    params_make(&ps);
    assert_int_equal(save_step(ctx, &o, &ps, 1), LT_OK);
    int64_t last = 1, last_ka = 1, mid_save = 0;
    /* At least 24 kills, and more (up to 300) until one has landed inside a write. */
    int trials = 0;
    for (; trials < 300 && (trials < 24 || mid_save == 0); trials++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            lt_ctx *c = lt_ctx_new();
            for (int64_t k = last + 1;; k++)
                if (save_step(c, &o, &ps, k) != LT_OK) _exit(3);
        }
        /* Let it complete a few saves, then kill it somewhere inside one. */
        struct timespec ts = {0, (long)(20 + lt_test_rand_u64(&rng) % 60) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        int64_t k = check_checkpoint(ctx, &o);
        int64_t ka = check_adapter(ctx);
        /* Saves only move forward; the adapter is written after its checkpoint, so it may lag
         * (by one step per killed child: each child starts after the last checkpoint). */
        assert_true(k >= last);
        assert_true(ka <= k && ka >= last_ka);
        last_ka = ka;
        mid_save += sweep_temps() > 0;
        last = k;
    }
    fprintf(stderr, "sigkill: %d kills, %lld inside a write (temp file left), last step %lld\n", trials,
            (long long)mid_save, (long long)last);
    /* The test is only meaningful if kills landed inside writes. */
    assert_true(mid_save > 0);
    assert_true(last > 1);
    free(ps.mem);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Child: with the file size limit at `limit` bytes, saves step 7. Exit 0 if the checkpoint save
 * failed with LT_ERR_IO naming the temp file and the adapter save failed with LT_ERR_IO as well, or
 * succeeded when adapter_fits (the adapter is smaller than the checkpoint). */
static int full_disk_child(const lt_train_options *o, params *ps, rlim_t limit, int adapter_fits) {
    signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead of killing us */
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    lt_ctx *c = lt_ctx_new();
    params_fill(ps, 7);
    lt_train_state st = {.step = 7};
    lt_status s = lt_checkpoint_save(c, ckpt, o, &st, ps->p, NP);
    if (s != LT_ERR_IO) return 11;
    if (!strstr(lt_ctx_error(c), "checkpoint.ltck.tmp.")) {
        fprintf(stderr, "unexpected message: %s\n", lt_ctx_error(c));
        return 12;
    }
    fprintf(stderr, "full disk, checkpoint: %s\n", lt_ctx_error(c));
    s = lt_peft_save(c, dir, "tiny", o, ps->p, NP);
    if (s != (adapter_fits ? LT_OK : LT_ERR_IO)) return 13;
    if (s != LT_OK) fprintf(stderr, "full disk, adapter: %s\n", lt_ctx_error(c));
    lt_ctx_free(c);
    return 0;
}

static void full_disk_keeps_previous(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options o = run_options(ctx);
    params ps;
    params_make(&ps);
    assert_int_equal(save_step(ctx, &o, &ps, 3), LT_OK);
    long size = file_size(ckpt);
    char adapter[300];
    snprintf(adapter, sizeof adapter, "%s/adapter_model.safetensors", dir);
    long asize = file_size(adapter);
    assert_true(size > 4096 && asize > 4096);
    int64_t adapter_step = 3;
    /* Limits: nothing fits; half a checkpoint; all but the last bytes (fails in the final flush). */
    const rlim_t limits[3] = {0, (rlim_t)size / 2, (rlim_t)size - 16};
    for (int i = 0; i < 3; i++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        int fits = (long)limits[i] >= asize;
        if (pid == 0) _exit(full_disk_child(&o, &ps, limits[i], fits));
        if (fits) adapter_step = 7;
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        if (WEXITSTATUS(status) != 0)
            fail_msg("limit %lu: child status %d", (unsigned long)limits[i], WEXITSTATUS(status));
        assert_int_equal(check_checkpoint(ctx, &o), 3);
        assert_int_equal(check_adapter(ctx), adapter_step);
        assert_int_equal(file_size(ckpt), size);
        assert_int_equal(sweep_temps(), 0);
    }
    free(ps.mem);
    lt_ctx_free(ctx);
}

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(dir, sizeof dir, "/tmp/lt_test_crash_safety_%ld", (long)getpid());
    mkdir(dir, 0755);
    snprintf(ckpt, sizeof ckpt, "%s/%s", dir, LT_TRAIN_CHECKPOINT_FILE);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return lt_test_rm_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigkill_during_saves),
        cmocka_unit_test(full_disk_keeps_previous),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
